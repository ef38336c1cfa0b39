"""Opening the store: URL normalisation, engine settings per backend, schema check at start."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from trainsentry.alerts import utcnow
from trainsentry.store.dialect import is_sqlite
from trainsentry.store.errors import StoreError, StoreMissing, StoreUrlError
from trainsentry.store.schema import SCHEMA_VERSION, metadata, schema_version
from trainsentry.store.sqlite_driver import use_store_connections

# The handles a stage holds (stages never import SQLAlchemy): an engine opened by
# `create_engine`, and a connection inside `engine.begin()` / `engine.connect()`.
Engine = AsyncEngine
Connection = AsyncConnection


_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "postgresql+psycopg": "postgresql+psycopg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
}


# libpq's `sslmode` values; asyncpg takes the same ones as its `ssl` argument.
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# libpq's certificate parameters, which asyncpg reads from these environment variables only.
_LIBPQ_SSL_FILES = {
    "sslrootcert": "PGSSLROOTCERT",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
    "sslcrl": "PGSSLCRL",
}


def async_url(url: str) -> str:
    """`sqlite:///x.db` / `postgresql://...` → the async driver URL SQLAlchemy needs.

    libpq's `?sslmode=X` (the form managed databases hand out) becomes asyncpg's `?ssl=X`.
    Messages never carry the URL's password (it usually comes from a Secret).
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreUrlError(
            "not a database URL (not shown, it may hold a password); "
            "use sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    driver = _ASYNC_DRIVERS.get(parsed.drivername)
    if driver is None:
        raise StoreUrlError(
            f"unsupported database {parsed.drivername!r}; use sqlite:///PATH or postgresql://..."
        )
    parsed = parsed.set(drivername=driver)
    if driver == "postgresql+asyncpg" and "sslmode" in parsed.query:
        sslmode = parsed.query["sslmode"]
        if isinstance(sslmode, tuple) or sslmode not in _SSLMODES:
            raise StoreUrlError(f"sslmode must be one of {', '.join(_SSLMODES)}")
        if "ssl" in parsed.query:
            raise StoreUrlError("the database URL sets both sslmode and ssl; keep one")
        parsed = parsed.difference_update_query(["sslmode"]).update_query_dict({"ssl": sslmode})
    if driver == "postgresql+asyncpg":
        files = sorted(set(parsed.query) & set(_LIBPQ_SSL_FILES))
        if files:
            env = ", ".join(_LIBPQ_SSL_FILES[name] for name in files)
            raise StoreUrlError(
                f"the database URL's {', '.join(files)} cannot be passed to asyncpg: "
                f"set {env} in the environment instead"
            )
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str) -> Path | None:
    """The absolute path of a SQLite URL's file; None for other databases and in-memory ones."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database or ""
    if database in ("", ":memory:"):
        return None
    if database.startswith("file:"):  # a SQLite URI filename (?uri=true)
        database = database[len("file:") :].split("?", 1)[0]
    return Path(database).expanduser().absolute()


def require_existing(url: str) -> None:
    """Raises StoreMissing for a SQLite URL whose file does not exist (opening it would create
    an empty store). Says which absolute path it looked at."""
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        raise StoreMissing(
            f"no store at {path}: the file does not exist (is the database URL right? "
            "only the gateway creates a store)"
        )


def require_directory(url: str) -> None:
    """Raises StoreMissing for a SQLite URL whose folder does not exist, naming it (SQLite
    would say only "unable to open database file", at the first connection)."""
    path = sqlite_path(url)
    if path is not None and not path.parent.is_dir():
        raise StoreMissing(
            f"the database folder {path.parent} does not exist: create it "
            f"(mkdir -p {path.parent}) or give --db a path in a folder that exists"
        )


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


def create_engine(url: str, *, pool_size: int = 5, must_exist: bool = False) -> AsyncEngine:
    """An async engine for `url` with our per-backend settings (no I/O yet, except that
    `must_exist` refuses a SQLite file that is not there: see `require_existing`)."""
    full = async_url(url)
    if must_exist:
        require_existing(url)
    if full.startswith("sqlite"):
        check_sqlite()
        engine = create_async_engine(full, connect_args={"timeout": 10})
        event.listen(engine.sync_engine, "do_connect", use_store_connections)
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


def _too_new(current: int) -> StoreError:
    return StoreError(
        f"the database has schema version {current}, newer than this trainsentry "
        f"understands ({SCHEMA_VERSION}); upgrade trainsentry"
    )


async def migrate(engine: AsyncEngine, *, create: bool = True) -> int:
    """Creates or upgrades the schema to SCHEMA_VERSION; refuses a newer one. Returns it.
    With `create=False` a database without the store's schema is refused (StoreMissing)
    instead of set up: for commands that only add to an existing store.

    All of it is one transaction that also keeps other migrators out, and the version is read
    inside it, so a second process starting at the same time finds nothing left to do. On
    PostgreSQL an advisory lock serialises replicas. On SQLite the driver (pysqlite) would run
    DDL outside any transaction, so the migration opens one itself with BEGIN IMMEDIATE
    (taking the write lock at once; others wait up to the busy timeout): a step failing half
    way leaves the store exactly as it was.
    """
    # A brand-new SQLite file is still in rollback-journal mode until a first connection
    # turns on WAL, and there SQLite answers "database is locked" at once instead of waiting
    # (deadlock avoidance), e.g. for a gateway and a report job starting together. The
    # migration is one transaction, so trying it again is safe.
    for attempt in range(5):
        try:
            return await _migrate_once(engine, create=create)
        except OperationalError as exc:
            if not is_sqlite(engine) or "locked" not in str(exc) or attempt == 4:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


async def _migrate_once(engine: AsyncEngine, *, create: bool) -> int:
    from trainsentry.store.migrations import MIGRATIONS

    async with engine.begin() as conn:
        if is_sqlite(engine):
            # pysqlite's commit()/rollback() end this transaction: they act whenever SQLite
            # is not in autocommit mode, whoever began the transaction.
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            await conn.execute(text("SELECT pg_advisory_xact_lock(7412001)"))
        current = await _current_version(conn)
        if current is None:
            if not create:
                raise StoreMissing(
                    "the database holds no trainsentry store (no schema_version table); "
                    "only the gateway creates a store"
                )
            await conn.run_sync(metadata.create_all)
            await conn.execute(
                schema_version.insert().values(version=SCHEMA_VERSION, applied_at=utcnow())
            )
            return SCHEMA_VERSION
        if current > SCHEMA_VERSION:
            raise _too_new(current)
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[version]:
                if isinstance(step, str):
                    await conn.execute(text(step))
                else:
                    await conn.run_sync(step)
            await conn.execute(schema_version.insert().values(version=version, applied_at=utcnow()))
        return SCHEMA_VERSION


async def check_schema(engine: AsyncEngine) -> int:
    """The store's schema version, without changing anything: StoreMissing when there is no
    store in the database, StoreError when its schema is newer than this trainsentry's."""
    async with engine.connect() as conn:
        current = await _current_version(conn)
    if current is None:
        raise StoreMissing(
            "the database holds no trainsentry store (no schema_version table); "
            "only the gateway creates a store"
        )
    if current > SCHEMA_VERSION:
        raise _too_new(current)
    return current


async def check_reachable(engine: AsyncEngine) -> None:
    """Raises if the store does not answer a trivial query."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))
