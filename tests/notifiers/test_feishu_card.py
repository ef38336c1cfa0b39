"""Card JSON 2.0 rendering: required fields, colours, trimming, storms."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.feishu_server import card_problems
from trainsentry.alerts import Alert, AlertStatus, Priority
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import StormEntry, build_summary
from trainsentry.notifiers.feishu.card import (
    MAX_BOT_BODY_BYTES,
    CardOptions,
    alert_card,
    build_card,
    card_bytes,
    storm_card,
)
from trainsentry.notifiers.payload import parse_payload

from .helpers import alert_payload


def _texts(card: dict[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False)


def _buttons(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The buttons in the card's button rows, the ack form's included."""
    found = []
    for element in card["body"]["elements"]:
        for row in [element, *element.get("elements", [])]:
            for column in row.get("columns", []):
                found.extend(e for e in column["elements"] if e["tag"] == "button")
    return found


@pytest.mark.parametrize(
    ("priority", "status", "template"),
    [
        ("P0", "firing", "red"),
        ("P1", "firing", "orange"),
        ("P2", "firing", "yellow"),
        ("P3", "firing", "blue"),
        ("P0", "resolved", "green"),
        ("P3", "resolved", "green"),
    ],
)
def test_header_colour(priority: str, status: str, template: str) -> None:
    card = alert_card(parse_payload(alert_payload(priority, status)))
    assert card["header"]["template"] == template
    assert card_problems(card) == []


def test_alert_card_has_the_fields_people_need() -> None:
    now = datetime(2026, 11, 22, 1, 30, tzinfo=UTC)
    payload = parse_payload(alert_payload(mentions=["ou_alice", "all"], count=3))
    card = alert_card(payload, CardOptions(actions=True), now=now)
    assert card_problems(card) == []
    text = _texts(card)
    assert card["schema"] == "2.0"
    assert card["header"]["title"]["content"].startswith("[P0] FIRING: GpuXidError")
    for needle in (
        "team-a/llama-70b", "**Rank:** 27", "**Node:** gpu-node-07", "**GPU:** 3",
        "**Value:** 79", "2026-11-22 01:00:00 UTC (30m ago)", "hardware fault",
        "**Count:** 3", "<at id=ou_alice></at>", "<at id=all></at>", "component=gpu",
    ):  # fmt: skip
        assert needle in text, needle
    urls = [b["behaviors"][0].get("default_url") for b in _buttons(card)]
    assert "https://runbooks.example/gpu-xid" in urls
    assert "https://grafana.example/d/job?var-job=llama-70b" in urls
    callbacks = [
        b["behaviors"][0]["value"]
        for b in _buttons(card)
        if b["behaviors"][0]["type"] == "callback"
    ]
    assert {"action": "ack", "alert_id": 42} in callbacks
    assert {"action": "silence", "alert_id": 42, "duration_s": 3600} in callbacks


def test_no_action_buttons_without_app_or_when_resolved_or_acked() -> None:
    def callbacks(card: dict[str, Any]) -> list[Any]:
        return [b for b in _buttons(card) if b["behaviors"][0]["type"] == "callback"]

    assert callbacks(alert_card(parse_payload(alert_payload()))) == []
    resolved = parse_payload(alert_payload(status="resolved", ends_at="2026-11-22T02:30:00Z"))
    card = alert_card(resolved, CardOptions(actions=True))
    assert callbacks(card) == []
    assert "lasted 1h30m" in _texts(card)
    acked = parse_payload(alert_payload(acked_by="ou_bob", silenced_until="2026-11-22T05:00:00Z"))
    card = alert_card(acked, CardOptions(actions=True))
    assert callbacks(card) == []
    assert "Acknowledged by <at id=ou_bob></at>" in _texts(card)
    assert "Silenced until 2026-11-22 05:00 UTC" in _texts(card)


def test_label_values_cannot_inject_markup() -> None:
    payload = alert_payload()
    payload["labels"]["node"] = "<at id=all></at>"
    card = alert_card(parse_payload(payload))
    assert "<at id=all>" not in _texts(card)
    assert "&lt;at id=all&gt;" in _texts(card)


def test_oversized_alert_is_trimmed_and_says_so() -> None:
    payload = alert_payload(annotations={"summary": "s", "description": "x" * 100_000})
    payload["labels"].update({f"extra_{i}": "y" * 100 for i in range(500)})
    card = alert_card(parse_payload(payload))
    assert card_bytes(card) <= MAX_BOT_BODY_BYTES - 256
    assert "more labels not shown" in _texts(card)
    assert card_problems(card) == []


def _storm_payload(summary: dict[str, Any], priority: str = "P0") -> dict[str, Any]:
    return {
        "priority": priority,
        "status": "firing",
        "event": "started",
        "job": "team-a/llama-70b",
        "reason": "alert storm: 2000 new alerts",
        "rule_id": "storm",
        "storm": summary,
        "labels": {},
    }


def test_storm_of_2000_from_the_policy_fits_20kb() -> None:
    policy = load_policy(overrides={"storm": {"top_lines": 100}})
    start = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
    entries = []
    for i in range(2000):
        labels = {
            "alertname": f"GpuXid{i % 7}",
            "trainingjob": "llama-70b",
            "namespace": "team-a",
            "node": f"gpu-node-{i:04d}",
            "gpu": str(i % 8),
            "priority": "P0",
        }
        alert = Alert(
            fingerprint=f"fp{i:05d}",
            status=AlertStatus.FIRING,
            labels=labels,
            annotations={"summary": f"XID on node {i} " + "detail " * 10},
            starts_at=start,
            ends_at=None,
        )
        entries.append(StormEntry(alert, Priority.P0, AlertStatus.FIRING, start, alert_id=i))
    summary = build_summary(
        entries, policy, job="team-a/llama-70b", start=start, end=start + timedelta(minutes=2)
    )
    assert summary["total"] == 2000
    card = build_card("storm", parse_payload(_storm_payload(summary)))
    body = json.dumps({"msg_type": "interactive", "card": card, "timestamp": "1", "sign": "x" * 44},
                      ensure_ascii=False, separators=(",", ":"))  # fmt: skip
    assert len(body.encode()) <= 20 * 1024
    assert card_problems(card) == []
    text = _texts(card)
    assert "2000 alerts" in card["header"]["title"]["content"]
    assert "more alerts not shown" in text
    [by_node] = [
        e["content"] for e in card["body"]["elements"] if "**By node**" in e.get("content", "")
    ]
    counts = [int(line.rsplit(": ", 1)[1]) for line in by_node.splitlines()[1:] if ": " in line]
    assert sum(counts) == 2000  # the policy folds the tail into "(other)"; nothing lost
    [listed] = [
        e["content"] for e in card["body"]["elements"] if "**Alerts**" in e.get("content", "")
    ]
    shown = listed.count("\n- P0")
    cut = int(listed.rsplit("- … ", 1)[1].split(" ")[0])
    assert shown == len(summary["items"]) and shown + cut == 2000


def test_storm_with_2000_listed_items_fits_and_counts_the_cut() -> None:
    items = [
        {"alert_id": i, "alertname": "NcclTimeout", "priority": "P1", "node": f"n{i}",
         "rank": str(i), "summary": "collective stuck " * 5}
        for i in range(2000)
    ]  # fmt: skip
    summary = {"total": 2000, "items": items, "by_alertname": {"NcclTimeout": 2000}}
    card = storm_card(parse_payload(_storm_payload(summary, "P1")))
    assert card_bytes(card) <= MAX_BOT_BODY_BYTES - 256
    text = _texts(card)
    shown = sum(1 for item in items if f"node {item['node']}," in text)
    match = text.split("- … ")[-1].split(" more alerts not shown")[0]
    assert shown > 10 and shown + int(match) == 2000
    assert card["header"]["template"] == "orange"


def test_small_storm_is_not_trimmed() -> None:
    summary = {"total": 3, "items": [{"alertname": "A", "node": "n1"}] * 3, "by_node": {"n1": 3}}
    card = storm_card(parse_payload(_storm_payload(summary)))
    assert "not shown" not in _texts(card)
