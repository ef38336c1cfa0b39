"""Escalation policies over schedules, through the real gateway on virtual time: the
schedule's person, then the next layer after N minutes, then the lead; an ack with a comment
stops it and the comment reaches the alert's history and the redrawn card; a run-time override
changes who is called; "escalate now" calls the next step at once."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.oncall_gateway import START, call, called, post_alerts, settle, start
from tests.support.receiver import Receiver
from tests.support.webhook_factory import make_alert, make_body

P0 = {"priority": "P0"}


async def test_two_layers_then_an_ack_with_a_comment_stops_it(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    console = tmp_path / "console.jsonl"
    server = await start(db_url, receiver, clock, tmp_path, console=console)
    try:
        await post_alerts(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        assert called(receiver) == ["alice"]  # step 1: the schedule's first person
        clock.now += timedelta(minutes=9, seconds=59)
        await settle(server)
        assert called(receiver) == ["alice"]
        clock.now = START + timedelta(minutes=10)
        await settle(server)
        assert called(receiver) == ["alice", "bob"]  # step 2: the next layer
        clock.now = START + timedelta(minutes=12)
        status, answer = await call(
            server, "POST", "/api/v1/alerts/1/ack", {"by": "bob", "comment": "rebooting node 17"}
        )
        assert status == 200, answer
        assert answer["escalation_stopped"] and answer["comment"] == "rebooting node 17"
        await settle(server)
        for minutes in (20, 30, 60, 120):
            clock.now = START + timedelta(minutes=minutes)
            await settle(server)
        assert called(receiver) == ["alice", "bob"]  # the lead is never called
        status, alert = await call(server, "GET", "/api/v1/alerts/1")
        acked = [e for e in alert["events"] if e["kind"] == "acked"]
        assert acked[0]["detail"] == {
            "by": "bob", "comment": "rebooting node 17", "incident": 1, "via": "api-token"
        }  # fmt: skip
        lines = [json.loads(line) for line in console.read_text().splitlines()]
        ack_cards = [line for line in lines if line["kind"] == "ack"]
        assert ack_cards and ack_cards[0]["payload"]["ack_comment"] == "rebooting node 17"
        fired = [line for line in lines if line["kind"] == "alert"]
        assert fired[0]["payload"]["on_call"] == "alice (gpu-infra, until 2026-11-23 09:00 +0100)"
    finally:
        await close_in_process(server)


async def test_unacknowledged_it_runs_the_steps_twice_then_stops(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock, tmp_path)
    try:
        await post_alerts(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        for minutes in range(10, 130, 10):
            clock.now = START + timedelta(minutes=minutes)
            await settle(server)
        assert called(receiver) == ["alice", "bob", "lead", "alice", "bob", "lead"]
    finally:
        await close_in_process(server)


async def test_a_run_time_override_changes_who_is_called(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock, tmp_path)
    try:
        body = {
            "schedule": "gpu-infra",
            "who": "carol",
            "start": "2026-11-20T03:30:00+01:00",  # 02:30 UTC, before START
            "end": "2026-11-20T06:00",  # local time: 05:00 UTC
            "by": "alice",
            "reason": "alice at the dentist",
        }
        status, stored = await call(server, "POST", "/api/v1/oncall/overrides", body)
        assert status == 201, stored
        assert stored["created_by"] == "alice (API token)"
        assert stored["created_at"] == START.isoformat()
        await post_alerts(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        clock.now = START + timedelta(minutes=10)
        await settle(server)
        # carol first (the override), then the schedule's second: alice (primary)
        assert called(receiver) == ["carol", "alice"]
        status, removed = await call(
            server, "DELETE", f"/api/v1/oncall/overrides/{stored['id']}", {"by": "carol"}
        )
        assert status == 200 and removed["removed_by"] == "carol (API token)"
        # another cause (alert 1's incident still fires): an incident, and a page, of its own
        await post_alerts(server, make_body([make_alert(2, labels=P0, name="NodeDown")]))
        await settle(server)
        assert called(receiver)[2:] == ["alice"]  # the override no longer applies
        status, listed = await call(server, "GET", "/api/v1/oncall/overrides?removed=true")
        assert [item["removed_by"] for item in listed["items"]] == ["carol (API token)"]
    finally:
        await close_in_process(server)


async def test_escalate_now_calls_the_next_step_at_once(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock, tmp_path)
    try:
        await post_alerts(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        clock.now = START + timedelta(minutes=1)
        status, answer = await call(server, "POST", "/api/v1/alerts/1/escalate", {"by": "alice"})
        assert status == 200, answer
        assert answer["calls"] == [{"person": "bob", "layer": "gpu-infra#2"}]
        await settle(server)
        assert called(receiver) == ["alice", "bob"]
        clock.now = START + timedelta(minutes=10)  # the old timer: nothing more is due
        await settle(server)
        assert called(receiver) == ["alice", "bob"]
        clock.now = START + timedelta(minutes=11)  # ten minutes after the escalation
        await settle(server)
        assert called(receiver) == ["alice", "bob", "lead"]
        status, alert = await call(server, "GET", "/api/v1/alerts/1")
        assert [e["detail"]["by"] for e in alert["events"] if e["kind"] == "escalated"] == ["alice"]
        # refused: without a token, for an unknown alert, and once acknowledged
        assert (await call(server, "POST", "/api/v1/alerts/1/escalate", {"by": "x"}, None))[
            0
        ] == 401
        assert (await call(server, "POST", "/api/v1/alerts/99/escalate", {"by": "x"}))[0] == 404
        assert (await call(server, "POST", "/api/v1/alerts/1/escalate", {}))[0] == 400
        await call(server, "POST", "/api/v1/alerts/1/ack", {"by": "lead"})
        status, answer = await call(server, "POST", "/api/v1/alerts/1/escalate", {"by": "x"})
        assert status == 409 and "acked" in answer["error"]
    finally:
        await close_in_process(server)
