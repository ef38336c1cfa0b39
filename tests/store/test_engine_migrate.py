"""Migrations are one transaction that also keeps other migrators out, on SQLite (where the
driver would run DDL outside any transaction) and on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, inspect, select, text
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.old_stores import create_version_2_schema
from tests.support.webhook_factory import BASE_TIME
from trainsentry.store.engine import check_schema, create_engine, migrate
from trainsentry.store.errors import StoreMissing
from trainsentry.store.migrations import MIGRATIONS
from trainsentry.store.schema import SCHEMA_VERSION, schema_version


async def make_version_2_store(engine: AsyncEngine) -> None:
    """A store as version 2 left it (the inbox without its urgency column)."""
    async with engine.begin() as conn:
        await create_version_2_schema(conn)


async def store_shape(engine: AsyncEngine) -> tuple[list[int], list[str], list[str]]:
    """(schema versions recorded, policy_inbox's columns, its indexes)."""

    def read(sync: Connection) -> tuple[list[str], list[str]]:
        found = inspect(sync)
        columns = [c["name"] for c in found.get_columns("policy_inbox")]
        indexes = sorted(str(i["name"]) for i in found.get_indexes("policy_inbox"))
        return columns, indexes

    async with engine.connect() as conn:
        versions = list(
            (
                await conn.execute(
                    select(schema_version.c.version).order_by(schema_version.c.version)
                )
            ).scalars()
        )
        columns, indexes = await conn.run_sync(read)
    return versions, columns, indexes


async def test_a_migration_failing_half_way_leaves_the_store_as_it_was(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(db_url)
    try:
        await make_version_2_store(engine)
        before = await store_shape(engine)
        assert before == ([2], ["event_id"], [])
        # Version 3's steps (ALTER TABLE, CREATE INDEX), then a step that fails.
        monkeypatch.setitem(MIGRATIONS, 3, [*MIGRATIONS[3], "SELECT * FROM no_such_table"])
        with pytest.raises((OperationalError, ProgrammingError)):
            await migrate(engine)
        assert await store_shape(engine) == before
        monkeypatch.undo()
        # The next start upgrades normally (no "duplicate column name").
        assert await migrate(engine) == SCHEMA_VERSION
        versions, columns, indexes = await store_shape(engine)
        assert versions == list(range(2, SCHEMA_VERSION + 1))
        assert columns == ["event_id", "urgency", "part"]
        assert indexes == ["ix_policy_inbox_claim", "ix_policy_inbox_part"]
    finally:
        await engine.dispose()


@pytest.mark.parametrize("start", ["new", "version 2"])
async def test_concurrent_migrators_all_succeed_and_migrate_once(db_url: str, start: str) -> None:
    setup = create_engine(db_url)
    try:
        if start == "version 2":
            await make_version_2_store(setup)
    finally:
        await setup.dispose()
    engines = [create_engine(db_url) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(e) for e in engines), return_exceptions=True)
        assert results == [SCHEMA_VERSION] * 4
        versions, columns, _ = await store_shape(engines[0])
        assert versions == (
            [SCHEMA_VERSION] if start == "new" else list(range(2, SCHEMA_VERSION + 1))
        )
        assert columns == ["event_id", "urgency", "part"]
    finally:
        for e in engines:
            await e.dispose()


MIGRATOR = """
import asyncio, sys, time
from trainsentry.store.engine import create_engine, migrate

async def main() -> None:
    engine = create_engine(sys.argv[1])
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # start together
    try:
        print(await migrate(engine))
    finally:
        await engine.dispose()

asyncio.run(main())
"""


def test_migrating_processes_started_together_all_succeed(tmp_path: Path) -> None:
    """The gateway and the report job starting at once on a new SQLite store."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    start_at = str(time.time() + 3)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATOR, url, start_at],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 6, [err for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == [str(SCHEMA_VERSION)] * 6


async def test_migrate_without_create_refuses_an_empty_database(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        with pytest.raises(StoreMissing):
            await migrate(engine, create=False)
        with pytest.raises(StoreMissing):
            await check_schema(engine)
        async with engine.connect() as conn:
            tables: Any = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
        assert tables == []
        await migrate(engine)
        assert await migrate(engine, create=False) == SCHEMA_VERSION
        assert await check_schema(engine) == SCHEMA_VERSION
    finally:
        await engine.dispose()


async def test_sqlite_migration_commits_its_transaction(tmp_path: Path) -> None:
    """BEGIN IMMEDIATE is issued past SQLAlchemy: the driver's commit must still end it (not
    leave it to the pool's rollback, or hold the write lock and block everyone else)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = create_engine(url)
    other = create_engine(url)
    try:
        await migrate(engine)
        assert await check_schema(other) == SCHEMA_VERSION  # committed, seen by others
        async with other.begin() as conn:  # would wait 10 s and fail if the lock were held
            await conn.execute(text("PRAGMA busy_timeout=100"))
            await conn.execute(schema_version.insert().values(version=99, applied_at=BASE_TIME))
    finally:
        await engine.dispose()
        await other.dispose()
