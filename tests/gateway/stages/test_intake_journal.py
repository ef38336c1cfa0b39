"""Journal-first intake (docs/gateway.md "Journal-first intake"), on SQLite and the real
PostgreSQL: a webhook answered under load is on disk as its receipt and a journal row, its
P0/P1 alerts recorded before the answer; the expander records the rest from the stored
receipt, once, in the order the group's webhooks came, also after a restart."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.gateway_process import close_in_process
from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.expansion import Expander
from trainsentry.gateway.stages.intake import IntakeWriter, parse_webhook
from trainsentry.store.errors import StoreUnavailable
from trainsentry.store.inbox import claim_inbox
from trainsentry.store.journal import journal_receipts
from trainsentry.store.retention import purge_receipts
from trainsentry.store.schema import alert_events, alerts, intake_journal, webhook_receipts
from trainsentry.store.writes import IncomingReceipt, record_receipts

GROUP = '{}:{alertname="GPUXidError", trainingjob="llama-70b"}'


def body(alert_dicts: list[dict[str, Any]], group_key: str = GROUP) -> bytes:
    return encode(make_body(alert_dicts, group_key=group_key))


def receipt(raw: bytes, offset_s: int = 0) -> IncomingReceipt:
    return parse_webhook(raw, received_at=BASE_TIME + timedelta(seconds=offset_s))


def parse(text: str) -> list[Any]:
    return parse_webhook(text.encode()).alerts


async def count(engine: AsyncEngine, table: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def statuses(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(select(alerts.c.fingerprint, alerts.c.status))
        return {row.fingerprint: row.status for row in rows}


def p(priority: str, index: int, **kwargs: Any) -> dict[str, Any]:
    return make_alert(index, labels={"priority": priority}, **kwargs)


async def test_a_journaled_webhook_is_recorded_from_its_stored_receipt_once(
    engine: AsyncEngine,
) -> None:
    """What a restart finds: the receipt and its journal row. A fresh expander (nothing in
    memory) records the alerts from the stored body; a replay journaled again adds nothing."""
    raw = body([p("P0", 1), p("P1", 2), p("P2", 3), make_alert(4), p("P3", 5)])
    async with engine.begin() as conn:
        (outcome,) = await journal_receipts(conn, [receipt(raw)])
    # P0 and P1 recorded before the answer; P2, P3 and the unlabelled one wait
    assert (outcome.new, outcome.queued) == (2, 3)
    assert sorted(await statuses(engine)) == [f"{1:016x}", f"{2:016x}"]
    assert await count(engine, intake_journal) == 1

    expander = Expander(engine, parse)  # a restarted gateway's: no parsed alerts in memory
    assert await expander.drain() == 3
    assert len(await statuses(engine)) == 5
    assert (await count(engine, intake_journal), await count(engine, alert_events)) == (0, 5)

    async with engine.begin() as conn:  # Alertmanager re-sends it (a replay)
        (again,) = await journal_receipts(conn, [receipt(raw, 30)])
    assert (again.times_received, again.new, again.unchanged, again.queued) == (2, 0, 2, 3)
    assert await expander.drain() == 3
    assert (await count(engine, alerts), await count(engine, alert_events)) == (5, 5)


async def writer_and_expander(
    engine: AsyncEngine, at_once: int = 0, **expander: Any
) -> tuple[IntakeWriter, Expander]:
    """A writer that journals every webhook (`at_once` 0) while its expander is enabled."""
    exp = Expander(engine, parse, **expander)
    writer = IntakeWriter(engine, expander=exp, record_at_once_alerts=at_once)
    writer.start()  # the expander is not started: the tests drain it when they choose
    return writer, exp


async def test_a_groups_webhooks_keep_their_order_when_one_would_be_recorded_at_once(
    engine: AsyncEngine,
) -> None:
    """The group's firing webhook is journaled; its resolve comes while the gateway thinks
    itself idle: it must not overtake the firing one (it is journaled behind it)."""
    writer, expander = await writer_and_expander(engine, at_once=200)
    try:
        expander.backlog = 1  # busy: the firing webhook is journaled
        firing = await writer.submit(receipt(body([make_alert(7)])))
        assert firing.queued == 1
        expander.backlog = 0  # idle as far as this process knows (another replica's row)
        resolved = await writer.submit(receipt(body([make_alert(7, status="resolved")]), 10))
        assert resolved.queued == 1, "journaled behind the group's waiting webhook"
        await expander.drain()
    finally:
        await writer.stop()
    assert await statuses(engine) == {f"{7:016x}": "resolved"}
    async with engine.connect() as conn:
        kinds = (await conn.execute(select(alert_events.c.kind).order_by(alert_events.c.id))).all()
    assert [kind for (kind,) in kinds] == ["firing", "resolved"]


async def test_a_p0_behind_a_journaled_storm_is_in_the_inbox_when_answered(
    engine: AsyncEngine,
) -> None:
    writer, expander = await writer_and_expander(engine)
    try:
        storm = [make_alert(i, labels={"priority": "P2"}) for i in range(200)]
        (stored,) = [await writer.submit(receipt(body(storm)))]
        assert (stored.new, stored.queued) == (0, 200)
        hang = make_alert(999, name="TrainingJobHang", labels={"priority": "P0"})
        answer = await writer.submit(receipt(body([hang], group_key="{}:hang"), 1))
        assert (answer.new, answer.queued) == (1, 0)
        async with engine.begin() as conn:
            claimed = await claim_inbox(conn, 250)
        assert [c.alert.name for c in claimed.changes] == ["TrainingJobHang"]
        assert expander.backlog == 200
        assert await expander.drain() == 200
        assert await count(engine, alerts) == 201
    finally:
        await writer.stop()


async def test_a_full_journal_holds_webhooks_without_urgent_alerts_then_answers_503(
    engine: AsyncEngine,
) -> None:
    writer, expander = await writer_and_expander(engine, max_backlog=50, room_wait_s=0.3)
    try:
        assert (await writer.submit(receipt(body([make_alert(i) for i in range(50)])))).queued
        more = receipt(body([make_alert(60)], group_key="{}:other"), 1)
        with pytest.raises(StoreUnavailable, match="intake journal full"):
            await writer.submit(more)
        # a P1 is never held: it is recorded before its answer
        urgent = await writer.submit(receipt(body([p("P1", 70)], group_key="{}:p1"), 2))
        assert (urgent.new, urgent.queued) == (1, 0)
        # room made while it waits: it goes in
        waiting = asyncio.ensure_future(writer.submit(more))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await expander.run_once()
        assert (await asyncio.wait_for(waiting, 5)).queued == 1
    finally:
        await writer.stop()


async def test_a_resend_of_an_older_body_behind_a_journaled_change_is_recorded(
    engine: AsyncEngine,
) -> None:
    """Body B (alert firing) recorded; body C of the group (it resolved) journaled; B sent
    again: not an unchanged resend (the group's digest is C's from the moment C is stored),
    so it is journaled behind C and the alert ends firing, as Alertmanager last said."""
    writer, expander = await writer_and_expander(engine)
    b = body([make_alert(3)])
    c = body([make_alert(3, status="resolved")])
    try:
        async with engine.begin() as conn:
            await record_receipts(conn, [receipt(b)])
        assert (await writer.submit(receipt(c, 10))).queued == 1
        again = await writer.submit(receipt(b, 20))
        assert (again.resend, again.queued) == (False, 1)
        await expander.drain()
    finally:
        await writer.stop()
    assert await statuses(engine) == {f"{3:016x}": "firing"}


async def test_the_retention_keeps_a_receipt_the_journal_waits_for(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await journal_receipts(conn, [receipt(body([make_alert(1)]))])
        await record_receipts(conn, [receipt(body([make_alert(2)], group_key="{}:b"))])
    async with engine.begin() as conn:
        purged = await purge_receipts(conn, BASE_TIME + timedelta(days=30), 100)
    assert purged.purged.receipts == 1
    assert await count(engine, webhook_receipts) == 1
    assert await Expander(engine, parse).drain() == 1
    assert f"{1:016x}" in await statuses(engine)


async def test_the_answer_and_metrics_say_what_waits_in_the_journal(
    db_url: str, tmp_path: Path
) -> None:
    """Over HTTP: a journaled webhook's 200 counts its waiting alerts in `queued` (its P0
    counted as new), /metrics shows them in the journal until they are recorded."""
    settings = GatewaySettings(
        listen="127.0.0.1:0", db=db_url, console_file=tmp_path / "console.jsonl"
    )
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        expander = server.app[GATEWAY_KEY].expander
        assert expander is not None
        await expander.stop()  # held, so the journal keeps what the webhook left
        expander.backlog = 1  # busy: the intake journals
        raw = body([p("P0", 1), p("P2", 2), p("P3", 3)])
        async with aiohttp.ClientSession() as http:
            async with http.post(server.make_url(WEBHOOK_PATH), data=raw) as response:
                assert response.status == 200
                answer = await response.json()
            assert (answer["alerts"], answer["new"], answer["queued"]) == (3, 1, 2)

            async def metrics() -> str:
                async with http.get(server.make_url("/metrics")) as response:
                    return await response.text()

            text = await metrics()
            assert "trainsentry_intake_journal_depth 2.0" in text.splitlines()
            assert await expander.drain() == 2
            text = await metrics()
            assert "trainsentry_intake_journal_depth 0.0" in text.splitlines()
            assert "trainsentry_intake_journal_oldest_age_seconds 0.0" in text.splitlines()
    finally:
        await close_in_process(server)
