"""Fixtures shared by every test directory: databases (SQLite and the real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.pg_databases import (
    drop_pooled_pg_databases,
    give_back_pg_database,
    take_pg_database,
)
from tests.support.receiver import Receiver
from tests.support.xdist_scheduling import make_scheduler
from trainsentry.store import create_engine, migrate


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The parallel run's units of work (tests/support/xdist_scheduling.py)."""
    return make_scheduler(config, log)


@pytest.fixture(scope="session")
def pg_pool() -> Iterator[None]:
    """The scratch PostgreSQL databases tests hand back are reused, and dropped at the end
    (tests/support/pg_databases.py)."""
    try:
        yield
    finally:
        drop_pooled_pg_databases()


@pytest.fixture
def pg_url(pg_pool: None) -> Iterator[str]:
    """An empty PostgreSQL database of the test's own (no table, no session on it)."""
    url = take_pg_database()
    try:
        yield url
    finally:
        give_back_pg_database(url)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path, pg_pool: None) -> Iterator[str]:
    """An empty database URL, once for SQLite and once for the real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    url = take_pg_database()
    try:
        yield url
    finally:
        give_back_pg_database(url)


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
