"""Version 4 (the outbox's delivery columns) upgrades a version 3 store in place, on SQLite
and the real PostgreSQL: rows waiting in the outbox keep their state, and the upgraded table
is the one a new store gets."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, inspect, select

from tests.support.old_stores import create_version_3_schema
from trainsentry.store.engine import create_engine, migrate
from trainsentry.store.schema import SCHEMA_VERSION, metadata, notifications


def outbox_shape(sync: Connection) -> tuple[list[tuple[str, bool, str]], list[Any]]:
    found = inspect(sync)
    columns = sorted(
        (c["name"], bool(c["nullable"]), type(c["type"]).__name__)
        for c in found.get_columns("notifications")
    )
    indexes = sorted(
        (str(i["name"]), tuple(i["column_names"])) for i in found.get_indexes("notifications")
    )
    return columns, indexes


async def test_a_version_3_outbox_upgrades_and_keeps_its_rows(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as conn:
            await create_version_3_schema(conn)
            old_columns, _ = await conn.run_sync(outbox_shape)
            for status in ("pending", "dead"):
                await conn.exec_driver_sql(
                    "INSERT INTO notifications (idempotency_key, created_at, channel, kind,"
                    " priority, group_key, reason, payload, status, attempts, next_attempt_at)"
                    f" VALUES ('k-{status}', :t, 'feishu', 'card', 'P0', '', '', '{{}}',"
                    f" '{status}', 8, :t)".replace(":t", "'2026-01-01 00:00:00'")
                )
        assert "failing_since" not in {name for name, _, _ in old_columns}
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            upgraded = await conn.run_sync(outbox_shape)
            rows = (
                await conn.execute(
                    select(
                        notifications.c.status,
                        notifications.c.attempts,
                        notifications.c.failing_since,
                        notifications.c.retried_by,
                        notifications.c.retried_at,
                    ).order_by(notifications.c.id)
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            ("pending", 8, None, None, None),
            ("dead", 8, None, None, None),
        ]
        # the same table as a new store's (names, nullability, types, indexes)
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.drop_all(sync))
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            assert upgraded == await conn.run_sync(outbox_shape)
        names = {name for name, _, _ in upgraded[0]}
        assert {"failing_since", "retried_by", "retried_at"} <= names
    finally:
        await engine.dispose()
