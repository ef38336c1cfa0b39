"""People and teams, for the Feishu card buttons and the notifications API (issue 43 finding
9, what was left): through a real gateway over loopback HTTP, a signed card callback (the
Feishu contract server's encryption and signature) and the trusted proxy's headers.

Two teams on one cluster, as in test_people_teams.py: team-a's P0 in namespace team-a,
team-b's in team-b. Who presses a card's button is the open_id Feishu signs: ann (ou_ann)
presses for team-a, bo (ou_bo) for team-b, sam (ou_sam) for every team (`admin_feishu`).
Each refusal failed before: the press acknowledged, the list and the re-send answered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr
from sqlalchemy import select, update

from tests.gateway.test_people_teams import API, TOKEN, job_p0, person
from tests.gateway.ui.helpers import post_alerts
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import close_in_process
from trainsentry.config import (
    AccessSettings,
    ConsoleSettings,
    GatewaySettings,
    Settings,
    TeamSettings,
)
from trainsentry.gateway.api.app import CardCallbackSettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.sections import oncall_of
from trainsentry.store.schema import alerts, notifications

VERIFY = "verify-token"
ENCRYPT_KEY = "encrypt-key"
CALLBACK = CardCallbackSettings("/api/v1/feishu/card", VERIFY, ENCRYPT_KEY)
ACCESS = AccessSettings(
    teams={
        "team-a": TeamSettings(namespaces=("team-a",), feishu=("ann",)),
        "team-b": TeamSettings(namespaces=("team-b",), groups=("b-oncall",), feishu=("ou_bo",)),
    },
    admin_groups=("sre",),
    admin_feishu=("sam",),
)


def people() -> Any:
    """An `oncall:` section naming ann and sam with their open_ids (bo is an open_id only)."""
    start = (datetime.now(UTC) - timedelta(days=1)).replace(tzinfo=None).isoformat()
    layer = {"name": "primary", "start": start, "shift": "1d", "members": ["ann"]}
    section = {
        "people": {"ann": {"feishu_open_id": "ou_ann"}, "sam": {"feishu_open_id": "ou_sam"}},
        "schedules": {"gpu": {"timezone": "UTC", "layers": [layer]}},
    }
    return oncall_of(Settings(gateway=GatewaySettings(), oncall=section))


@pytest.fixture
async def gateway(db_url: str) -> AsyncIterator[TestServer]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        webhook_token=SecretStr(TOKEN),
        api_token=SecretStr(TOKEN),
        console=ConsoleSettings(trusted_proxies=["127.0.0.0/8"]),
        access=ACCESS,
    )
    app = create_app(settings, card_callback=CALLBACK, oncall=people(), tick_interval=3600)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        await post_alerts(server, [job_p0(1, "team-a"), job_p0(2, "team-b")], TOKEN)
        await server.app[GATEWAY_KEY].settle()
        yield server
    finally:
        await close_in_process(server)


async def alert_of(server: TestServer, namespace: str) -> int:
    async with server.app[GATEWAY_KEY].engine.connect() as conn:
        query = select(alerts.c.id).where(alerts.c.job_namespace == namespace)
        return int((await conn.execute(query)).scalar_one())


async def press(server: TestServer, alert_id: int, open_id: str, event: str) -> dict[str, Any]:
    """Acknowledge pressed on the alert's card by `open_id`, as Feishu signs it."""
    body = {
        "schema": "2.0",
        "header": {"event_id": event, "token": VERIFY, "event_type": "card.action.trigger"},
        "event": {
            "operator": {"open_id": open_id},
            "action": {"value": {"action": "ack", "alert_id": alert_id}, "tag": "button"},
            "context": {"open_message_id": "om_1"},
        },
    }
    headers, raw = FeishuContractServer.callback_request(body, encrypt_key=ENCRYPT_KEY)
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url(CALLBACK.path), data=raw, headers=headers) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())


async def acked_by(server: TestServer, alert_id: int) -> str | None:
    async with aiohttp.ClientSession(headers=API) as session:
        async with session.get(server.make_url(f"/api/v1/alerts/{alert_id}")) as r:
            return (await r.json())["acked_by"]  # type: ignore[no-any-return]


async def call(
    server: TestServer, method: str, path: str, headers: dict[str, str], **kwargs: Any
) -> tuple[int, Any]:
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.request(method, server.make_url(path), **kwargs) as r:
            return r.status, await r.json()


async def test_a_card_button_acts_only_for_the_pressers_teams(gateway: TestServer) -> None:
    a, b = await alert_of(gateway, "team-a"), await alert_of(gateway, "team-b")
    # ann (team-a) presses Acknowledge on team-b's card: refused, with the reason
    answer = await press(gateway, b, "ou_ann", "ev-1")
    assert answer["toast"]["type"] == "error", answer
    reason = answer["toast"]["content"]
    assert "ann may not act on" in reason and "team-b" in reason and "team-a" in reason, reason
    assert "card" not in answer and await acked_by(gateway, b) is None
    # someone no team lists: refused too
    answer = await press(gateway, a, "ou_stranger", "ev-2")
    assert answer["toast"]["type"] == "error" and "no team's feishu list names you" in str(answer)
    assert await acked_by(gateway, a) is None
    # bo (listed by open_id) on team-b's: acknowledged
    answer = await press(gateway, b, "ou_bo", "ev-3")
    assert answer["toast"]["type"] == "success", answer
    assert await acked_by(gateway, b) == "ou_bo"
    # sam (admin_feishu) on team-a's: acknowledged, by his name
    answer = await press(gateway, a, "ou_sam", "ev-4")
    assert answer["toast"]["type"] == "success", answer
    assert await acked_by(gateway, a) == "sam"


async def test_the_notifications_list_answers_a_person_for_their_teams_only(
    gateway: TestServer,
) -> None:
    a, b = await alert_of(gateway, "team-a"), await alert_of(gateway, "team-b")
    ann = person("ann", "team-a")
    status, body = await call(gateway, "GET", f"/api/v1/notifications?alert_id={b}", ann)
    assert status == 403 and "ann may not act on" in body["error"] and "team-b" in body["error"]
    status, body = await call(gateway, "GET", "/api/v1/notifications", ann)
    assert status == 403 and "every team's notifications" in body["error"], body
    status, body = await call(gateway, "GET", f"/api/v1/notifications?alert_id={a}", ann)
    assert status == 200 and body["items"] and {n["alert_id"] for n in body["items"]} == {a}
    status, body = await call(gateway, "GET", "/api/v1/notifications", person("sue", "sre"))
    assert status == 200 and {n["alert_id"] for n in body["items"]} >= {a, b}
    status, _ = await call(gateway, "GET", "/api/v1/notifications", {})
    assert status == 401


async def dead(server: TestServer) -> dict[int, tuple[int, str]]:
    """Every notification made dead (a channel gave up); id -> (alert id, status)."""
    engine = server.app[GATEWAY_KEY].engine
    async with engine.begin() as conn:
        await conn.execute(update(notifications).values(status="dead"))
    return await statuses(server)


async def statuses(server: TestServer) -> dict[int, tuple[int, str]]:
    async with server.app[GATEWAY_KEY].engine.connect() as conn:
        query = select(notifications.c.id, notifications.c.alert_id, notifications.c.status)
        return {row.id: (row.alert_id, row.status) for row in (await conn.execute(query)).all()}


async def test_a_person_resends_only_their_teams_dead_notifications(gateway: TestServer) -> None:
    a, b = await alert_of(gateway, "team-a"), await alert_of(gateway, "team-b")
    rows = await dead(gateway)
    of_a = [n for n, (alert_id, _) in rows.items() if alert_id == a]
    of_b = [n for n, (alert_id, _) in rows.items() if alert_id == b]
    assert of_a and of_b
    ann = {**person("ann", "team-a"), "Content-Type": "application/json"}
    path = "/api/v1/notifications/retry"
    status, body = await call(gateway, "POST", path, ann, json={"ids": of_b})
    assert status == 403 and "ann may not act on notifications" in body["error"], body
    status, body = await call(gateway, "POST", path, ann, json={"ids": [*of_a, of_b[0]]})
    assert status == 403, "one of team-b's among them: refused whole"
    status, body = await call(gateway, "POST", path, ann, json={"all": True})
    assert status == 403 and "every team's dead notifications" in body["error"], body
    assert {s for _, s in (await statuses(gateway)).values()} == {"dead"}, "nothing re-sent"
    status, body = await call(gateway, "POST", path, ann, json={"ids": of_a, "by": "bo"})
    assert status == 200 and sorted(body["retried"]) == sorted(of_a), body
    assert body["by"] == "ann (signed in through the proxy)", "the proxy's name, not `by`"
    after = await statuses(gateway)
    assert all(after[n][1] != "dead" for n in of_a) and all(after[n][1] == "dead" for n in of_b)
    sue = {**person("sue", "sre"), "Content-Type": "application/json"}
    status, body = await call(gateway, "POST", path, sue, json={"all": True})
    assert status == 200 and sorted(body["retried"]) == sorted(of_b), body
    # the platform's API token re-sends any, as before
    status, _ = await call(gateway, "POST", path, API, json={"all": True, "by": "ops"})
    assert status == 200
