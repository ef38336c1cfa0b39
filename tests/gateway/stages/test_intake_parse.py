"""parse_webhook: every malformed body is rejected with a reason; valid ones convert exactly."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import AlertStatus
from trainsentry.gateway.stages.intake import IntakeRejected, label_fingerprint, parse_webhook


def test_valid_body_converts_every_field() -> None:
    body = make_body([make_alert(1, status="resolved"), make_alert(2)])
    parsed = parse_webhook(encode(body))
    assert parsed.receiver == "trainsentry" and parsed.group_key == body["groupKey"]
    first, second = parsed.alerts
    assert first.status is AlertStatus.RESOLVED and first.ends_at is not None
    assert second.ends_at is None  # Go's zero time means "no end"
    assert second.starts_at.tzinfo is UTC
    assert first.labels["alertname"] == "GPUXidError"
    assert first.fingerprint == f"{1:016x}"


def test_missing_fingerprint_is_derived_from_labels() -> None:
    alert = make_alert(4)
    del alert["fingerprint"]
    (parsed,) = parse_webhook(encode(make_body([alert]))).alerts
    assert parsed.fingerprint == label_fingerprint(alert["labels"])
    assert len(parsed.fingerprint) == 16


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe{}", "not UTF-8"),
        (b"{", "invalid JSON"),
        (b"[]", "JSON object"),
        (b"[" * 100000, "invalid JSON"),
        (json.dumps({"version": "3", "status": "firing", "alerts": []}).encode(), "webhook v4"),
        (json.dumps({"version": "4", "status": "firing"}).encode(), "webhook v4"),
    ],
)
def test_malformed_bodies_are_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(IntakeRejected, match=reason):
        parse_webhook(raw)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda a: a.update(status="pending"),
        lambda a: a.update(labels={}),
        lambda a: a.update(startsAt="yesterday"),
        lambda a: a.update(startsAt="2026-11-20T03:00:00"),  # no timezone
        lambda a: a["labels"].update(node="gpu\x00-1"),  # PostgreSQL cannot store NUL
        lambda a: a["labels"].update(node=7),
        lambda a: a.update(fingerprint="x" * 65),
        lambda a: a.update(fingerprint="a b"),
    ],
)
def test_invalid_alert_fields_are_rejected(mutate: object) -> None:
    alert = make_alert(1)
    mutate(alert)  # type: ignore[operator]
    with pytest.raises(IntakeRejected) as info:
        parse_webhook(encode(make_body([alert])))
    assert info.value.details, "the rejection should say which field"


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda b: b["alerts"][1]["labels"].update(node="gpu\x00-1"), "alerts.1.labels.node"),
        (
            lambda b: b["alerts"][0]["labels"].update({"no\x00de": "x"}),
            "alerts.0.labels.no\\u0000de",
        ),
        (
            lambda b: b["alerts"][1]["annotations"].update(summary="\x00"),
            "alerts.1.annotations.summary",
        ),
        (lambda b: b["alerts"][0].update(generatorURL="http://p/\x00"), "alerts.0.generatorURL"),
        (lambda b: b["commonLabels"].update(job="\x00"), "commonLabels.job"),
        (lambda b: b.update(receiver="r\x00"), "receiver"),
    ],
)
def test_nul_characters_are_rejected_where_they_are(mutate: Any, where: str) -> None:
    # PostgreSQL cannot store NUL in text. JSON carries it only as the escape \u0000.
    body = make_body([make_alert(1), make_alert(2)])
    mutate(body)
    raw = encode(body)
    assert b"\\u0000" in raw
    with pytest.raises(IntakeRejected) as info:
        parse_webhook(raw)
    assert info.value.details == [f"{where}: NUL character not allowed"]


def test_the_text_backslash_u0000_is_not_a_nul() -> None:
    body = make_body([make_alert(1)])
    body["alerts"][0]["annotations"]["description"] = "escape \\u0000 in a runbook"
    (alert,) = parse_webhook(encode(body)).alerts
    assert alert.annotations["description"] == "escape \\u0000 in a runbook"


def test_unpaired_surrogate_is_rejected() -> None:
    raw = encode(make_body([make_alert(1)])).replace(b'"gpu-0001"', b'"gpu-\\ud800"')
    with pytest.raises(IntakeRejected, match="surrogate"):
        parse_webhook(raw)


def test_unknown_keys_are_ignored() -> None:
    body = make_body([make_alert(1)])
    body["future"] = {"x": 1}
    body["alerts"][0]["silencedBy"] = []
    assert len(parse_webhook(encode(body)).alerts) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()))
def test_arbitrary_bodies_are_either_parsed_or_rejected(raw: bytes) -> None:
    try:
        parsed = parse_webhook(raw)
    except IntakeRejected as exc:
        assert exc.reason
    else:
        assert parsed.received_at <= datetime.now(UTC)


alert_like = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved", "other"]),
        "labels": st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
        "startsAt": st.sampled_from(["2026-11-20T03:00:00Z", "bad", "0001-01-01T00:00:00Z"]),
        "fingerprint": st.text(max_size=70),
    }
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(alert_like, max_size=5))
def test_webhook_shaped_bodies_are_either_parsed_or_rejected(
    alerts: list[dict[str, object]],
) -> None:
    raw = json.dumps({"version": "4", "status": "firing", "alerts": alerts}).encode()
    try:
        parsed = parse_webhook(raw)
    except IntakeRejected:
        return
    assert len(parsed.alerts) == len(alerts)
    assert all(alert.labels for alert in parsed.alerts)
