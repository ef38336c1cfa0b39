"""Maintenance windows through the real gateway (in process, loopback HTTP, virtual time), on
SQLite and the real PostgreSQL: a window on one node mutes its P0 and not the same P0 on
another node; an alert still firing when the window ends (or is ended) is notified then, one
that resolved is not; "ends soon" is announced once; a restart keeps the window; bad
requests are 400s naming the field.

The "phone" channel is the generic webhook channel pointed at a local receiver, so every
notice routed to a phone is counted there by alert id.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr
from sqlalchemy import select

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import Person
from trainsentry.config import GatewaySettings, MaintenanceSettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Layer, Roster
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store.engine import create_engine
from trainsentry.store.maintenance_windows import WindowRow, insert_window
from trainsentry.store.schema import notifications

TOKEN = "api-token"
START = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
P0 = {"priority": "P0"}


async def start(
    db_url: str, receiver: Receiver, clock: Clock, *, api_token: str | None = TOKEN, **extra: Any
) -> TestServer:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        webhook_token=SecretStr(TOKEN),
        api_token=SecretStr(api_token) if api_token else None,
    )
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(),
        "phone": WebhookNotifier(receiver.url, name="phone"),
    }
    app = create_app(settings, notifiers=notifiers, clock=clock, tick_interval=3600, **extra)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def settle(server: TestServer) -> None:
    await server.app[GATEWAY_KEY].settle()


async def call(
    server: TestServer, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.request(method, server.make_url(path), json=body) as response:
            return response.status, await response.json()


async def post_alerts(server: TestServer, alerts: list[dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(server.make_url(WEBHOOK_PATH), data=encode(make_body(alerts))) as r:
            assert r.status == 200


def phoned(receiver: Receiver) -> list[tuple[int, str]]:
    """(alert id, event) of each notice the phone channel got."""
    return [(b["payload"].get("alert_id"), b["payload"].get("event")) for b in receiver.bodies]


def node_window(node: str, hours: float = 2, **extra: Any) -> dict[str, Any]:
    return {
        "matchers": {"node": node},
        "starts_at": START.isoformat(),
        "ends_at": (START + timedelta(hours=hours)).isoformat(),
        "reason": "NVLink replacement",
        "created_by": "alice",
        **extra,
    }


async def test_a_window_on_one_node_mutes_its_p0_not_the_same_p0_elsewhere_and_notifies_at_its_end(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        status, window = await call(server, "POST", "/api/v1/maintenance", node_window("gpu-17"))
        assert status == 201 and window["active"] and window["created_by"] == "alice (API token)"
        await post_alerts(
            server,
            [
                make_alert(1, labels={**P0, "node": "gpu-17"}),
                make_alert(2, labels={**P0, "node": "gpu-18"}),
                make_alert(3, labels={**P0, "node": "gpu-17"}, name="NodeDown"),
            ],
        )
        await settle(server)
        assert phoned(receiver) == [(2, "firing")]  # 1 and 3 muted
        status, listed = await call(server, "GET", "/api/v1/alerts")
        muted = {item["id"]: item["muted_by"] for item in listed["items"]}
        assert muted[2] is None
        assert muted[1]["window_id"] == window["id"] and muted[1]["state"] == "muted"
        assert muted[1]["reason"] == "NVLink replacement"
        # alert 3 resolves inside the window: nothing was announced, nothing is owed
        await post_alerts(
            server,
            [make_alert(3, status="resolved", labels={**P0, "node": "gpu-17"}, name="NodeDown")],
        )
        clock.now += timedelta(minutes=30)
        await settle(server)
        assert phoned(receiver) == [(2, "firing")]
        # the window ends with alert 1 still firing: it is notified now, once
        clock.now = START + timedelta(hours=2)
        await settle(server)
        await settle(server)
        assert phoned(receiver) == [(2, "firing"), (1, "firing")]
        notice = receiver.bodies[-1]["payload"]
        assert notice["maintenance"]["window_id"] == window["id"]
        assert f"held by maintenance window {window['id']}" in notice["reason"]
        status, detail = await call(server, "GET", "/api/v1/alerts/1")
        assert detail["muted_by"]["state"] == "notified"
        status, detail = await call(server, "GET", "/api/v1/alerts/3")
        assert detail["muted_by"]["state"] == "resolved"
        # the stored record is complete: the muted alerts reached the console only at the end
        engine = create_engine(db_url)
        try:
            async with engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(notifications.c.alert_id, notifications.c.channel).where(
                            notifications.c.alert_id.in_([1, 3])
                        )
                    )
                ).all()
        finally:
            await engine.dispose()
        assert sorted(rows) == [(1, "console"), (1, "phone")]
    finally:
        await close_in_process(server)


async def test_ending_a_window_early_notifies_and_a_regex_window_mutes(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        body = node_window("ignored")
        body["matchers"] = {"node": {"regex": "gpu-1[0-9]"}, "alertname": "GPUXidError"}
        status, window = await call(server, "POST", "/api/v1/maintenance", body)
        assert status == 201
        await post_alerts(
            server,
            [
                make_alert(1, labels={**P0, "node": "gpu-17"}),
                make_alert(2, labels={**P0, "node": "gpu-170"}),
            ],
        )
        await settle(server)
        assert phoned(receiver) == [(2, "firing")]  # anchored: gpu-170 is not gpu-1[0-9]
        clock.now += timedelta(minutes=10)
        status, ended = await call(
            server, "DELETE", f"/api/v1/maintenance/{window['id']}", {"by": "bob"}
        )
        assert status == 200 and ended["ended_by"] == "bob (API token)" and not ended["active"]
        await settle(server)
        assert phoned(receiver) == [(2, "firing"), (1, "firing")]
        status, current = await call(server, "GET", "/api/v1/maintenance")
        assert current["items"] == []
        status, every = await call(server, "GET", "/api/v1/maintenance?all=1")
        assert [w["id"] for w in every["items"]] == [window["id"]]
        status, _ = await call(server, "DELETE", "/api/v1/maintenance/mw-00", {"by": "bob"})
        assert status == 404
    finally:
        await close_in_process(server)


async def test_a_window_ending_soon_with_alerts_firing_is_announced_once(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(
        db_url, receiver, clock, maintenance=MaintenanceSettings(announce_before_minutes=15)
    )
    try:
        await call(server, "POST", "/api/v1/maintenance", node_window("gpu-17", hours=1))
        await post_alerts(server, [make_alert(1, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        clock.now = START + timedelta(minutes=40)
        await settle(server)
        assert phoned(receiver) == []  # 20 minutes left: not yet
        clock.now = START + timedelta(minutes=46)
        await settle(server)
        clock.now = START + timedelta(minutes=50)
        await settle(server)
        engine = create_engine(db_url)
        try:
            async with engine.connect() as conn:
                notices = (
                    await conn.execute(
                        select(notifications.c.channel, notifications.c.payload).where(
                            notifications.c.alert_id.is_(None)
                        )
                    )
                ).all()
        finally:
            await engine.dispose()
        ending = [(c, p) for c, p in notices if p.get("event") == "maintenance_ending"]
        assert [c for c, _ in ending] == ["console"]  # never a phone
        assert ending[0][1]["maintenance"]["firing"] == [1]
        assert phoned(receiver) == []
    finally:
        await close_in_process(server)


async def test_a_restart_in_the_middle_of_a_window_keeps_it_muting(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        status, window = await call(server, "POST", "/api/v1/maintenance", node_window("gpu-17"))
        assert status == 201
        await post_alerts(server, [make_alert(1, labels={**P0, "node": "gpu-17"})])
        await settle(server)
    finally:
        await close_in_process(server)
    clock.now += timedelta(minutes=30)
    server = await start(db_url, receiver, clock)
    try:
        await post_alerts(server, [make_alert(2, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        assert phoned(receiver) == []
        status, listed = await call(server, "GET", "/api/v1/maintenance")
        assert [w["id"] for w in listed["items"]] == [window["id"]] and listed["items"][0]["active"]
        clock.now = START + timedelta(hours=2)
        await settle(server)
        # 1 and 2 (one group, both muted by the window) are one incident: one page at its end
        assert sorted(phoned(receiver)) == [(1, "firing")]
    finally:
        await close_in_process(server)


async def test_a_recurring_window_mutes_in_each_occurrence_only(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        body = {
            "matchers": {"node": "gpu-17"},
            "rrule": "FREQ=DAILY;COUNT=2",
            "start": "03:00",
            "duration_minutes": 60,
            "timezone": "UTC",
            "created_by": "ops",
        }
        status, window = await call(server, "POST", "/api/v1/maintenance", body)
        assert status == 201 and window["current"] == {
            "start": START.isoformat(),
            "end": (START + timedelta(hours=1)).isoformat(),
        }
        await post_alerts(server, [make_alert(1, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        assert phoned(receiver) == []
        clock.now = START + timedelta(hours=1)  # the occurrence ends: still firing, notified
        await settle(server)
        assert phoned(receiver) == [(1, "firing")]
        clock.now = START + timedelta(hours=5)  # between occurrences: not muted
        await post_alerts(server, [make_alert(2, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        assert phoned(receiver) == [(1, "firing"), (2, "firing")]
        clock.now = START + timedelta(days=1, minutes=30)  # the next day's occurrence
        await post_alerts(server, [make_alert(3, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        assert len(phoned(receiver)) == 2
        status, detail = await call(server, "GET", "/api/v1/alerts/3")
        assert detail["muted_by"]["until"] == (START + timedelta(days=1, hours=1)).isoformat()
        clock.now = START + timedelta(days=2, minutes=30)  # COUNT=2: no third occurrence
        # another cause (alert 2's incident still fires and paged): an incident of its own
        await post_alerts(server, [make_alert(4, labels={**P0, "node": "gpu-17"}, name="NodeDown")])
        await settle(server)
        assert (4, "firing") in phoned(receiver)
    finally:
        await close_in_process(server)


# Each was accepted and muted every P0 (issue 32 finding 5): every matcher matches the empty
# string (Alertmanager's rule for silences), or the rule never ends.
MUTE_EVERYTHING = [
    {"alertname": {"regex": ".*"}},
    {"nosuchlabel": ""},
    {"node": {"regex": "|x"}},
    {"a": "", "b": {"regex": ".*"}},  # Alertmanager's silence_test.go case
]


async def test_windows_muting_everything_or_forever_are_refused_and_the_p0_pages(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        for matchers in MUTE_EVERYTHING:
            status, answer = await call(
                server, "POST", "/api/v1/maintenance", {**node_window("x"), "matchers": matchers}
            )
            assert status == 400, (matchers, answer)
            assert answer["error"].startswith("window.matchers: every matcher matches the empty")
        daily = {
            "matchers": {"node": "gpu-17"},
            "rrule": "FREQ=DAILY",
            "start": "00:00",
            "duration_minutes": 1440,
            "timezone": "UTC",
            "created_by": "mallory",
        }
        status, answer = await call(server, "POST", "/api/v1/maintenance", daily)
        assert status == 400 and answer["error"].startswith("window.rrule: needs COUNT or UNTIL")
        # bounded, but 30 days of daily occurrences: longer than max_window_hours in all
        daily["rrule"] = "FREQ=DAILY;COUNT=30"
        status, answer = await call(server, "POST", "/api/v1/maintenance", daily)
        assert status == 400 and "longer than the cap in all" in answer["error"], answer
        daily["rrule"] = "FREQ=DAILY;UNTIL=20261201T000000"
        status, answer = await call(server, "POST", "/api/v1/maintenance", daily)
        assert status == 400 and answer["error"].startswith("window.rrule"), answer
        status, listed = await call(server, "GET", "/api/v1/maintenance")
        assert listed["items"] == []
        await post_alerts(server, [make_alert(1, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        assert phoned(receiver) == [(1, "firing")]
    finally:
        await close_in_process(server)


async def test_a_stored_window_the_rules_now_refuse_is_ignored_and_logged(
    db_url: str, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Stored by a version that accepted it: every alert, every day, forever. Read again
    (without the caps of the day, with the rules), it is refused: logged, and mutes nothing."""
    server = await start(db_url, receiver, Clock(START))
    try:
        request = {
            "matchers": {"alertname": {"regex": ".*"}},
            "rrule": "FREQ=DAILY",
            "start": "00:00",
            "duration_minutes": 1440,
            "timezone": "UTC",
            "created_by": "mallory",
        }
        row = WindowRow(
            id="mw-0ld", created_at=START, created_by="mallory", reason="", request=request,
            starts_at=None, ends_at=None, ended_at=None, ended_by=None, announced_end=None,
        )  # fmt: skip
        engine = create_engine(db_url)
        try:
            async with engine.begin() as conn:
                await insert_window(conn, row)
        finally:
            await engine.dispose()
        await post_alerts(server, [make_alert(1, labels={**P0, "node": "gpu-17"})])
        await settle(server)
        assert phoned(receiver) == [(1, "firing")]
        assert any(
            "mw-0ld cannot be read" in r.getMessage() and "every matcher" in r.getMessage()
            for r in caplog.records
        )
    finally:
        await close_in_process(server)


async def test_a_longer_recurring_window_needs_max_total_hours(
    db_url: str, receiver: Receiver
) -> None:
    weekly = {
        "matchers": {"rack": "r7"},
        "rrule": "FREQ=WEEKLY;COUNT=4",
        "start": "02:00",
        "duration_minutes": 120,
        "timezone": "Europe/Berlin",
        "created_by": "ops",
    }
    server = await start(db_url, receiver, Clock(START))
    try:
        status, answer = await call(server, "POST", "/api/v1/maintenance", weekly)
        assert status == 400 and answer["error"].startswith("window.rrule"), answer
    finally:
        await close_in_process(server)
    settings = MaintenanceSettings(max_total_hours=24 * 31)
    server = await start(db_url, receiver, Clock(START), maintenance=settings)
    try:
        status, window = await call(server, "POST", "/api/v1/maintenance", weekly)
        assert status == 201, window
        assert window["rrule"] == "FREQ=WEEKLY;COUNT=4"
    finally:
        await close_in_process(server)


async def test_a_muted_p0_opens_its_phone_escalation_only_when_the_window_ends(
    db_url: str, receiver: Receiver
) -> None:
    escalator = Escalator(
        Roster((Layer("primary", (Person("alice", phone="+8613800000001"),)),)),
        EscalationPolicy(ack_timeout=timedelta(minutes=5)),
    )
    clock = Clock(START)
    server = await start(db_url, receiver, clock, escalator=escalator)
    try:
        await call(server, "POST", "/api/v1/maintenance", node_window("gpu-17", hours=1))
        await post_alerts(
            server,
            [
                make_alert(1, labels={**P0, "node": "gpu-17"}),
                make_alert(2, labels={**P0, "node": "gpu-18"}),
            ],
        )
        await settle(server)

        def called() -> set[int]:
            return {b["payload"]["alert_id"] for b in receiver.bodies if b.get("kind") == "call"}

        assert called() == {2}
        clock.now = START + timedelta(minutes=30)
        await settle(server)
        assert called() == {2}  # alert 1: muted, no escalation
        clock.now = START + timedelta(hours=1)
        await settle(server)
        assert called() == {1, 2}
        assert [
            b["payload"]["person"]["name"] for b in receiver.bodies if b["payload"]["alert_id"] == 1
        ] == ["alice"]
    finally:
        await close_in_process(server)


BAD = [
    ({"matchers": {"node": "x"}, "created_by": "a", "starts_at": "2026-11-20T05:00:00Z",
      "ends_at": "2026-11-20T04:00:00Z"}, "window.ends_at"),
    ({"matchers": {"node": "x"}, "created_by": "a", "starts_at": "2026-11-20T05:00",
      "ends_at": "2026-11-20T06:00", "timezone": "Mars/Olympus"}, "window.timezone"),
    ({"matchers": {"node": "x"}, "created_by": "a", "rrule": "FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30",
      "start": "02:00", "duration_minutes": 60, "timezone": "UTC"}, "window.rrule"),
    ({"matchers": {"node": "x"}, "created_by": "a", "rrule": "FREQ=WEEKLY;COUNT=0",
      "start": "02:00", "duration_minutes": 60, "timezone": "UTC"}, "window.rrule"),
    ({"matchers": {"node": "x"}, "created_by": "a", "starts_at": "2026-11-20T05:00:00Z",
      "ends_at": "2026-11-22T06:00:00Z"}, "window.ends_at"),  # longer than the 24 h cap
    ({"matchers": {"node": "x"}, "created_by": "a", "rrule": "FREQ=DAILY;COUNT=1", "start": "02:00",
      "duration_minutes": 24 * 60 + 1, "timezone": "UTC"}, "window.duration_minutes"),
    ({"matchers": {"node": "x"}, "created_by": "a", "rrule": "FREQ=DAILY", "start": "02:00",
      "duration_minutes": 60, "timezone": "UTC"}, "window.rrule: needs COUNT or UNTIL"),
    ({"matchers": {"node": "x"}, "created_by": "a", "rrule": "FREQ=DAILY;COUNT=2", "start": "02:00",
      "duration_minutes": 60, "timezone": "UTC"}, "window.rrule: the occurrences last longer"),
    ({"matchers": {"node": {"regex": "gpu-(["}}, "created_by": "a",
      "starts_at": "2026-11-20T05:00:00Z", "ends_at": "2026-11-20T06:00:00Z"},
     "window.matchers.node.regex"),
    ({"matchers": {"node": {"regex": "gpu-1(?!7)"}}, "created_by": "a",
      "starts_at": "2026-11-20T05:00:00Z", "ends_at": "2026-11-20T06:00:00Z"},
     "window.matchers.node.regex: not a regular expression (RE2 syntax)"),
    ({"matchers": {"node": {"regex": "gpu-.{0,500}"}}, "created_by": "a",
      "starts_at": "2026-11-20T05:00:00Z", "ends_at": "2026-11-20T06:00:00Z"},
     "window.matchers.node.regex: too large"),
    ({"matchers": {"nosuchlabel": ""}, "created_by": "a",
      "starts_at": "2026-11-20T05:00:00Z", "ends_at": "2026-11-20T06:00:00Z"},
     "window.matchers: every matcher matches the empty string"),
    ({"matchers": {}, "created_by": "a", "starts_at": "2026-11-20T05:00:00Z",
      "ends_at": "2026-11-20T06:00:00Z"}, "window.matchers"),
    ({"matchers": {"node": "x"}, "starts_at": "2026-11-20T05:00:00Z",
      "ends_at": "2026-11-20T06:00:00Z"}, "window.created_by"),
    ({"matchers": {"node": "x\u0000"}, "created_by": "a", "starts_at": "2026-11-20T05:00:00Z",
      "ends_at": "2026-11-20T06:00:00Z"}, "window.matchers.node"),
    ({"matchers": {"node": "x"}, "created_by": "a", "starts_at": 5, "ends_at": None},
     "window.starts_at"),
    (["not", "an", "object"], "window"),
]  # fmt: skip


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
async def test_bad_requests_are_400s_naming_the_field_and_writes_need_the_api_token(
    db_url: str, receiver: Receiver
) -> None:
    server = await start(
        db_url, receiver, Clock(START), maintenance=MaintenanceSettings(max_window_hours=24)
    )
    try:
        for body, field in BAD:
            status, answer = await call(server, "POST", "/api/v1/maintenance", body)
            assert status == 400, (body, answer)
            assert answer["error"].startswith(field), (field, answer)
        status, _ = await call(server, "POST", "/api/v1/maintenance", node_window("x"), token=None)
        assert status == 401
        status, _ = await call(server, "POST", "/api/v1/maintenance", node_window("x"), token="no")
        assert status == 401
        status, _ = await call(
            server, "DELETE", "/api/v1/maintenance/mw-1", {"by": "x"}, token=None
        )
        assert status == 401
        status, answer = await call(server, "DELETE", "/api/v1/maintenance/mw-1", {})
        assert status == 400 and "by" in answer["error"]
        status, answer = await call(server, "DELETE", "/api/v1/maintenance/../x", {"by": "a"})
        assert status in (400, 404)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            url = server.make_url("/api/v1/maintenance")
            async with session.post(url, data=b"{not json") as response:
                assert response.status == 400
            async with session.post(url, data=b"[" * 100_000) as response:
                assert response.status in (400, 413)
        status, listed = await call(server, "GET", "/api/v1/maintenance")
        assert listed["items"] == []
    finally:
        await close_in_process(server)
    server = await start(db_url, receiver, Clock(START), api_token=None)
    try:
        status, answer = await call(server, "POST", "/api/v1/maintenance", node_window("x"))
        assert status == 403 and "TRAINSENTRY_API_TOKEN" in answer["error"]
    finally:
        await close_in_process(server)
