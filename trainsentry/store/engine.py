"""Opening the store: URL normalisation, engine settings per backend, schema check at start."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from trainsentry.alerts import utcnow
from trainsentry.store.schema import SCHEMA_VERSION, metadata, schema_version


class StoreError(RuntimeError):
    """The store cannot be used (bad URL, unreachable, or a schema we cannot handle)."""


_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
}


def async_url(url: str) -> str:
    """`sqlite:///x.db` / `postgresql://...` → the async driver URL SQLAlchemy needs."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"not a database URL: {url!r}") from exc
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is None:
        raise StoreError(
            f"unsupported database {parsed.drivername!r}; use sqlite:///PATH or postgresql://..."
        )
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL + synchronous=FULL: a transaction is on disk when COMMIT returns, so a 200 means
    # the alerts survive a crash of the process (the kill -9 tests) and of the machine.
    # Group commit keeps this cheap: one fsync per batch of webhooks, not per alert.
    # busy_timeout lets a second process (CLI export, report) wait instead of failing.
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


# RETURNING (3.35), UPDATE ... FROM (3.33) and the JSON functions (store/bulk.py).
MIN_SQLITE = (3, 35, 0)


def check_sqlite(version: tuple[int, int, int] = sqlite3.sqlite_version_info) -> None:
    """Refuses a SQLite library too old for the store's statements, saying which one this is
    (otherwise the first webhook would fail with a syntax error, and every one after it)."""
    if version < MIN_SQLITE:
        found = ".".join(map(str, version))
        need = ".".join(map(str, MIN_SQLITE))
        raise StoreError(
            f"this Python's SQLite is {found}; the store needs {need} or newer (or use PostgreSQL)"
        )


def create_engine(url: str, *, pool_size: int = 5) -> AsyncEngine:
    """An async engine for `url` with our per-backend settings (no I/O yet)."""
    full = async_url(url)
    if full.startswith("sqlite"):
        check_sqlite()
        engine = create_async_engine(full, connect_args={"timeout": 10})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        full, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


async def _current_version(conn: AsyncConnection) -> int | None:
    has_table = await conn.run_sync(
        lambda sync_conn: sync_conn.dialect.has_table(sync_conn, schema_version.name)
    )
    if not has_table:
        return None
    version = (
        await conn.execute(
            select(schema_version.c.version).order_by(schema_version.c.version.desc()).limit(1)
        )
    ).scalar()
    return None if version is None else int(version)


async def migrate(engine: AsyncEngine) -> int:
    """Creates or upgrades the schema to SCHEMA_VERSION; refuses a newer one. Returns it.

    On PostgreSQL an advisory lock serialises replicas starting at the same time.
    """
    from trainsentry.store.migrations import MIGRATIONS

    async with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(7412001)"))
        current = await _current_version(conn)
        if current is None:
            await conn.run_sync(metadata.create_all)
            await conn.execute(
                schema_version.insert().values(version=SCHEMA_VERSION, applied_at=utcnow())
            )
            return SCHEMA_VERSION
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {current}, newer than this trainsentry "
                f"understands ({SCHEMA_VERSION}); upgrade trainsentry"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[version]:
                if isinstance(step, str):
                    await conn.execute(text(step))
                else:
                    await conn.run_sync(step)
            await conn.execute(schema_version.insert().values(version=version, applied_at=utcnow()))
        return SCHEMA_VERSION


async def check_reachable(engine: AsyncEngine) -> None:
    """Raises if the store does not answer a trivial query."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
