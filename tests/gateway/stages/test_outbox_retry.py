"""Dead notifications are sent again on request, audited (issue 19, finding 2): the HTTP
API of the real gateway app and the real `trainsentry outbox retry` command, on SQLite and
PostgreSQL, against a real local receiver."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from trainsentry.alerts import NotificationDraft, Priority, utcnow
from trainsentry.config import GatewaySettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.policy.outbox_retry import DeliveryRules
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store.schema import notifications
from trainsentry.store.writes import insert_notifications

TOKEN = "api-token-for-retries"
RETRY_PATH = "/api/v1/notifications/retry"


async def dead_rows(
    engine: AsyncEngine, count: int, channel: str = "pager", created: datetime | None = None
) -> list[int]:
    """`count` notifications that died (500 for longer than their give-up time)."""
    drafts = [
        NotificationDraft(
            channel=channel,
            kind="alert",
            priority=Priority.P0,
            idempotency_key=f"{channel}-{created}-{i}",
            payload={"priority": "P0", "status": "firing", "seq": i},
            group_key=f"alert:{channel}:{i}",
        )
        for i in range(count)
    ]
    async with engine.begin() as conn:
        await insert_notifications(conn, drafts, created or utcnow())
        ids = list(
            (
                await conn.execute(
                    update(notifications)
                    .where(notifications.c.status == "pending")
                    .values(status="dead", attempts=12, last_error="RetryableError: HTTP 500")
                    .returning(notifications.c.id)
                )
            ).scalars()
        )
    return sorted(ids)


async def rows(engine: AsyncEngine) -> dict[int, Any]:
    async with engine.connect() as conn:
        found = (await conn.execute(select(notifications))).all()
    return {int(r.id): r for r in found}


async def until_sent(engine: AsyncEngine, ids: list[int], within: float = 15.0) -> None:
    for _ in range(int(within / 0.05)):
        found = await rows(engine)
        if all(found[i].status == "sent" for i in ids):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not sent: {ids}")


@pytest.fixture
async def gateway(
    db_url: str, engine: AsyncEngine, receiver: Receiver
) -> AsyncIterator[TestServer]:
    settings = GatewaySettings(listen="127.0.0.1:0", db=db_url, api_token=SecretStr(TOKEN))
    app = create_app(settings, notifiers={"pager": WebhookNotifier(receiver.url)})
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await close_in_process(server)


async def post(server: TestServer, body: Any, token: str | None = TOKEN) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(server.make_url(RETRY_PATH), json=body) as response,
    ):
        return response.status, await response.json()


async def test_the_api_re_sends_dead_rows_and_records_who(
    gateway: TestServer, engine: AsyncEngine, receiver: Receiver
) -> None:
    ids = await dead_rows(engine, 3)
    # Refused without the API token, with a wrong one, and for bodies that say nothing.
    assert (await post(gateway, {"by": "mallory", "all": True}, token=None))[0] == 401
    assert (await post(gateway, {"by": "mallory", "all": True}, token="wrong"))[0] == 401
    for body in ({"by": "alice"}, {"ids": ids}, {"by": "alice", "ids": "1"}, [1], {"by": "\x00"}):
        status, answer = await post(gateway, body)
        assert status == 400 and answer["error"], body
    assert receiver.requests == 0
    assert {r.status for r in (await rows(engine)).values()} == {"dead"}

    before = utcnow()
    status, answer = await post(gateway, {"by": "alice", "ids": ids[:2]})
    assert (status, answer) == (200, {"retried": ids[:2], "by": "alice"})
    await until_sent(engine, ids[:2])
    assert receiver.unique == 2
    found = await rows(engine)
    for row_id in ids[:2]:
        assert found[row_id].status == "sent"
        assert found[row_id].retried_by == "alice"
        assert before <= found[row_id].retried_at <= utcnow()
    third = found[ids[2]]
    assert (third.status, third.retried_by, third.retried_at) == ("dead", None, None)
    # A row that is not dead is not touched: nothing matches any more but the third.
    status, answer = await post(gateway, {"by": "bob", "all": True})
    assert (status, answer["retried"]) == (200, [ids[2]])
    await until_sent(engine, ids)
    assert receiver.unique == 3 and receiver.duplicates == 0


async def test_the_api_refuses_retries_when_no_api_token_is_set(
    db_url: str, engine: AsyncEngine
) -> None:
    await dead_rows(engine, 1)
    settings = GatewaySettings(listen="127.0.0.1:0", db=db_url)
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        status, _ = await post(server, {"by": "anyone", "all": True}, token=None)
    finally:
        await close_in_process(server)
    assert status == 403
    assert {r.status for r in (await rows(engine)).values()} == {"dead"}


def run_cli(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSENTRY_")}
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "outbox", "retry", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


async def test_the_cli_re_sends_by_channel_and_time_and_records_who(
    db_url: str, engine: AsyncEngine, receiver: Receiver, tmp_path: Path
) -> None:
    old = await dead_rows(engine, 2, created=datetime.now(UTC) - timedelta(hours=5))
    recent = await dead_rows(engine, 2)
    other = await dead_rows(engine, 1, channel="feishu_bot")
    assert await asyncio.to_thread(run_cli, "--db", db_url) == (
        2,
        "",
        "trainsentry outbox retry: say which: 'ids', 'channel', 'since', or 'all': true\n",
    )
    code, out, _ = await asyncio.to_thread(
        run_cli, "--db", db_url, "--channel", "pager", "--since", "1h", "--by", "carol"
    )
    assert code == 0 and out.startswith("re-sent 2 dead notification(s) by carol: ")
    found = await rows(engine)
    assert [found[i].status for i in old + recent + other] == [
        "dead",
        "dead",
        "pending",
        "pending",
        "dead",
    ]
    assert {found[i].retried_by for i in recent} == {"carol"}
    # the gateway's outbox sends them again
    outbox = Outbox(
        engine,
        {"pager": WebhookNotifier(receiver.url)},
        rules=DeliveryRules(give_up_after=dict.fromkeys(Priority, 1.0)),
    )
    try:
        await outbox.drain()
    finally:
        await outbox.aclose()
    assert receiver.unique == 2
    assert [(await rows(engine))[i].status for i in recent] == ["sent", "sent"]
    # nothing dead matches any more on that channel since then: exit 3
    code, out, _ = await asyncio.to_thread(
        run_cli, "--db", db_url, "--channel", "pager", "--since", "1h"
    )
    assert (code, out) == (3, "no dead notification matched\n")
    code, out, _ = await asyncio.to_thread(run_cli, "--db", db_url, "--id", str(other[0]))
    assert code == 0 and (await rows(engine))[other[0]].retried_by.endswith("(cli)")
