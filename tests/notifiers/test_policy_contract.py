"""The policy's real payloads (gateway/policy/payload_build.py) render on every channel."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.feishu_server import card_problems
from trainsentry.alerts import GO_ZERO_TIME, Alert, AlertStatus, Priority
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.dedup import Decision, Notice
from trainsentry.gateway.policy.payload_build import alert_payload, storm_payload
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import (
    StormEntry,
    StormMessage,
    StormMessageKind,
    build_summary,
)
from trainsentry.notifiers.email import render_alert_email
from trainsentry.notifiers.feishu.card import CardOptions, build_card, card_bytes
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.notifiers.rows import as_dict, row_from_payload

T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
LABELS = {
    "alertname": "GpuXidError", "priority": "P0", "trainingjob": "llama-70b",
    "namespace": "team-a", "node": "gpu-node-07", "gpu": "3", "component": "gpu",
}  # fmt: skip


def _alert(status: AlertStatus, ends: datetime | None) -> Alert:
    return Alert(
        fingerprint="fp1", status=status, labels=LABELS,
        annotations={"summary": "XID 79", "runbook_url": "https://runbooks.example/xid"},
        starts_at=T0, ends_at=ends, generator_url="http://prom/graph",
    )  # fmt: skip


def _roundtrip(payload: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(payload)))  # as stored in the outbox


@pytest.mark.parametrize(
    ("notice", "status", "ends"),
    [
        (Notice.FIRING, AlertStatus.FIRING, GO_ZERO_TIME),
        (Notice.RECURRENCE, AlertStatus.FIRING, None),
        (Notice.FLAPPING, AlertStatus.FIRING, None),
        (Notice.RESOLVED, AlertStatus.RESOLVED, T0 + timedelta(minutes=42)),
    ],
)
def test_policy_alert_payload_renders(notice: Notice, status: AlertStatus, ends: Any) -> None:
    decision = Decision(
        fingerprint="fp1", occurrence=T0, at=T0 + timedelta(minutes=1), notice=notice,
        transition=status, recurrences=2, flap_transitions=5,
    )  # fmt: skip
    classification = Classification(Priority.P0, "gpu-xid", "XID 79 kills the job")
    raw = _roundtrip(alert_payload(decision, _alert(status, ends), 17, classification))
    payload = parse_payload(raw)
    card = build_card("alert", payload, CardOptions(actions=True))
    assert card_problems(card) == []
    text = json.dumps(card, ensure_ascii=False)
    assert "team-a/llama-70b" in text and "gpu-node-07" in text and "XID 79 kills the job" in text
    row = as_dict(row_from_payload(payload))
    assert row["occurrence"] == "alert-17" and row["status"] == status.value
    if status is AlertStatus.RESOLVED:
        assert card["header"]["template"] == "green" and row["duration"] == "42m"
    else:
        assert card["header"]["template"] == "red" and row["ends_at"] == ""
    subject, _, _ = render_alert_email("alert", payload)
    assert subject.startswith(f"[P0] {status.value.upper()}: GpuXidError")


def test_policy_storm_payload_renders() -> None:
    policy = load_policy()
    entries = [
        StormEntry(
            Alert(
                f"fp{i}",
                AlertStatus.FIRING,
                {**LABELS, "node": f"n{i}"},
                {"summary": "s"},
                T0,
                None,
            ),
            Priority.P0,
            AlertStatus.FIRING,
            T0,
            alert_id=i,
        )
        for i in range(300)
    ]
    summary = build_summary(
        entries, policy, job="team-a/llama-70b", start=T0, end=T0 + timedelta(minutes=1)
    )
    message = StormMessage(
        kind=StormMessageKind.STARTED, job="team-a/llama-70b", episode=T0.isoformat(), seq=1,
        at=T0, priority=Priority.P0, summary=summary, labels={"namespace": "team-a"},
    )  # fmt: skip
    payload = parse_payload(_roundtrip(storm_payload(message, policy)))
    card = build_card("storm", payload)
    assert card_problems(card) == [] and card_bytes(card) < 20 * 1024
    assert "300 alerts" in card["header"]["title"]["content"]
    assert "more alerts not shown" in json.dumps(card, ensure_ascii=False)
