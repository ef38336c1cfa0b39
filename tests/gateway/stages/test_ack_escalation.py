"""Phone escalation and acknowledgement through the real gateway on virtual time.

The "phone" channel here is the generic webhook channel pointed at a local receiver, so every
call the escalation places is counted there (provider request shapes are tested in
tests/notifiers). A real Alertmanager receives the silence an ack can create.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr
from sqlalchemy import select

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.realservers import start_alertmanager
from tests.support.receiver import Receiver
from tests.support.webhook_factory import bodies_by_group, encode, make_alert, make_body
from trainsentry.alerts import Person
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Layer, Roster
from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.phone.notifier import PhoneNotifier
from trainsentry.notifiers.phone.webhook import WebhookPhoneProvider
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store.schema import notifications

TOKEN = "api-token"
START = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
ESCALATOR = Escalator(
    Roster(
        (
            Layer("primary", (Person("alice", phone="+8613800000001"),)),
            Layer("secondary", (Person("bob", phone="+8613800000002"),)),
        )
    ),
    EscalationPolicy(ack_timeout=timedelta(minutes=5)),
)
# The phone channel itself (not the generic webhook) through an HTTP voice gateway.
PHONE_TEMPLATE = '{"to": {{ phone|tojson }}, "text": {{ text|tojson }}}'


async def start(
    db_url: str, receiver: Receiver, clock: Clock, phone: Notifier | None = None, **extra: Any
) -> TestServer:
    settings = GatewaySettings(
        listen="127.0.0.1:0", db=db_url, webhook_token=SecretStr(TOKEN), api_token=SecretStr(TOKEN)
    )
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(),
        "phone": phone or WebhookNotifier(receiver.url, name="phone"),
    }
    app = create_app(
        settings, notifiers=notifiers, clock=clock, tick_interval=3600, escalator=ESCALATOR, **extra
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def settle(server: TestServer) -> None:
    await server.app[GATEWAY_KEY].settle()


async def post(server: TestServer, body: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(server.make_url(WEBHOOK_PATH), data=encode(body)) as response:
            assert response.status == 200


async def ack(
    server: TestServer, alert_id: int, token: str | None = TOKEN, **body: Any
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        url = server.make_url(f"/api/v1/alerts/{alert_id}/ack")
        async with session.post(url, json=body) as response:
            return response.status, await response.json()


def called(receiver: Receiver) -> list[tuple[int, str]]:
    return [(b["payload"]["alert_id"], b["payload"]["person"]["name"]) for b in receiver.bodies]


P2 = {"priority": "P2"}
P0 = {"priority": "P0"}


async def test_escalates_until_acknowledged_then_stops(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        await post(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        assert called(receiver) == [(1, "alice")]
        clock.now += timedelta(minutes=4)
        await settle(server)
        assert called(receiver) == [(1, "alice")]  # not yet
        clock.now += timedelta(minutes=1)
        await settle(server)
        assert called(receiver) == [(1, "alice"), (1, "bob")]
        status, answer = await ack(server, 1, by="bob")
        assert status == 200 and answer["escalation_stopped"] and not answer["already_acked"]
        status, again = await ack(server, 1, by="carol")
        assert status == 200 and again["already_acked"] and again["acked_by"] == "bob"
        clock.now += timedelta(minutes=30)
        await settle(server)
        assert len(called(receiver)) == 2
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            async with s.get(server.make_url("/api/v1/alerts/1")) as response:
                detail = await response.json()
        assert detail["acked_by"] == "bob"
        assert [e["kind"] for e in detail["events"]] == ["firing", "acked"]
    finally:
        await close_in_process(server)


async def test_an_alert_joining_an_acknowledged_incident_is_acknowledged_and_never_pages(
    db_url: str, receiver: Receiver
) -> None:
    """The incident is acknowledged: an alert that joins it later (the same group, another
    node) shows as acknowledged, by the incident's acknowledger, and rings nobody."""
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        await post(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        assert called(receiver) == [(1, "alice")]
        status, answer = await ack(server, 1, by="bob")
        assert status == 200 and answer["incident_id"] is not None
        clock.now += timedelta(minutes=1)
        await post(server, make_body([make_alert(1, labels=P0), make_alert(2, labels=P0)]))
        await settle(server)
        clock.now += timedelta(minutes=30)
        await settle(server)
        assert called(receiver) == [(1, "alice")]
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            async with s.get(server.make_url("/api/v1/alerts/2")) as response:
                joined = await response.json()
        assert joined["acked_by"] == "bob", joined
        acked = [e for e in joined["events"] if e["kind"] == "acked"]
        assert [e["detail"]["incident"] for e in acked] == [answer["incident_id"]]
        assert acked[0]["detail"]["joined"] is True
    finally:
        await close_in_process(server)


async def test_resolve_stops_escalation_and_low_priorities_never_call(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        # two groups (the shipped route groups P0 and P2 apart): two incidents
        for body in bodies_by_group([make_alert(1, labels=P0), make_alert(2, labels=P2)]):
            await post(server, body)
        await settle(server)
        assert called(receiver) == [(1, "alice")]
        clock.now += timedelta(minutes=2)
        await post(server, make_body([make_alert(1, status="resolved", labels=P0)]))
        await settle(server)
        clock.now += timedelta(minutes=20)
        await settle(server)
        assert called(receiver) == [(1, "alice")]
    finally:
        await close_in_process(server)


async def test_restart_mid_escalation_resumes_without_a_duplicate_call(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        await post(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
    finally:
        await close_in_process(server)
    clock.now += timedelta(minutes=5)
    server = await start(db_url, receiver, clock)
    try:
        await settle(server)
        await settle(server)
        assert called(receiver) == [(1, "alice"), (1, "bob")]
        assert receiver.duplicates == 0
    finally:
        await close_in_process(server)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_ack_api_is_authenticated_and_validated(db_url: str, receiver: Receiver) -> None:
    server = await start(db_url, receiver, Clock(START))
    try:
        await post(server, make_body([make_alert(1)]))
        assert (await ack(server, 1, token=None, by="x"))[0] == 401
        assert (await ack(server, 1, token="wrong", by="x"))[0] == 401
        assert (await ack(server, 1))[0] == 400  # no "by"
        assert (await ack(server, 1, by="x", silence_minutes=-5))[0] == 400
        assert (await ack(server, 999, by="x"))[0] == 404
        status, answer = await ack(server, 1, by="x", silence_minutes=10)
        assert status == 200 and answer["silence_error"]  # no Alertmanager configured
    finally:
        await close_in_process(server)


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_ack_with_silence_creates_it_in_a_real_alertmanager(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    am_config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    with start_alertmanager(tmp_path, am_config) as am:
        silences = SilenceClient(am.url)
        # Alertmanager refuses silences that end in the past: use the real time here
        server = await start(db_url, receiver, Clock(datetime.now(UTC)), silences=silences)
        try:
            await post(server, make_body([make_alert(1, labels=P0)]))
            status, answer = await ack(server, 1, by="alice", silence_minutes=120)
            assert status == 200 and answer["silence_id"], answer
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{am.url}/api/v2/silence/{answer['silence_id']}") as r:
                    silence = await r.json()
            matchers = {m["name"]: m["value"] for m in silence["matchers"]}
            assert matchers["alertname"] == "GPUXidError" and matchers["node"] == "gpu-0001"
            assert "alice" in silence["createdBy"] + silence["comment"]
            # This test runs on the real clock, so its stages are busy at the end; stopping
            # one mid-transaction leaves SQLAlchemy an aiosqlite connection to terminate,
            # which has hung pytest-asyncio's loop teardown (close_in_process). Let them
            # finish first.
            await settle(server)
        finally:
            await close_in_process(server)
            await silences.aclose()


@pytest.mark.e2e
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_an_incident_acks_silence_covers_its_alerts_and_no_other_cause(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    """Acknowledging with a silence acknowledges the incident: the silences Alertmanager
    gets match each of its nodes (the labels its alerts of that node share), so Alertmanager
    itself silences all of its alerts, never the next node's fault of the same group (a new
    failure domain: issue 43 finding 6; before, one silence without `node` muted it) and
    never another cause of the same job."""
    am_config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    with start_alertmanager(tmp_path, am_config) as am:
        silences = SilenceClient(am.url)
        server = await start(db_url, receiver, Clock(datetime.now(UTC)), silences=silences)
        try:
            group = [make_alert(i, labels=P2) for i in (1, 2, 3)]  # one group, three nodes
            await post(server, make_body(group))
            await settle(server)
            status, answer = await ack(server, 2, by="alice", silence_minutes=60)
            assert status == 200 and answer["alerts_acked"] == 3, answer
            assert len(answer["silence_ids"]) == 3, answer  # one per node
            async with aiohttp.ClientSession() as session:
                made = []
                for silence_id in answer["silence_ids"]:
                    async with session.get(f"{am.url}/api/v2/silence/{silence_id}") as r:
                        made.append({m["name"]: m["value"] for m in (await r.json())["matchers"]})
                assert sorted(m["node"] for m in made) == ["gpu-0001", "gpu-0002", "gpu-0003"]
                assert all(
                    m["alertname"] == "GPUXidError" and m["trainingjob"] == "llama-70b"
                    for m in made
                )
                # Alertmanager's own matching: the group's alerts are silenced, a fourth
                # node's and another cause of the same job are not
                later = make_alert(4, labels=P2)
                other = make_alert(5, name="NodeDown", labels=P2)
                posted = [
                    {"labels": a["labels"], "annotations": a["annotations"]}
                    for a in [*group, later, other]
                ]
                async with session.post(f"{am.url}/api/v2/alerts", json=posted) as r:
                    assert r.status == 200, await r.text()

                async def silenced() -> dict[str, list[str]]:
                    async with session.get(f"{am.url}/api/v2/alerts") as r:
                        found = await r.json()
                    return {a["labels"]["node"]: a["status"]["silencedBy"] for a in found}

                for _ in range(100):
                    state = await silenced()
                    if len(state) == 5 and sum(bool(by) for by in state.values()) >= 3:
                        break
                    await asyncio.sleep(0.1)
            assert {node for node, by in state.items() if by} == {
                "gpu-0001", "gpu-0002", "gpu-0003"
            }, state  # fmt: skip
            await settle(server)
        finally:
            await close_in_process(server)
            await silences.aclose()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_feishu_card_button_acks_and_redraws_the_card(
    db_url: str, receiver: Receiver
) -> None:
    """The card's Acknowledge button (a Feishu card callback) goes through the same ack path:
    the escalation stops and the pressed card comes back showing who took it."""
    import time as wall

    from trainsentry.gateway.api.app import CardCallbackSettings

    clock = Clock(START)
    callback = CardCallbackSettings("/api/v1/feishu/card", "verify-token")
    server = await start(db_url, receiver, clock, card_callback=callback)
    try:
        await post(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        assert called(receiver) == [(1, "alice")]
        press = {
            "schema": "2.0",
            "header": {
                "event_id": "ev-1", "token": "verify-token",
                "create_time": str(int(wall.time() * 1000)),
                "event_type": "card.action.trigger", "tenant_key": "tk", "app_id": "cli_x",
            },
            "event": {
                "operator": {"open_id": "ou_bob"},
                "action": {"value": {"action": "ack", "alert_id": 1}, "tag": "button"},
                "context": {"open_message_id": "om_1", "open_chat_id": "oc_1"},
            },
        }  # fmt: skip
        async with aiohttp.ClientSession() as session:
            async with session.post(server.make_url(callback.path), json=press) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            forged = {**press, "header": {**press["header"], "token": "wrong"}}
            async with session.post(server.make_url(callback.path), json=forged) as response:
                assert response.status == 401
        assert answer["toast"]["type"] == "success"
        assert "ou_bob" in json.dumps(answer["card"])  # the redrawn card names who acked
        clock.now += timedelta(minutes=10)
        await settle(server)
        assert called(receiver) == [(1, "alice")]  # bob (layer 2) is never called
    finally:
        await close_in_process(server)


async def call_rows(server: TestServer) -> list[tuple[str, str | None]]:
    """(status, last_error) of every call row in the outbox."""
    async with server.app[GATEWAY_KEY].engine.connect() as conn:
        rows = await conn.execute(
            select(notifications.c.status, notifications.c.last_error)
            .where(notifications.c.kind == "call")
            .order_by(notifications.c.id)
        )
        return [(row.status, row.last_error) for row in rows]


@pytest.mark.parametrize("stop", ["ack", "resolve"])
async def test_stopping_cancels_a_call_waiting_for_its_retry(
    db_url: str, receiver: Receiver, stop: str
) -> None:
    """The provider failed the first call (HTTP 500); its retry must not ring after an ack or
    a resolve."""
    receiver.fail_first = 1
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    try:
        await post(server, make_body([make_alert(1, labels=P0)]))
        await settle(server)
        # the retry is due about a second later: stopped before (virtual time stands still)
        assert receiver.requests == 1 and called(receiver) == []
        if stop == "ack":
            status, answer = await ack(server, 1, by="alice")
            assert status == 200 and answer["escalation_stopped"]
        else:
            await post(server, make_body([make_alert(1, status="resolved", labels=P0)]))
        await settle(server)
        clock.now += timedelta(minutes=30)
        await settle(server)
        assert called(receiver) == [] and receiver.requests == 1
        assert [status for status, _ in await call_rows(server)] == ["cancelled"]
    finally:
        await close_in_process(server)


@pytest.mark.parametrize("channel", ["phone", "webhook"])
async def test_ack_while_a_call_is_in_flight_stops_its_retry(
    db_url: str, receiver: Receiver, channel: str
) -> None:
    """The call is being placed when the ack lands and the provider then fails it: the outbox
    writes that attempt withdrawn instead of a retry, so nothing rings again. Also when the
    `phone` channel is a generic webhook (`webhooks.phone`), which does not read the call's
    cancel mark: before, its retry rang after the ack."""
    receiver.fail_first, receiver.delay = 1, 1.0
    phone = (
        PhoneNotifier(WebhookPhoneProvider(receiver.url, PHONE_TEMPLATE))
        if channel == "phone"
        else None
    )
    clock = Clock(START)
    server = await start(db_url, receiver, clock, phone=phone)
    try:
        await post(server, make_body([make_alert(1, labels=P0)]))
        sending = asyncio.create_task(settle(server))
        for _ in range(500):  # until the call is in flight at the provider
            if receiver.requests:
                break
            await asyncio.sleep(0.01)
        status, answer = await ack(server, 1, by="alice")
        assert status == 200 and answer["escalation_stopped"]
        await sending
        clock.now += timedelta(minutes=30)
        await settle(server)
        assert receiver.requests == 1 and receiver.bodies == []
        [(status, error)] = await call_rows(server)
        # withdrawn, not failed: TrainsentryNotificationsDead must not fire for it
        assert status == "cancelled" and error is not None and "acknowledged by alice" in error
        async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as r:
            metrics = await r.text()
        assert 'channel="phone",outcome="cancelled"} 1.0' in metrics
        assert 'outcome="dead"} 1.0' not in metrics
    finally:
        await close_in_process(server)


async def card_statuses(server: TestServer) -> list[str]:
    """The `status` of every console card drafted (firing / resolved), oldest first."""
    async with server.app[GATEWAY_KEY].engine.connect() as conn:
        rows = await conn.execute(
            select(notifications.c.payload)
            .where(notifications.c.channel == "console")
            .order_by(notifications.c.id)
        )
        return [str(row.payload.get("status")) for row in rows]


async def test_a_resolve_of_an_occurrence_never_seen_firing_resolves_nothing(
    db_url: str, receiver: Receiver
) -> None:
    """Issue 43 finding 5: team-b's P0 fires; a "resolved" with the same labels and a
    startsAt one minute off (an occurrence the gateway never saw firing) must not resolve
    its incident, send a RESOLVED card or stop the escalation. The real resolve (the
    firing occurrence's startsAt) still does."""
    clock = Clock(START)
    server = await start(db_url, receiver, clock)
    hang = {"priority": "P0", "namespace": "team-b", "trainingjob": "llm"}
    started = START - timedelta(minutes=3)
    try:
        firing = make_alert(1, name="TrainingJobHang", labels=hang, starts_at=started)
        await post(server, make_body([firing]))
        await settle(server)
        assert called(receiver) == [(1, "alice")]
        clock.now += timedelta(minutes=1)
        forged = make_alert(
            2,
            name="TrainingJobHang",
            status="resolved",
            labels=hang,
            starts_at=started + timedelta(minutes=1),
            fingerprint=f"{1:016x}",
        )
        await post(server, make_body([forged]))
        await settle(server)
        assert "resolved" not in await card_statuses(server)
        clock.now += timedelta(minutes=4)
        await settle(server)
        assert called(receiver) == [(1, "alice"), (1, "bob")], "the escalation goes on"
        real = make_alert(
            1, name="TrainingJobHang", status="resolved", labels=hang, starts_at=started
        )
        await post(server, make_body([real]))
        await settle(server)
        assert (await card_statuses(server))[-1] == "resolved"
        clock.now += timedelta(minutes=30)
        await settle(server)
        assert len(called(receiver)) == 2, "the real resolve stopped it"
    finally:
        await close_in_process(server)
