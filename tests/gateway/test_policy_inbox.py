"""The policy inbox and the driver-level bulk writes, on SQLite and the real PostgreSQL.

The intake stores changes and queues them; the policy worker plans each exactly once, also
when a batch fails or the process restarts in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from webhook_factory import BASE_TIME, encode, make_alert, make_body

from trainsentry.alerts import AlertChange, AlertStatus, ChangeKind
from trainsentry.gateway.intake import parse_webhook
from trainsentry.gateway.policy import load_policy
from trainsentry.gateway.policy_plan import PolicyPlan
from trainsentry.gateway.policy_worker import PolicyWorker
from trainsentry.store import create_engine, migrate
from trainsentry.store.inbox import inbox_depth
from trainsentry.store.policy_state import claim_due, load_states, save_states
from trainsentry.store.schema import (
    SCHEMA_VERSION,
    alerts,
    metadata,
    notifications,
    policy_inbox,
    schema_version,
)
from trainsentry.store.writes import record_receipts


async def intake(engine: AsyncEngine, alert_dicts: list[dict[str, object]], at_s: int = 0) -> None:
    receipt = parse_webhook(
        encode(make_body(alert_dicts)), received_at=BASE_TIME + timedelta(seconds=at_s)
    )
    async with engine.begin() as conn:
        await record_receipts(conn, [receipt])


async def count(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(table)  # type: ignore[arg-type]
        return int((await conn.execute(query)).scalar_one())


def console_plan() -> PolicyPlan:
    return PolicyPlan(load_policy(), channels=("console",))


async def test_changes_wait_in_the_inbox_until_planned_once(engine: AsyncEngine) -> None:
    await intake(engine, [make_alert(i) for i in range(3)])
    assert await count(engine, policy_inbox) == 3
    assert await count(engine, notifications) == 0, "the intake itself writes no notifications"

    worker = PolicyWorker(engine, console_plan(), clock=lambda: BASE_TIME)
    assert await worker.drain() == 3
    assert await count(engine, policy_inbox) == 0
    sent = await count(engine, notifications)
    assert sent == 3
    async with engine.connect() as conn:
        priorities = (await conn.execute(select(alerts.c.priority))).scalars().all()
    assert all(priorities), "the policy records each alert's priority"

    # a restarted worker (a new process) finds nothing left to plan
    assert await PolicyWorker(engine, console_plan()).drain() == 0
    assert await count(engine, notifications) == sent


async def test_a_failed_policy_batch_leaves_its_changes_for_the_next_try(
    engine: AsyncEngine,
) -> None:
    await intake(engine, [make_alert(1), make_alert(2)])
    real = console_plan()

    async def failing(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        await real(conn, changes, now)  # writes outbox rows, then the batch fails
        raise RuntimeError("policy crashed mid-batch")

    with pytest.raises(RuntimeError):
        await PolicyWorker(engine, failing).run_once()
    assert await count(engine, notifications) == 0, "the failed batch's rows rolled back"
    assert await count(engine, policy_inbox) == 2

    assert await PolicyWorker(engine, real, clock=lambda: BASE_TIME).drain() == 2
    assert await count(engine, notifications) == 2


async def test_claimed_changes_keep_their_order_kind_and_status(engine: AsyncEngine) -> None:
    await intake(engine, [make_alert(1)], at_s=0)
    await intake(engine, [make_alert(1, status="resolved")], at_s=60)
    seen: list[AlertChange] = []

    async def record(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        seen.extend(changes)
        return 0

    assert await PolicyWorker(engine, record, batch=1).drain() == 2
    assert [c.kind for c in seen] == [ChangeKind.FIRING, ChangeKind.RESOLVED]
    assert [c.alert.status for c in seen] == [AlertStatus.FIRING, AlertStatus.RESOLVED]
    assert seen[0].alert_id == seen[1].alert_id
    assert [c.at for c in seen] == [BASE_TIME, BASE_TIME + timedelta(seconds=60)]
    assert seen[0].alert.labels["node"] == "gpu-0001"
    assert seen[0].alert.starts_at.tzinfo is not None


async def test_bulk_times_compare_with_core_bound_times(engine: AsyncEngine) -> None:
    # save_states writes through the driver; claim_due compares through SQLAlchemy Core.
    # On SQLite both are text, so the formats must agree to the microsecond.
    due = datetime(2026, 3, 1, 12, 0, 0, 500, tzinfo=UTC)
    east = timezone(timedelta(hours=8))
    async with engine.begin() as conn:
        await save_states(conn, "test", {"a": ({"n": 1}, due.astimezone(east))}, BASE_TIME)
        await save_states(conn, "test", {"b": ({"n": 2}, due + timedelta(microseconds=1))}, due)
    async with engine.begin() as conn:
        assert set(await claim_due(conn, "test", due - timedelta(microseconds=1))) == set()
        assert set(await claim_due(conn, "test", due)) == {"a"}
        assert set(await claim_due(conn, "test", due + timedelta(microseconds=1))) == {"a", "b"}
        assert await load_states(conn, "test", ["a", "b"]) == {"a": {"n": 1}, "b": {"n": 2}}


async def test_upgrading_a_version_1_store_adds_the_inbox(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        v1_tables = [t for t in metadata.sorted_tables if t is not policy_inbox]
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.create_all(sync, tables=v1_tables))
            await conn.execute(schema_version.insert().values(version=1, applied_at=BASE_TIME))
        assert await migrate(engine) == SCHEMA_VERSION == 2
        await intake(engine, [make_alert(1)])
        async with engine.connect() as conn:
            assert await inbox_depth(conn) == 1
    finally:
        await engine.dispose()


async def test_concurrent_drains_in_one_process_plan_each_change_once(
    engine: AsyncEngine,
) -> None:
    # The demo and tests drain while the background loop may run too; on SQLite the inbox is
    # read before the write lock is taken, so only the worker's own lock keeps claims apart.
    await intake(engine, [make_alert(i) for i in range(40)])
    planned: list[int] = []

    async def slow(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        await asyncio.sleep(0.05)  # let the other drain run its claim meanwhile
        planned.extend(change.alert_id for change in changes)
        return 0

    worker = PolicyWorker(engine, slow, batch=7)
    await asyncio.gather(worker.drain(), worker.drain(), worker.drain())
    assert sorted(planned) == sorted(set(planned)) and len(planned) == 40
