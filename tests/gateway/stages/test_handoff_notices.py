"""Handoff notices: one per shift change, with two gateways on one store (PostgreSQL: two
replicas) racing for it, and none repeated after a restart."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from tests.support.clock import Clock
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import close_in_process
from tests.support.oncall_gateway import START, start
from tests.support.receiver import Receiver
from trainsentry.alerts import Priority
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier
from trainsentry.store.schema import notifications

HANDOFF = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)  # Monday 09:00 in Berlin: alice -> carol


async def handoff_rows(server: object) -> list[dict[str, object]]:
    async with server.app[GATEWAY_KEY].engine.connect() as conn:  # type: ignore[attr-defined]
        rows = await conn.execute(
            select(notifications.c.channel, notifications.c.payload).where(
                notifications.c.kind == "handoff"
            )
        )
        return [{"channel": row.channel, **row.payload} for row in rows]


async def test_one_notice_per_handoff_across_replicas_and_restarts(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clocks = [Clock(START), Clock(START)]
    console = tmp_path / "console.jsonl"
    servers = [await start(db_url, receiver, clock, tmp_path, console=console) for clock in clocks]
    try:
        for server in servers:  # both see the schedule first before the handoff
            assert await server.app[GATEWAY_KEY].handoffs.run_once() == 0
        for clock in clocks:
            clock.now = HANDOFF + timedelta(seconds=30)
        written = await asyncio.gather(
            *(server.app[GATEWAY_KEY].handoffs.run_once() for server in servers)
        )
        assert sorted(written) == [0, 1]
        rows = await handoff_rows(servers[0])
        assert [(r["channel"], r["handoff"]["previous"], r["handoff"]["to"]) for r in rows] == [
            ("console", "alice", "carol")
        ]
        assert rows[0]["handoff"]["until"] == "2026-11-30T09:00:00+01:00"
        for server in servers:
            await server.app[GATEWAY_KEY].settle()
        lines = [json.loads(line) for line in console.read_text().splitlines()]
        assert [line["payload"]["annotations"]["summary"] for line in lines] == [
            "gpu-infra: carol (primary) takes over from alice (primary)"
            " until 2026-11-30T09:00:00+01:00"
        ]
        # a restart a minute later announces nothing again
        await close_in_process(servers.pop())
        clock = Clock(HANDOFF + timedelta(minutes=1))
        servers.append(await start(db_url, receiver, clock, tmp_path, console=console))
        assert await servers[-1].app[GATEWAY_KEY].handoffs.run_once() == 0
        assert len(await handoff_rows(servers[0])) == 1
    finally:
        for server in servers:
            await close_in_process(server)


async def test_a_handoff_missed_by_a_long_downtime_is_not_announced(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock, tmp_path)
    try:
        await server.app[GATEWAY_KEY].handoffs.run_once()
        clock.now = HANDOFF + timedelta(hours=2)
        assert await server.app[GATEWAY_KEY].handoffs.run_once() == 0
        clock.now = START.replace(day=30, hour=8, minute=5)  # the next one, on time
        assert await server.app[GATEWAY_KEY].handoffs.run_once() == 1
        assert [r["handoff"]["to"] for r in await handoff_rows(server)] == ["alice"]
    finally:
        await close_in_process(server)


async def test_the_handoff_notice_reaches_the_feishu_group(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    """Through the Feishu app channel to Feishu's contract server (which checks the card the
    way Feishu does): one card in the on-call group naming who takes over from whom."""
    async with FeishuContractServer(apps={"cli_app": "secret"}, chats={"oc_oncall"}) as feishu:
        client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
        chat = FeishuAppNotifier(client, {p: "oc_oncall" for p in Priority})
        clock = Clock(START)
        server = await start(
            db_url, receiver, clock, tmp_path, extra_notifiers={"feishu_app": chat}
        )
        try:
            await server.app[GATEWAY_KEY].handoffs.run_once()
            clock.now = HANDOFF + timedelta(seconds=30)
            written = await server.app[GATEWAY_KEY].handoffs.run_once()
            assert written == 2  # the console's and the Feishu group's
            await server.app[GATEWAY_KEY].settle()
        finally:
            await close_in_process(server)
        [message] = feishu.messages.values()
        assert (message["receive_id"], message["msg_type"]) == ("oc_oncall", "interactive")
        card = json.loads(message["content"])
        shown = json.dumps(card, ensure_ascii=False)
        assert card["header"]["title"]["content"] == "On-call handoff: gpu-infra"
        assert "carol (primary)" in shown and "alice" in shown, shown
        assert "2026-11-30T09:00:00+01:00" in shown
        assert feishu.rejections == []
