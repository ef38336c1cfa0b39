"""Scratch PostgreSQL databases for tests (the real server on 127.0.0.1:5432).

A module of its own, not conftest.py: several test directories have a conftest, so
`from conftest import ...` would find whichever was imported first.
"""

from __future__ import annotations

import os
import uuid

PG_ADMIN_URL = os.environ.get("TRAINSENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


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
    """Creates an empty PostgreSQL database and returns its URL."""
    name = f"ts_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
