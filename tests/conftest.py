"""Fixtures shared by every test directory: databases (SQLite and the real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.pg_databases import drop_pg_database, make_pg_database
from tests.support.receiver import Receiver
from trainsentry.store import create_engine, migrate


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
    """A local HTTP server counting what a webhook channel sends (tests/support/receiver.py)."""
    r = Receiver()
    await r.start()
    yield r
    await r.stop()
