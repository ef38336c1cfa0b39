"""The admission webhook's own credentials, kept by the operator (the chart's default): its
TLS certificate and the secret path token that tells the API server's calls from anyone
else's (docs/operator.md, "Who may call the webhook").

Both live in one Secret the chart creates empty (`<release>-operator-webhook-credentials`,
the operator may only `get` and `patch` that one name), are written as the file kopf's server
serves (it reloads it when it changes), and go into the MutatingWebhookConfiguration the
chart renders without them: `caBundle`, and `service.path` = `/<webhook id>/<token>`. So a
`helm template` renders the same bytes every time, and Helm's three-way merge never touches
the two fields (the chart never sets them; a GitOps tool compares only what it rendered).

Invariants:
- The API server trusts a certificate before any replica serves it: a renewal first adds
  the next certificate to `caBundle` (at a third of its validity left), and the replicas
  switch to it only at a sixth left; the one before stays in `caBundle` until it expires,
  so a replica that has not yet re-read the Secret is still trusted.
- The token is made once (256 bits) and kept while the Secret is; it is never logged.
- `step` is pure; everything random is in `new_certificate` and `new_token`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from trainsentry.kube.client import Kube, KubeError
from trainsentry.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS, SECRETS

log = logging.getLogger(__name__)

CERT, KEY = "tls.crt", "tls.key"
NEXT_CERT, NEXT_KEY = "next.crt", "next.key"
PREVIOUS_CERT = "previous.crt"
TOKEN = "path-token"
SKEW = dt.timedelta(minutes=5)  # a new certificate is valid from a little before now


@dataclass(frozen=True)
class Credentials:
    """What the Secret holds (PEM text; `next_*` and `previous_cert` may be "")."""

    cert: str
    key: str = field(repr=False)
    token: str = field(repr=False)
    next_cert: str = ""
    next_key: str = field(default="", repr=False)
    previous_cert: str = ""

    @property
    def bundle(self) -> str:
        """The configuration's `caBundle` (PEM): the one before, the served, the next."""
        return "".join(c for c in (self.previous_cert, self.cert, self.next_cert) if c)


def new_token() -> str:
    """A fresh path token: 256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def new_certificate(names: tuple[str, ...], days: int, now: dt.datetime) -> tuple[str, str]:
    """(certificate, key) PEM: a self-signed certificate for the Service's DNS `names`,
    its own CA (the API server's `caBundle` holds it), valid `days` from `now`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


def _read(pem: str) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(pem.encode())
    except ValueError:
        return None


def _names(cert: x509.Certificate) -> tuple[str, ...]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple(sans.get_values_for_type(x509.DNSName))


def from_secret(data: Mapping[str, Any]) -> Credentials | None:
    """Pure: the credentials in a Secret's `data` (base64), or None when it holds none that
    can be used (empty, as the chart creates it, or not base64/text)."""
    try:
        text = {k: base64.b64decode(str(v), validate=True).decode() for k, v in data.items()}
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not (text.get(CERT) and text.get(KEY) and text.get(TOKEN)):
        return None
    return Credentials(
        text[CERT], text[KEY], text[TOKEN], text.get(NEXT_CERT, ""),
        text.get(NEXT_KEY, ""), text.get(PREVIOUS_CERT, ""),
    )  # fmt: skip


def to_secret(credentials: Credentials) -> dict[str, str]:
    """Pure: the Secret's `data` for `credentials` (every key: a merge patch clears what
    is no longer there with "")."""
    c = credentials
    fields = {CERT: c.cert, KEY: c.key, TOKEN: c.token, NEXT_CERT: c.next_cert,
              NEXT_KEY: c.next_key, PREVIOUS_CERT: c.previous_cert}  # fmt: skip
    return {k: base64.b64encode(v.encode()).decode() for k, v in fields.items()}


def step(
    stored: Credentials | None,
    names: tuple[str, ...],
    days: int,
    now: dt.datetime,
    fresh: tuple[str, str] | None = None,
    token: str = "",
) -> Credentials:
    """Pure: what the Secret should hold at `now`, given what it holds. `fresh` is a new
    (certificate, key) to use if one is needed, `token` a new token if there is none.

    No usable certificate (none, unreadable, for other names, expired): `fresh`, served at
    once. A third of `days` left: `fresh` becomes the next one (in the bundle, not served).
    A sixth left: the next one is served, the served one kept in the bundle as the one
    before; the one before is dropped once it expires."""
    if fresh is None and stored is None:
        raise ValueError("no credentials stored: a fresh certificate is needed")
    cert = _read(stored.cert) if stored is not None else None
    usable = cert is not None and _names(cert) == names and cert.not_valid_after_utc > now
    if stored is None or cert is None or not usable:
        if fresh is None:
            raise ValueError("the stored certificate cannot be used: a fresh one is needed")
        kept = stored.token if stored is not None and stored.token else token
        return Credentials(fresh[0], fresh[1], kept or token)
    left = cert.not_valid_after_utc - now
    result = stored
    previous = _read(stored.previous_cert) if stored.previous_cert else None
    if stored.previous_cert and (previous is None or previous.not_valid_after_utc <= now):
        result = replace(result, previous_cert="")
    if not result.next_cert and left < dt.timedelta(days=days) / 3 and fresh is not None:
        result = replace(result, next_cert=fresh[0], next_key=fresh[1])
    if result.next_cert and left < dt.timedelta(days=days) / 6:
        result = Credentials(result.next_cert, result.next_key, result.token,
                             previous_cert=result.cert)  # fmt: skip
    return result


def needs_fresh(stored: Credentials | None, names: tuple[str, ...], days: int,
                now: dt.datetime) -> bool:  # fmt: skip
    """Pure: whether `step` would use a fresh certificate (so one is made only then)."""
    if stored is None:
        return True
    cert = _read(stored.cert)
    if cert is None or _names(cert) != names or cert.not_valid_after_utc <= now:
        return True
    return not stored.next_cert and cert.not_valid_after_utc - now < dt.timedelta(days=days) / 3


@dataclass
class WebhookCredentials:
    """Keeps the credentials (module docstring): `keep` once at start and then every few
    minutes (`handlers.py`); `token` is what the server compares each call's path with."""

    namespace: str  # of the Secret (the operator's own)
    secret: str
    configuration: str  # the MutatingWebhookConfiguration
    webhook: str  # its webhook's name (instrument-pods.trainsentry.io)
    webhook_id: str  # kopf's handler id: the path's first segment
    names: tuple[str, ...]  # the Service's DNS names
    folder: Path  # where kopf reads tls.crt and tls.key
    days: int = 365
    current: Credentials | None = None

    @property
    def served(self) -> Path:
        """The one file kopf serves: key and certificate (PEM), replaced whole, so the
        server never reads a key of one pair and the certificate of another."""
        return self.folder / "tls.pem"

    def token(self) -> str | None:
        return self.current.token if self.current is not None else None

    def serve_unstored(self) -> None:
        """When the API cannot be reached at start: a certificate of this process only (not
        in `caBundle`: the API server's calls fail and, failing open, admit pods unchanged)
        so the server can start; the next `keep` replaces it."""
        cert, key = new_certificate(self.names, self.days, dt.datetime.now(dt.UTC))
        self._serve(Credentials(cert, key, new_token()))

    async def keep(self, kube: Kube) -> None:
        """Reads the Secret, renews what `step` says, serves it, and puts `caBundle` and the
        path into the configuration. Raises KubeError (the caller retries)."""
        for attempt in range(2):
            body = await kube.get(SECRETS, self.namespace, self.secret)
            if body is None:
                raise KubeError(404, f"Secret {self.namespace}/{self.secret} is missing "
                                     "(the chart creates it)")  # fmt: skip
            stored = from_secret(body.get("data") or {})
            now = dt.datetime.now(dt.UTC)
            fresh = new_certificate(self.names, self.days, now) if needs_fresh(
                stored, self.names, self.days, now) else None  # fmt: skip
            wanted = step(stored, self.names, self.days, now, fresh, new_token())
            if wanted != stored:
                version = (body.get("metadata") or {}).get("resourceVersion")
                update = {"metadata": {"resourceVersion": version}, "data": to_secret(wanted)}
                try:
                    await kube.patch(SECRETS, self.namespace, self.secret, update)
                except KubeError as exc:  # another replica wrote first: take what it wrote
                    if exc.status == 409 and attempt == 0:
                        continue
                    raise
                log.info("event=webhook_credentials_written secret=%s/%s renewed=%s",
                         self.namespace, self.secret, stored is not None)  # fmt: skip
            self._serve(wanted)
            await self._configure(kube, wanted)
            return

    def _serve(self, credentials: Credentials) -> None:
        """Writes the served pair where kopf reads it (`served`, replaced whole), if new."""
        self.current = credentials
        self.folder.mkdir(parents=True, exist_ok=True)
        text = credentials.key + credentials.cert
        if self.served.exists() and self.served.read_text() == text:
            return
        partial = self.served.with_suffix(".partial")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        os.replace(partial, self.served)

    async def _configure(self, kube: Kube, credentials: Credentials) -> None:
        """Puts `caBundle` and the path into the configuration's webhook, if they differ."""
        config = await kube.get(MUTATING_WEBHOOK_CONFIGURATIONS, None, self.configuration)
        if config is None:
            log.warning("event=webhook_configuration_missing name=%s", self.configuration)
            return
        bundle = base64.b64encode(credentials.bundle.encode()).decode()
        path = f"/{self.webhook_id}/{credentials.token}"
        hooks = config.get("webhooks") or []
        changed = False
        for hook in hooks:
            client = hook.get("clientConfig") or {}
            service = client.get("service")
            if hook.get("name") != self.webhook or not isinstance(service, dict):
                continue
            if client.get("caBundle") != bundle or service.get("path") != path:
                client["caBundle"], service["path"] = bundle, path
                hook["clientConfig"] = client
                changed = True
        if changed:
            version = (config.get("metadata") or {}).get("resourceVersion")
            update = {"metadata": {"resourceVersion": version}, "webhooks": hooks}
            await kube.patch(MUTATING_WEBHOOK_CONFIGURATIONS, None, self.configuration, update)
            log.info("event=webhook_configuration_updated name=%s", self.configuration)
