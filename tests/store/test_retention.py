"""Retention (issue 19, finding 8) on SQLite and the real PostgreSQL: finished rows older than
their retention are deleted, unfinished ones never, in bounded batches, and two purgers on one
PostgreSQL take disjoint rows."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.config import RetentionSettings
from trainsentry.gateway.metrics import GatewayMetrics
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.services.retention import Retention
from trainsentry.store import create_engine
from trainsentry.store.retention import (
    batch_transaction,
    next_by_time,
    old_callback_events,
    old_receipts,
    purge_alerts,
    purge_receipts,
)
from trainsentry.store.schema import (
    alert_events,
    alerts,
    callback_events,
    maintenance_mutes,
    notifications,
    policy_inbox,
    webhook_receipts,
)
from trainsentry.store.writes import insert_notifications, record_receipts

OLD = BASE_TIME  # everything "old" happened then
NOW = BASE_TIME + timedelta(days=120)  # the purge runs then: 120 days later
RECENT = NOW - timedelta(days=3)
SETTINGS = RetentionSettings(receipts_days=7, alerts_days=90, notifications_days=90)


async def store(engine: AsyncEngine, alert_dicts: list[dict[str, Any]], at: Any, n: int = 0) -> int:
    """Stores one webhook (received at `at`) and plans its changes (empties the inbox of
    them); returns the receipt id."""
    body = make_body(alert_dicts, group_key=f"g{n}")
    receipt = parse_webhook(encode(body), received_at=at)
    async with engine.begin() as conn:
        (outcome,) = await record_receipts(conn, [receipt])
        await conn.execute(delete(policy_inbox))
    return outcome.receipt_id


async def alert_id(engine: AsyncEngine, fingerprint: str) -> int | None:
    async with engine.connect() as conn:
        value = (
            await conn.execute(select(alerts.c.id).where(alerts.c.fingerprint == fingerprint))
        ).scalar()
    return None if value is None else int(value)


async def notify(
    engine: AsyncEngine, key: str, at: Any, status: str, alert: int | None = None
) -> None:
    draft = NotificationDraft(
        channel="console",
        kind="alert",
        priority=Priority.P2,
        idempotency_key=key,
        payload={"k": key},
        group_key=key,
        alert_id=alert,
    )
    async with engine.begin() as conn:
        await insert_notifications(conn, [draft], at)
        mine = notifications.c.idempotency_key == key
        await conn.execute(update(notifications).where(mine).values(status=status))


async def keys(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set((await conn.execute(select(notifications.c.idempotency_key))).scalars())


async def count(engine: AsyncEngine, table: Any, *where: Any) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(table)
        for clause in where:
            query = query.where(clause)
        return int((await conn.execute(query)).scalar_one())


def fp(n: int) -> str:
    return f"{n:016x}"


async def test_old_finished_rows_go_and_unfinished_or_recent_ones_stay(engine: AsyncEngine) -> None:
    # 1: resolved long ago -> goes, with its events and finished notifications
    # 2: still firing (old)  3: resolved, a pending notification  4: resolved, event unplanned
    # 5: resolved recently   6: resolved long ago but acknowledged recently
    old_receipt = await store(engine, [make_alert(i) for i in range(1, 7)], OLD, 1)
    await store(
        engine,
        [make_alert(i, status="resolved") for i in (1, 3, 4, 6)],
        OLD + timedelta(hours=1),
        2,
    )
    await store(engine, [make_alert(5, status="resolved")], RECENT, 3)
    recent_receipt = await store(engine, [make_alert(9)], RECENT, 9)
    # alert 4's resolution is stored but the policy has not handled it yet
    body = make_body([make_alert(4, status="resolved", fingerprint=fp(4))], group_key="g4")
    async with engine.begin() as conn:
        await conn.execute(
            update(alerts).where(alerts.c.fingerprint == fp(4)).values(status="firing")
        )
        await record_receipts(
            conn, [parse_webhook(encode(body), received_at=OLD + timedelta(hours=2))]
        )
        await conn.execute(
            update(alerts)
            .where(alerts.c.fingerprint == fp(6))
            .values(acked_at=RECENT, acked_by="alice")
        )
    ids = {n: await alert_id(engine, fp(n)) for n in range(1, 7)}
    await notify(engine, "a1-sent", OLD, "sent", ids[1])
    await notify(engine, "a1-dead", OLD, "dead", ids[1])
    await notify(engine, "a3-pending", OLD, "pending", ids[3])
    await notify(engine, "a3-sent", OLD, "sent", ids[3])
    # notifications of no alert
    for status in ("sent", "dead", "cancelled", "pending", "sending"):
        await notify(engine, f"old-{status}", OLD, status)
    await notify(engine, "recent-sent", RECENT, "sent")
    async with engine.begin() as conn:
        await conn.execute(
            callback_events.insert(),
            [
                {"event_id": "old-callback", "received_at": NOW - timedelta(days=2)},
                {"event_id": "new-callback", "received_at": NOW - timedelta(hours=1)},
            ],
        )

    done = await Retention(engine, SETTINGS, metrics=GatewayMetrics()).purge(NOW)

    left = {n for n in range(1, 7) if await alert_id(engine, fp(n)) is not None}
    assert left == {2, 3, 4, 5, 6}
    assert await count(engine, alert_events, alert_events.c.alert_id == ids[1]) == 0
    assert await count(engine, alert_events, alert_events.c.alert_id == ids[4]) == 3
    assert await count(engine, policy_inbox) == 1  # alert 4's, untouched
    # alert 3 stays; its sent notification is old enough to go by itself
    assert await keys(engine) == {"a3-pending", "old-pending", "old-sending", "recent-sent"}
    async with engine.connect() as conn:
        receipts = set((await conn.execute(select(webhook_receipts.c.id))).scalars())
        references = (
            await conn.execute(select(func.count()).where(alerts.c.first_receipt_id.is_not(None)))
        ).scalar_one()
        events_without_receipt = (
            await conn.execute(
                select(func.count()).where(
                    alert_events.c.receipt_id.is_(None), alert_events.c.alert_id == ids[2]
                )
            )
        ).scalar_one()
        callbacks = set((await conn.execute(select(callback_events.c.event_id))).scalars())
    assert old_receipt not in receipts and recent_receipt in receipts
    assert len(receipts) == 2  # the recent resolution of 5 and alert 9's
    assert references == 1  # alert 9's; the others named the deleted first receipt
    assert events_without_receipt == 1  # alert 2 kept its event, without the old receipt
    assert callbacks == {"new-callback"}
    # a1's two with their alert, then a3-sent and the three finished ones of no alert
    assert done.alerts == 1 and done.alert_events == 2 and done.notifications == 2 + 4
    assert done.receipts == 3 and done.callback_events == 1


async def test_a_batch_deletes_at_most_its_limit_and_the_stage_purges_everything(
    engine: AsyncEngine,
) -> None:
    await store(engine, [make_alert(i, status="resolved") for i in range(10)], OLD)
    async with batch_transaction(engine) as conn:
        first = await purge_alerts(conn, NOW - timedelta(days=90), 3)
        receipts = await purge_receipts(conn, NOW - timedelta(days=7), 3)
    assert first.examined == 3 and first.purged.alerts == 3 and first.purged.alert_events == 3
    assert receipts.purged.receipts == 1
    assert await count(engine, alerts) == 7
    metrics = GatewayMetrics()
    settings = SETTINGS.model_copy(update={"batch_size": 3, "pause_seconds": 0})
    done = await Retention(engine, settings, metrics=metrics).purge(NOW)
    assert done.alerts == 7 and await count(engine, alerts) == 0
    assert metrics.purged.labels("alerts")._value.get() == 7


async def test_old_rows_that_stay_do_not_stop_the_purge_behind_them(engine: AsyncEngine) -> None:
    """The oldest alerts still fire: a batch looks at them (at most its limit), deletes
    nothing, and the next batch goes on after them to the finished ones."""
    firing = [make_alert(i, starts_at=OLD - timedelta(hours=1)) for i in range(4)]
    await store(engine, firing, OLD - timedelta(hours=1), 1)
    await store(engine, [make_alert(i, status="resolved") for i in range(4, 9)], OLD, 2)
    cut = NOW - timedelta(days=90)
    async with batch_transaction(engine) as conn:
        first = await purge_alerts(conn, cut, 3)
    assert (first.examined, first.purged.alerts) == (3, 0)
    async with batch_transaction(engine) as conn:
        second = await purge_alerts(conn, cut, 3, first.after)
    assert (second.examined, second.purged.alerts) == (3, 2)  # the last firing one, then two
    settings = SETTINGS.model_copy(update={"batch_size": 3, "pause_seconds": 0})
    done = await Retention(engine, settings, metrics=GatewayMetrics()).purge(NOW)
    assert done.alerts == 3
    assert {n for n in range(9) if await alert_id(engine, fp(n)) is not None} == {0, 1, 2, 3}


async def test_retention_disabled_deletes_nothing(engine: AsyncEngine) -> None:
    await store(engine, [make_alert(i, status="resolved") for i in range(3)], OLD)
    settings = SETTINGS.model_copy(update={"enabled": False})
    await Retention(engine, settings, metrics=GatewayMetrics()).run_once(NOW)
    assert await count(engine, alerts) == 3


def test_retention_below_what_the_weekly_report_reads_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="alerts_days"):
        RetentionSettings(alerts_days=14)
    with pytest.raises(ValueError, match="notifications_days"):
        RetentionSettings(notifications_days=7)
    with pytest.raises(ValueError, match="batch_size"):
        RetentionSettings(batch_size=0)


async def test_two_purgers_on_one_postgresql_take_disjoint_rows(db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("replicas share a store only on PostgreSQL")
    from trainsentry.store import migrate

    engines = [create_engine(db_url), create_engine(db_url)]
    try:
        await migrate(engines[0])
        for n in range(6):
            await store(
                engines[0], [make_alert(n * 50 + i, status="resolved") for i in range(50)], OLD, n
            )
        settings = SETTINGS.model_copy(update={"batch_size": 7, "pause_seconds": 0})
        results = await asyncio.gather(
            *(Retention(e, settings, metrics=GatewayMetrics()).purge(NOW) for e in engines)
        )
        assert sum(r.alerts for r in results) == 300
        assert sum(r.alert_events for r in results) == 300
        assert sum(r.receipts for r in results) == 6
        assert await count(engines[0], alerts) == 0
    finally:
        for e in engines:
            await e.dispose()


async def test_an_alert_another_transaction_holds_is_left_for_the_next_round(
    db_url: str,
) -> None:
    """On PostgreSQL the intake locks the alerts it changes (FOR UPDATE): the purge neither
    waits for such a row nor deletes it under the intake's feet; it takes the others."""
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers: a batch takes the write lock first")
    from trainsentry.store import migrate

    engine = create_engine(db_url)
    try:
        await migrate(engine)
        await store(engine, [make_alert(i, status="resolved") for i in range(5)], OLD)
        held = await alert_id(engine, fp(2))
        async with engine.connect() as intake:
            await intake.execute(select(alerts.c.id).where(alerts.c.id == held).with_for_update())
            async with asyncio.timeout(5), batch_transaction(engine) as conn:
                done = await purge_alerts(conn, NOW - timedelta(days=90), 100)
            assert done.purged.alerts == 4
            await intake.rollback()
        assert await alert_id(engine, fp(2)) == held
        async with batch_transaction(engine) as conn:
            assert (await purge_alerts(conn, NOW - timedelta(days=90), 100)).purged.alerts == 1
    finally:
        await engine.dispose()


AFTER = (BASE_TIME, 12)  # a cursor: the next batch of a run starts after this row


@pytest.mark.parametrize(
    ("build", "index"),
    [
        (lambda: next_by_time(alerts, alerts.c.created_at, NOW, None, 500), "ix_alerts_created"),
        (lambda: next_by_time(alerts, alerts.c.created_at, NOW, AFTER, 500), "ix_alerts_created"),
        (
            lambda: next_by_time(notifications, notifications.c.created_at, NOW, AFTER, 500),
            "ix_notifications_created",
        ),
        (lambda: old_receipts(NOW, 500), "ix_webhook_receipts_last_received"),
        (lambda: old_callback_events(NOW, 500), "ix_callback_events_received"),
    ],
    ids=["alerts", "alerts-after", "notifications-after", "receipts", "callback-events"],
)
async def test_a_batch_reads_only_old_rows_through_a_time_index_on_sqlite(
    build: Any, index: str, tmp_path: Path
) -> None:
    """A SQLite batch holds the write lock: it must find its rows as a range of a time index,
    in the index's order, never by reading every old row and sorting them."""
    path = tmp_path / "plan.db"
    engine = create_engine(f"sqlite:///{path}")
    try:
        from trainsentry.store import migrate

        await migrate(engine)
    finally:
        await engine.dispose()
    compiled = build().compile(
        dialect=sqlite_dialect(), compile_kwargs={"render_postcompile": True}
    )
    params: list[Any] = []
    for value in compiled.construct_params().values():
        if isinstance(value, datetime):
            value = value.replace(tzinfo=None).isoformat(sep=" ")
        params.extend(value if isinstance(value, list | tuple) else [value])
    with closing(sqlite3.connect(path)) as db:
        plan = [row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {compiled}", params)]
    assert plan[0].startswith("SEARCH") and f"INDEX {index} (" in plan[0], plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


async def test_an_alert_a_maintenance_window_still_holds_stays(engine: AsyncEngine) -> None:
    """A window that muted an alert owes its notices until the window ends: the alert stays
    while the mute is open; a closed mute goes with its alert."""
    await store(engine, [make_alert(i, status="resolved") for i in (1, 2)], OLD)
    rows = [
        {
            "alert_id": await alert_id(engine, fp(n)),
            "window_id": "w1",
            "muted_at": OLD,
            "until": OLD + timedelta(days=1),
            "state": state,
            "closed_at": None if state == "muted" else OLD,
            "drafts": [],
        }
        for n, state in ((1, "muted"), (2, "resolved"))
    ]
    async with engine.begin() as conn:
        await conn.execute(maintenance_mutes.insert(), rows)
    done = await Retention(engine, SETTINGS, metrics=GatewayMetrics()).purge(NOW)
    assert done.alerts == 1
    assert await alert_id(engine, fp(1)) is not None and await alert_id(engine, fp(2)) is None
    assert await count(engine, maintenance_mutes) == 1
