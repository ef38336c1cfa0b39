"""The store on SQLite and the real PostgreSQL: schema versioning and recording receipts."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.store import StoreError, create_engine, migrate
from trainsentry.store.errors import StoreUnavailable
from trainsentry.store.migrations import MIGRATIONS
from trainsentry.store.schema import SCHEMA_VERSION, alert_events, alerts, schema_version
from trainsentry.store.writes import IncomingReceipt, record_receipts


def receipt(alert_dicts: list[dict[str, object]], offset_s: int = 0) -> IncomingReceipt:
    return parse_webhook(
        encode(make_body(alert_dicts)), received_at=BASE_TIME + timedelta(seconds=offset_s)
    )


async def count(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())  # type: ignore[arg-type]


def test_every_schema_version_has_a_migration_step() -> None:
    assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


async def test_migrate_is_idempotent_and_refuses_newer_schema(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        assert await migrate(engine) == SCHEMA_VERSION
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.begin() as conn:
            await conn.execute(update(schema_version).values(version=SCHEMA_VERSION + 1))
        with pytest.raises(StoreError, match="newer"):
            await migrate(engine)
    finally:
        await engine.dispose()


async def test_replayed_receipt_creates_no_new_occurrences_or_events(engine: AsyncEngine) -> None:
    body = [make_alert(i) for i in range(5)]
    for attempt in range(3):
        async with engine.begin() as conn:
            (outcome,) = await record_receipts(conn, [receipt(body, attempt)])
        assert outcome.new == (5 if attempt == 0 else 0)
        assert outcome.times_received == attempt + 1
    assert await count(engine, alerts) == 5
    assert await count(engine, alert_events) == 5


async def test_resolve_records_one_event_and_resolution_time(engine: AsyncEngine) -> None:
    firing = make_alert(1)
    resolved = make_alert(1, status="resolved")
    async with engine.begin() as conn:
        await record_receipts(conn, [receipt([firing])])
    for offset in (10, 20):  # the resolve is sent twice
        async with engine.begin() as conn:
            (outcome,) = await record_receipts(conn, [receipt([resolved], offset)])
    async with engine.connect() as conn:
        row = (await conn.execute(select(alerts))).one()
        kinds = [
            r.kind for r in await conn.execute(select(alert_events).order_by(alert_events.c.id))
        ]
    assert row.status == "resolved"
    assert row.resolved_at == BASE_TIME + timedelta(seconds=1, minutes=5)  # the alert's endsAt
    assert kinds == ["firing", "resolved"]
    assert outcome.unchanged == 1 and outcome.changed == 0


async def test_changes_inside_one_batch_are_applied_in_order(engine: AsyncEngine) -> None:
    firing, resolved = make_alert(7), make_alert(7, status="resolved")
    other = make_alert(8)
    async with engine.begin() as conn:
        outcomes = await record_receipts(
            conn, [receipt([firing, other]), receipt([resolved], 1), receipt([firing, other], 2)]
        )
    assert [(o.new, o.changed, o.unchanged) for o in outcomes] == [(2, 0, 0), (0, 1, 0), (0, 1, 1)]
    async with engine.connect() as conn:
        events = [
            (r.alert_id, r.kind)
            for r in await conn.execute(select(alert_events).order_by(alert_events.c.id))
        ]
    # occurrence 7: fired, resolved, fired again (same startsAt: re-opened)
    assert [kind for _, kind in events if _ == events[0][0]] == ["firing", "resolved", "firing"]
    assert len(events) == 4


async def test_same_fingerprint_with_new_start_is_a_new_occurrence(engine: AsyncEngine) -> None:
    first = make_alert(3)
    again = make_alert(3, starts_at=BASE_TIME + timedelta(hours=2))
    async with engine.begin() as conn:
        await record_receipts(conn, [receipt([first])])
    async with engine.begin() as conn:
        (outcome,) = await record_receipts(conn, [receipt([again], 5)])
    assert outcome.new == 1
    assert await count(engine, alerts) == 2


async def test_large_receipt_is_stored_whole(engine: AsyncEngine) -> None:
    # More rows than one statement may bind on SQLite: writes must be chunked.
    body = [make_alert(i) for i in range(3000)]
    async with engine.begin() as conn:
        (outcome,) = await record_receipts(conn, [receipt(body)])
    assert outcome.new == 3000
    assert await count(engine, alerts) == 3000


def test_receipt_hash_is_of_the_exact_body() -> None:
    raw = encode(make_body([make_alert(1)]))
    assert parse_webhook(raw).body_sha256 == hashlib.sha256(raw).hexdigest()


async def test_an_unexpected_error_fails_only_its_webhook_and_the_writer_lives_on(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bug in the write path (simulated: one receipt makes it raise) must not kill the writer
    # task, or every later webhook would wait forever for its answer.
    import asyncio

    from trainsentry.gateway.stages import intake

    real = intake.record_receipts

    async def failing_on_poison(
        conn: object, receipts: list[IncomingReceipt], node_labels: tuple[str, ...]
    ) -> object:
        if any(r.receiver == "poison" for r in receipts):
            raise RuntimeError()  # no message at all
        return await real(conn, receipts, node_labels)  # type: ignore[arg-type]

    monkeypatch.setattr(intake, "record_receipts", failing_on_poison)
    writer = intake.IntakeWriter(engine)
    writer.start()
    try:
        good = [receipt([make_alert(i)], offset_s=i) for i in range(3)]
        poison = receipt([make_alert(9)], offset_s=9)
        poison.receiver = "poison"
        submitted = (writer.submit(r) for r in [good[0], poison, good[1]])
        results = await asyncio.wait_for(
            asyncio.gather(*submitted, return_exceptions=True), timeout=20
        )
        assert isinstance(results[1], StoreUnavailable)
        assert str(results[1]) == "internal error, see the gateway log"
        assert [r.new for r in (results[0], results[2])] == [1, 1]  # type: ignore[union-attr]
        assert (await asyncio.wait_for(writer.submit(good[2]), timeout=10)).new == 1
    finally:
        await writer.stop()
    assert await count(engine, alerts) == 3


def test_a_sqlite_too_old_for_the_store_is_refused_at_start_with_its_version() -> None:
    from trainsentry.store.engine import check_sqlite

    with pytest.raises(StoreError, match=r"SQLite is 3\.31\.1; the store needs 3\.35\.0"):
        check_sqlite((3, 31, 1))
    check_sqlite((3, 35, 0))
    check_sqlite()  # the SQLite of this Python (the tests' stores need it anyway)


async def test_priorities_of_one_batch_keep_the_last_decision_per_alert(
    engine: AsyncEngine,
) -> None:
    from trainsentry.store.queries import set_priorities

    async with engine.begin() as conn:
        (outcome,) = await record_receipts(conn, [receipt([make_alert(1), make_alert(2)])])
        first, second = (change.alert_id for change in outcome.changes)
        await set_priorities(conn, [(first, "P2", "a"), (second, "P1", "b"), (first, "P0", "c")])
    async with engine.connect() as conn:
        rows = (await conn.execute(select(alerts).order_by(alerts.c.id))).all()
    assert [(r.id, r.priority, r.priority_reason) for r in rows] == [
        (first, "P0", "c"),
        (second, "P1", "b"),
    ]
