"""The webhook's credentials (operator/webhook_credentials.py), pure part: what the Secret
holds over a certificate's life (made, kept, renewed before expiry with an overlap in the
caBundle, the one before dropped once expired) and what a Secret's data reads as. Dates are
given, so a year is a few calls; the certificates are real (cryptography), read back."""

from __future__ import annotations

import base64
import datetime as dt

from cryptography import x509

from trainsentry.operator.webhook_credentials import (
    Credentials,
    from_secret,
    needs_fresh,
    new_certificate,
    step,
    to_secret,
)

NAMES = ("ts-operator-webhook.trainsentry.svc", "ts-operator-webhook.trainsentry")
DAYS = 365
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def certs(bundle: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(bundle.encode())


def at(days: float) -> dt.datetime:
    return T0 + dt.timedelta(days=days)


def test_a_certificate_is_made_once_and_kept_while_it_is_good() -> None:
    fresh = new_certificate(NAMES, DAYS, T0)
    first = step(None, NAMES, DAYS, T0, fresh, "tok")
    assert first == Credentials(fresh[0], fresh[1], "tok")
    cert = certs(first.cert)[0]
    assert cert.not_valid_after_utc == at(DAYS)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert tuple(sans.get_values_for_type(x509.DNSName)) == NAMES
    # The same Secret read again (another render, a restart, another replica): unchanged.
    for day in (0, 1, 100, 240):
        assert not needs_fresh(first, NAMES, DAYS, at(day))
        assert step(first, NAMES, DAYS, at(day)) == first


def test_renewal_overlaps_in_the_bundle_before_the_switch() -> None:
    first = step(None, NAMES, DAYS, T0, new_certificate(NAMES, DAYS, T0), "tok")
    # A third of the validity left: the next certificate is trusted, not yet served.
    day = 250
    assert needs_fresh(first, NAMES, DAYS, at(day))
    nxt = new_certificate(NAMES, DAYS, at(day))
    second = step(first, NAMES, DAYS, at(day), nxt, "other")
    assert second.cert == first.cert and second.next_cert == nxt[0]
    assert [c.serial_number for c in certs(second.bundle)] == [
        certs(first.cert)[0].serial_number,
        certs(nxt[0])[0].serial_number,
    ]
    assert not needs_fresh(second, NAMES, DAYS, at(day + 1))
    # A sixth left: served; the old one stays trusted until it expires, then goes.
    third = step(second, NAMES, DAYS, at(310))
    assert third.cert == nxt[0] and third.key == nxt[1] and third.next_cert == ""
    assert third.previous_cert == first.cert and third.token == "tok"
    assert len(certs(third.bundle)) == 2
    fourth = step(third, NAMES, DAYS, at(DAYS + 1))
    assert fourth.previous_cert == "" and certs(fourth.bundle)[0].serial_number == (
        certs(nxt[0])[0].serial_number
    )


def test_an_unusable_certificate_is_replaced_and_the_token_kept() -> None:
    first = step(None, NAMES, DAYS, T0, new_certificate(NAMES, DAYS, T0), "tok")
    for stored, when in (
        (first, at(DAYS + 1)),  # expired (the operator was off for a year)
        (Credentials("not a certificate", "k", "tok"), T0),
        (
            step(
                None,
                ("elsewhere.svc",),
                DAYS,
                T0,
                new_certificate(("elsewhere.svc",), DAYS, T0),
                "tok",
            ),
            T0,
        ),  # fmt: skip  (the Service renamed)
    ):
        assert needs_fresh(stored, NAMES, DAYS, when)
        fresh = new_certificate(NAMES, DAYS, when)
        result = step(stored, NAMES, DAYS, when, fresh, "new")
        assert result.cert == fresh[0] and result.token == "tok"


def test_the_secret_data_round_trips_and_an_empty_secret_holds_nothing() -> None:
    first = step(None, NAMES, DAYS, T0, new_certificate(NAMES, DAYS, T0), "tok")
    assert from_secret(to_secret(first)) == first
    assert from_secret({}) is None  # as the chart creates it
    assert from_secret({"tls.crt": "%%%"}) is None
    assert from_secret({"tls.crt": base64.b64encode(b"\xff").decode()}) is None
