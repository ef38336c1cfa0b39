"""The policy inbox and the driver-level bulk writes, on SQLite and the real PostgreSQL.

The intake stores changes and queues them; the policy worker plans each exactly once, also
when a batch fails or the process restarts in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Connection, func, inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tests.support.old_stores import create_version_2_schema, version_1_tables
from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.alerts import AlertChange, AlertStatus, ChangeKind
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.store import create_engine, migrate
from trainsentry.store.bulk import (
    Encoder,
    ExecuteMany,
    Steps,
    encoder,
    insert_returning_steps,
    insert_steps,
    run_steps,
    update_steps,
)
from trainsentry.store.inbox import claim_inbox, clear_inbox, urgency
from trainsentry.store.policy_state import claim_due, load_states, save_states
from trainsentry.store.schema import (
    SCHEMA_VERSION,
    alert_events,
    alerts,
    metadata,
    notifications,
    policy_inbox,
    schema_version,
    webhook_receipts,
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
    """The shipped policy to the console, one incident per alert (`grouping.by: alert`):
    these tests count each change's notification to see it planned exactly once."""
    return PolicyPlan(load_policy(overrides={"grouping": {"by": "alert"}}), channels=("console",))


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


def plan_failing_on(fingerprint: str, error: Exception) -> Any:
    """The console policy, raising `error` for any batch holding the alert `fingerprint`."""
    real = console_plan()

    async def plan(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        if any(change.alert.fingerprint == fingerprint for change in changes):
            raise error
        return await real(conn, changes, now)

    return plan


async def attempts_until_drained(worker: PolicyWorker, rounds: int) -> tuple[int, int]:
    """Runs the worker as its loop does (a failed round raises, after planning what it could);
    (changes planned, failed rounds)."""
    failed = 0
    for _ in range(rounds):
        try:
            if not await worker.run_once():
                break
        except Exception:
            failed += 1
    return worker.planned, failed


async def test_a_change_the_policy_always_fails_on_is_set_aside_not_blocking_the_rest(
    engine: AsyncEngine,
) -> None:
    await intake(engine, [make_alert(i) for i in range(4)])
    poison = make_alert(2)["fingerprint"]
    set_aside: list[AlertChange] = []
    worker = PolicyWorker(
        engine,
        plan_failing_on(str(poison), KeyError("a bug meeting one alert")),
        on_set_aside=set_aside.append,
        max_attempts=3,
        clock=lambda: BASE_TIME,
    )
    planned, failed = await attempts_until_drained(worker, rounds=10)
    assert (planned, failed) == (3, 1), "one failed round (a backoff), the next sets it aside"
    assert [change.alert.fingerprint for change in set_aside] == [poison]
    assert await count(engine, policy_inbox) == 0
    assert await count(engine, notifications) == 3
    assert await count(engine, alerts) == 4, "the alert itself stays stored"


async def test_store_errors_never_set_a_change_aside(engine: AsyncEngine) -> None:
    await intake(engine, [make_alert(1), make_alert(2)])
    poison = make_alert(1)["fingerprint"]
    error = OperationalError("INSERT ...", {}, Exception("database is locked"))
    set_aside: list[AlertChange] = []
    worker = PolicyWorker(
        engine, plan_failing_on(str(poison), error), on_set_aside=set_aside.append
    )
    planned, failed = await attempts_until_drained(worker, rounds=6)
    assert (planned, failed, set_aside) == (0, 6, [])
    assert await count(engine, policy_inbox) == 2


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


RECEIPT_COLUMNS = (
    *("body_sha256", "received_at", "last_received_at", "times_received", "receiver"),
    *("status", "group_key", "truncated_alerts", "alert_count", "external_url", "body"),
)


def receipt_row(sha: str, enc: Encoder, receiver: str = "") -> tuple[Any, ...]:
    """A minimal webhook_receipts row in RECEIPT_COLUMNS order, encoded for `enc`'s driver."""
    at = enc.time(BASE_TIME)
    return (sha, at, at, 1, receiver, "firing", "", 0, 0, "", "{}")


def receipt_steps(sha: str, enc: Encoder) -> Steps[list[tuple[Any, ...]]]:
    row = receipt_row(sha, enc)
    return insert_steps("webhook_receipts", RECEIPT_COLUMNS, [row], tail="RETURNING id")


def receipt_then_its_duplicate(sha: str, enc: Encoder) -> Steps[list[tuple[Any, ...]]]:
    first = yield from receipt_steps(sha, enc)
    yield ExecuteMany("UPDATE webhook_receipts SET receiver = ? WHERE id = ?", [("r", first[0][0])])
    yield from receipt_steps(sha, enc)  # the same body_sha256 without ON CONFLICT: refused
    return first


async def test_steps_run_in_the_callers_transaction_and_fail_as_sqlalchemy_errors(
    engine: AsyncEngine,
) -> None:
    # On SQLite the steps run on the driver's thread; a failure must still reach the intake as
    # a SQLAlchemy error (it decides retry, split or 503 by those), and roll back with the rest.
    with pytest.raises(IntegrityError, match=r"(?i)unique"):
        async with engine.begin() as conn:
            await run_steps(conn, receipt_then_its_duplicate("a" * 64, encoder(conn)))
    assert await count(engine, webhook_receipts) == 0
    async with engine.begin() as conn:
        returned = await run_steps(conn, receipt_steps("b" * 64, encoder(conn)))
    async with engine.connect() as conn:
        stored = (await conn.execute(select(webhook_receipts.c.id))).scalars().all()
    assert [row[0] for row in returned] == stored and len(stored) == 1


def receipts_then_read_back(enc: Encoder, shas: list[str]) -> Steps[list[tuple[Any, ...]]]:
    rows = [receipt_row(sha, enc, receiver=f"r-{sha[0]}") for sha in shas]
    return insert_returning_steps(
        "webhook_receipts",
        RECEIPT_COLUMNS,
        rows,
        returning=("id", "body_sha256", "receiver"),
        conflict="ON CONFLICT (body_sha256) DO NOTHING",
        sqlite=enc.sqlite,
    )


async def test_inserted_rows_are_read_back_and_conflicting_ones_are_not(
    engine: AsyncEngine,
) -> None:
    # SQLite reads inserted rows back by rowid range instead of RETURNING (bulk.py); the result
    # must be what RETURNING gives on PostgreSQL: exactly the new rows, each with its own id.
    async with engine.begin() as conn:
        first = await run_steps(conn, receipts_then_read_back(encoder(conn), ["a" * 64]))
        many = ["b" * 64, "a" * 64, *(f"{n:064x}" for n in range(600)), "c" * 64]
        returned = await run_steps(conn, receipts_then_read_back(encoder(conn), many))
    async with engine.connect() as conn:
        stored = {
            row.body_sha256: (row.id, row.receiver)
            for row in await conn.execute(select(webhook_receipts))
        }
    assert len(first) == 1 and len(returned) == 602 == len(stored) - 1
    assert {sha: (rid, receiver) for rid, sha, receiver in returned} == {
        sha: value for sha, value in stored.items() if sha != "a" * 64
    }


async def test_update_steps_change_only_the_keyed_rows(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        enc = encoder(conn)
        ids = [row[0] for row in await run_steps(conn, receipts_then_read_back(enc, SHAS))]
        changes = [(f"new-{n}", n, receipt_id) for n, receipt_id in enumerate(ids[:300])]
        steps = update_steps(
            "webhook_receipts", ("receiver", "alert_count"), "id", changes, sqlite=enc.sqlite
        )
        await run_steps(conn, steps)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(webhook_receipts).order_by("id"))).all()
    assert [(r.receiver, r.alert_count) for r in rows[:300]] == [
        (f"new-{n}", n) for n in range(300)
    ]
    assert all(r.receiver.startswith("r-") and r.alert_count == 0 for r in rows[300:])


SHAS = [f"{n:064x}" for n in range(400)]


async def inbox_shape(
    conn: AsyncConnection,
) -> tuple[list[tuple[str, bool]], list[tuple[Any, ...]]]:
    """policy_inbox's columns (name, nullable) and indexes (name, columns) as the database has
    them."""

    def read(sync: Connection) -> tuple[list[tuple[str, bool]], list[tuple[Any, ...]]]:
        found = inspect(sync)
        columns = [(c["name"], bool(c["nullable"])) for c in found.get_columns("policy_inbox")]
        indexes = sorted(
            (i["name"], tuple(i["column_names"])) for i in found.get_indexes("policy_inbox")
        )
        return columns, indexes

    return await conn.run_sync(read)


async def test_upgrading_a_version_1_store_adds_the_inbox_as_a_new_store_has_it(
    db_url: str,
) -> None:
    engine = create_engine(db_url)
    try:
        v1_tables = version_1_tables()
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: v1_tables[0].metadata.create_all(sync))
            await conn.execute(schema_version.insert().values(version=1, applied_at=BASE_TIME))
        assert await migrate(engine) == SCHEMA_VERSION
        await intake(engine, [make_alert(1)])
        assert await count(engine, policy_inbox) == 1
        async with engine.connect() as conn:
            upgraded = await inbox_shape(conn)
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.drop_all(sync))
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            assert upgraded == await inbox_shape(conn)
        assert upgraded == (
            [("event_id", False), ("urgency", False), ("part", False)],
            [
                ("ix_policy_inbox_claim", ("urgency", "event_id")),
                ("ix_policy_inbox_part", ("part", "urgency", "event_id")),
            ],
        )
    finally:
        await engine.dispose()


async def test_changes_waiting_in_a_version_2_inbox_survive_the_upgrade(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as conn:
            await create_version_2_schema(conn)
            # a change the version 2 intake stored and its policy had not yet planned
            alert_id = (
                await conn.execute(
                    alerts.insert()
                    .values(
                        fingerprint="00000000000000aa",
                        starts_at=BASE_TIME,
                        status="firing",
                        labels={"alertname": "GPUXidError", "priority": "P0"},
                        annotations={},
                        created_at=BASE_TIME,
                        last_received_at=BASE_TIME,
                    )
                    .returning(alerts.c.id)
                )
            ).scalar_one()
            event_id = (
                await conn.execute(
                    alert_events.insert()
                    .values(alert_id=alert_id, kind="firing", at=BASE_TIME)
                    .returning(alert_events.c.id)
                )
            ).scalar_one()
            await conn.execute(
                text("INSERT INTO policy_inbox (event_id) VALUES (:id)"), {"id": event_id}
            )
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.begin() as conn:
            claimed = await claim_inbox(conn, 10)
        assert claimed.event_ids == [event_id]
        assert claimed.changes[0].alert.labels["priority"] == "P0"
    finally:
        await engine.dispose()


def test_urgency_follows_the_priority_label() -> None:
    assert [urgency({"priority": p}) for p in ("P0", "P1", "P2", "P3")] == [0, 1, 2, 3]
    assert urgency({"priority": " p1 "}) == 1
    # without a readable label: behind P0 and P1, ahead of P3
    assert urgency({}) == urgency({"priority": "P7"}) == urgency({"priority": "high"}) == 2


async def test_the_most_urgent_changes_are_claimed_first_each_alert_in_order(
    engine: AsyncEngine,
) -> None:
    def labelled(index: int, priority: str | None, status: str = "firing") -> dict[str, object]:
        labels = {"priority": priority} if priority else {}
        return make_alert(index, status=status, labels=labels)

    await intake(engine, [labelled(i, "P3") for i in range(10)], at_s=0)
    await intake(engine, [labelled(10, None), labelled(11, "P1")], at_s=1)
    await intake(engine, [labelled(1, "P3", "resolved"), labelled(12, "p0")], at_s=2)
    await intake(engine, [labelled(12, "p0", "resolved")], at_s=3)
    order: list[tuple[str, ChangeKind]] = []

    async def record(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        order.extend((c.alert.fingerprint, c.kind) for c in changes)
        return 0

    assert await PolicyWorker(engine, record, batch=3).drain() == 15
    firing, resolved = ChangeKind.FIRING, ChangeKind.RESOLVED
    p0_firing, p0_resolved = (f"{12:016x}", firing), (f"{12:016x}", resolved)
    # P0 first though it arrived last, then P1, then no label; the P0's resolve after its
    # firing (on PostgreSQL in the next batch: one change per fingerprint per claim)
    assert order[0] == p0_firing
    assert [item for item in order[:4] if item != p0_resolved] == [
        p0_firing,
        (f"{11:016x}", firing),
        (f"{10:016x}", firing),
    ]
    assert p0_resolved in order[:4]
    # then the P3s in the order they happened, alert 1's resolve after its firing
    assert order[4:] == [(f"{i:016x}", firing) for i in range(10)] + [(f"{1:016x}", resolved)]


async def test_replicas_never_plan_an_alerts_changes_out_of_order(engine: AsyncEngine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("several replicas share one store only on PostgreSQL")
    # Alert 2 of another job: another planning partition (store/inbox.py), free to replica 2;
    # the fingerprint rule for rows of one alert in two partitions is in
    # tests/store/test_inbox_partitions.py.
    other_job = {"trainingjob": "other-job"}
    await intake(engine, [make_alert(1)], at_s=0)
    await intake(
        engine, [make_alert(1, status="resolved"), make_alert(2, labels=other_job)], at_s=60
    )
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        held = await claim_inbox(first, 1)  # replica 1 holds alert 1's firing
        assert [c.kind for c in held.changes] == [ChangeKind.FIRING]
        await second.begin()
        # replica 2 skips the held row; alert 1's resolve must wait for it, alert 2 need not
        other = await claim_inbox(second, 10)
        assert [(c.alert.fingerprint, c.kind) for c in other.changes] == [
            (f"{2:016x}", ChangeKind.FIRING)
        ]
        await clear_inbox(second, other.event_ids)
        await second.commit()
        await clear_inbox(first, held.event_ids)
        await first.commit()
    async with engine.begin() as conn:
        last = await claim_inbox(conn, 10)
    assert [(c.alert.fingerprint, c.kind) for c in last.changes] == [
        (f"{1:016x}", ChangeKind.RESOLVED)
    ]


async def test_a_p0_is_planned_in_the_first_batch_behind_a_storm(engine: AsyncEngine) -> None:
    storm = [make_alert(i, labels={"priority": "P3"}) for i in range(600)]
    await intake(engine, storm, at_s=0)
    page = make_alert(
        9999, name="GPUFallenOffBus", labels={"priority": "P0", "trainingjob": "other-job"}
    )
    await intake(engine, [page], at_s=1)
    worker = PolicyWorker(engine, console_plan(), clock=lambda: BASE_TIME + timedelta(seconds=1))
    # The P0 alone (issue 24): committed without planning 249 storm changes with it.
    assert await worker.run_once() == 1
    async with engine.connect() as conn:
        planned_p0 = (
            (
                await conn.execute(
                    select(notifications.c.priority).where(notifications.c.priority == "P0")
                )
            )
            .scalars()
            .all()
        )
    assert planned_p0, "the P0 waited behind the storm"
    assert await count(engine, policy_inbox) == 600
    # then the storm, in full batches
    assert [await worker.run_once() for _ in range(4)] == [250, 250, 100, 0]


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
