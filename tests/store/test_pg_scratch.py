"""The scratch PostgreSQL databases the tests share (tests/support/pg_databases.py): one
handed back is given out again only as empty as CREATE DATABASE makes it, since every
PostgreSQL test of the store reads "an empty database" as a new one. (The helpers block:
async tests call them in a thread.)"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests.support.pg_databases import (
    PG_ADMIN_URL,
    give_back_pg_database,
    take_pg_database,
)
from trainsentry.store import create_engine, migrate


async def _names(url: str, query: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        return {row[0] for row in await conn.fetch(query)}
    finally:
        await conn.close()


async def _databases() -> set[str]:
    return await _names(PG_ADMIN_URL, "SELECT datname FROM pg_database")


PUBLIC = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'public'
UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'public'
UNION ALL SELECT t.typname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
 WHERE n.nspname = 'public'
"""


async def test_a_database_handed_back_is_given_out_empty_with_no_session_on_it(
    pg_pool: None,
) -> None:
    url = await asyncio.to_thread(take_pg_database)
    name = url.rsplit("/", 1)[1]
    engine = create_engine(url)
    await migrate(engine)
    await engine.dispose()
    left_open = await asyncpg.connect(url)  # a session a test forgot: it is ended
    await left_open.execute("CREATE TYPE mood AS ENUM ('ok', 'hung')")
    await left_open.execute(
        "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'"
    )
    await left_open.execute("BEGIN; LOCK TABLE alerts IN ACCESS EXCLUSIVE MODE")
    assert "alerts" in await _names(url, PUBLIC)

    await asyncio.to_thread(give_back_pg_database, url)
    again = await asyncio.to_thread(take_pg_database)
    try:
        assert again == url  # the same database, reused
        assert await _names(again, PUBLIC) == set()
        assert left_open.is_closed() or not await _alive(left_open)
        engine = create_engine(again)
        await migrate(engine)  # a store is created in it as in a new database
        await engine.dispose()
    finally:
        await asyncio.to_thread(give_back_pg_database, again)
    assert name in await _databases()


async def _alive(conn: asyncpg.Connection) -> bool:
    try:
        await conn.fetchval("SELECT 1")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        return False
    return True


async def test_a_database_that_cannot_be_emptied_is_dropped(pg_pool: None) -> None:
    """A schema of its own is something the reset does not remove: the database goes."""
    url = await asyncio.to_thread(take_pg_database)
    name = url.rsplit("/", 1)[1]
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE SCHEMA elsewhere")
    finally:
        await conn.close()
    await asyncio.to_thread(give_back_pg_database, url)
    assert name not in await _databases()
    other = await asyncio.to_thread(take_pg_database)
    await asyncio.to_thread(give_back_pg_database, other)
    assert other != url


@pytest.mark.parametrize("round_", [1, 2])
async def test_pg_url_is_empty_each_time(pg_url: str, round_: int) -> None:
    assert await _names(pg_url, PUBLIC) == set()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f"CREATE TABLE left_by_round_{round_} (x int)")
    finally:
        await conn.close()
