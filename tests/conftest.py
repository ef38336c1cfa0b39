"""Fixtures shared by every test directory: databases (SQLite and the real PostgreSQL)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from receiver import Receiver
from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.store import create_engine, migrate

PG_ADMIN_URL = os.environ.get("TRAINSENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_admin_dsn() -> str:
    return PG_ADMIN_URL


def make_pg_database() -> str:
    """Creates an empty PostgreSQL database and returns its URL (sync, psycopg-free)."""
    import asyncio

    import asyncpg

    name = f"ts_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        conn = await asyncpg.connect(_pg_admin_dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def drop_pg_database(url: str) -> None:
    import asyncio

    import asyncpg

    name = url.rsplit("/", 1)[1]

    async def drop() -> None:
        conn = await asyncpg.connect(_pg_admin_dsn())
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database URL, once for SQLite and once for the real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    url = make_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated engine on `db_url`."""
    eng = create_engine(db_url)
    await migrate(eng)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A local HTTP server counting what a webhook channel sends (tests/receiver.py)."""
    r = Receiver()
    await r.start()
    yield r
    await r.stop()
