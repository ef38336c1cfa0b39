"""Scratch PostgreSQL databases for tests (the real server on 127.0.0.1:5432).

A module of its own, not conftest.py: several test directories have a conftest, so
`from conftest import ...` would find whichever was imported first.

`make_pg_database`/`drop_pg_database` create and drop one database. Tests take theirs with
`take_pg_database` and hand it back with `give_back_pg_database`: a database handed back is
emptied (every session on it ended, its public schema made anew, as CREATE DATABASE leaves
it) and kept for the next test, since creating and dropping a database costs the server
about a second of fsyncs each time and a reset a tenth of that. A database that cannot be
shown empty after the reset is dropped instead. `drop_pooled_pg_databases` drops the kept
ones (the session's end). Their commits do not wait for the server's disk
(`synchronous_commit = off`, `_make_scratch_database`).
"""

from __future__ import annotations

import os
import uuid

PG_ADMIN_URL = os.environ.get("TRAINSENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

# Databases handed back and reset: empty, no session on them.
_free: list[str] = []


def _url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def _admin(statement: str) -> None:
    """Runs one statement on the admin database (sync, psycopg-free)."""
    import asyncio

    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


def make_pg_database() -> str:
    """Creates an empty PostgreSQL database and returns its URL. Its name carries the
    pytest-xdist worker's (`ts_gw0_…`), so a database left over names the process that made
    it; the pool (`_free`) is the process's own, so two workers never share a database."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    name = f"ts_{worker + '_' if worker.isalnum() else ''}{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    return _url(name)


def _make_scratch_database() -> str:
    """`make_pg_database` whose commits do not wait for the server's disk
    (`synchronous_commit = off`: what a transaction reads and writes, and when its commit
    returns, are the same; only a server crash could lose its last commits, and no test
    crashes the server), as a test's scratch database needs."""
    url = make_pg_database()
    _admin(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET {_SCRATCH_SETTING}')
    return url


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_SCRATCH_SETTING = "synchronous_commit = off"

# What a database holds besides an empty public schema, or the sessions still on it: any row
# means the reset did not leave it as CREATE DATABASE does.
_LEFT_OVER = """
SELECT 'session ' || pid FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
UNION ALL
SELECT 'schema ' || nspname FROM pg_namespace
 WHERE nspname NOT IN ('public', 'information_schema') AND nspname NOT LIKE 'pg\\_%'
UNION ALL
SELECT 'object ' || relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public'
UNION ALL
SELECT 'setting ' || array_to_string(s.setconfig, ',') FROM pg_db_role_setting s
  JOIN pg_database d ON d.oid = s.setdatabase
 WHERE d.datname = current_database() AND s.setconfig <> ARRAY['synchronous_commit=off']
"""


def _reset(url: str) -> bool:
    """Ends every session on the database and makes its public schema anew (as PostgreSQL
    15 creates it); True when nothing is left over (`_LEFT_OVER`)."""
    import asyncio

    import asyncpg

    async def run() -> bool:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            await conn.execute("SET lock_timeout = '5s'")
            async with conn.transaction():
                await conn.execute("DROP SCHEMA public CASCADE")
                await conn.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
                await conn.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
                await conn.execute("COMMENT ON SCHEMA public IS 'standard public schema'")
            return not await conn.fetch(_LEFT_OVER)
        finally:
            await conn.close()

    try:
        return asyncio.run(run())
    except (OSError, asyncpg.PostgresError):
        return False


def take_pg_database() -> str:
    """The URL of an empty database of the test's own: one handed back earlier, else new."""
    return _url(_free.pop()) if _free else _make_scratch_database()


def give_back_pg_database(url: str) -> None:
    """Resets the database for the next `take_pg_database`, or drops it where the reset
    leaves something over."""
    if _reset(url):
        _free.append(url.rsplit("/", 1)[1])
    else:
        drop_pg_database(url)


def drop_pooled_pg_databases() -> None:
    while _free:
        drop_pg_database(_url(_free.pop()))
