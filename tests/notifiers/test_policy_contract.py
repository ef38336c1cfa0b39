"""The payloads the policy really writes (an incident's card, a storm's) render on every channel."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.gateway.policy.factory import fire, resolve
from tests.gateway.policy.test_decide import Gateway
from tests.support.feishu_server import card_problems
from trainsentry.alerts import Alert, AlertStatus, Priority
from trainsentry.gateway.policy.payload_build import storm_payload
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import (
    StormEntry,
    StormMessage,
    StormMessageKind,
    build_summary,
)
from trainsentry.gateway.stages.planning.plan import archive_draft
from trainsentry.notifiers.email import render_alert_email
from trainsentry.notifiers.feishu.card import CardOptions, build_card, card_bytes
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.notifiers.rows import as_dict, row_from_payload

T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
LABELS = {
    "alertname": "GpuXidError", "priority": "P0", "trainingjob": "llama-70b",
    "namespace": "team-a", "node": "gpu-node-07", "gpu": "3", "component": "gpu",
}  # fmt: skip


def _roundtrip(payload: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads(json.dumps(payload)))  # as stored in the outbox


# Each notice as the planner drafts it: an incident's card (incident_cards.py), the
# alert's own fields from its cause (tests/gateway/policy/planned.py runs the planner's steps).
NOTICES = {
    "firing": [fire(0, labels=LABELS)],
    "recurrence": [fire(0, labels=LABELS), resolve(60, 0), fire(300, labels=LABELS)],
    "flapping": [
        fire(0, labels=LABELS),
        resolve(60, 0),
        fire(120, labels=LABELS),
        resolve(180, 120),
    ],
    "resolved": [fire(0, labels=LABELS), resolve(42 * 60, 0)],
}


@pytest.mark.parametrize("notice", sorted(NOTICES))
def test_policy_alert_payload_renders(notice: str) -> None:
    gateway = Gateway()
    for change in NOTICES[notice]:
        result = gateway.send(change)
    [draft] = [d for d in result.drafts if d.channel == "feishu" and d.kind == "alert"]
    payload = parse_payload(_roundtrip(draft.payload))
    assert payload.get("event") == notice
    card = build_card("alert", payload, CardOptions(actions=True))
    assert card_problems(card) == []
    text = json.dumps(card, ensure_ascii=False)
    assert "team-a/llama-70b" in text and "gpu-node-07" in text and payload["reason"] in text
    # the sheet's row of the change: its archive draft (stages/planning/plan.py)
    last = NOTICES[notice][-1]
    archived = archive_draft("sheet", last, result.classification).payload
    row = as_dict(row_from_payload(parse_payload(_roundtrip(archived))))
    assert row["occurrence"] == f"alert-{last.alert_id}"
    status = "firing" if notice != "resolved" else "resolved"  # a flapping one is held
    assert row["status"] == last.alert.status.value and payload["status"] == status
    if status == "resolved":
        assert card["header"]["template"] == "green" and row["duration"] == "42m"
    else:
        assert card["header"]["template"] == "red"
        assert (row["ends_at"] == "") is (last.alert.status is AlertStatus.FIRING)
    subject, _, _ = render_alert_email("alert", payload)
    assert subject.startswith(f"[P0] {status.upper()}: GpuXidError")


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
