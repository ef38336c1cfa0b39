"""Scratch PostgreSQL databases for tests (the real server on 127.0.0.1:5432).

A module of its own, not conftest.py: several test directories have a conftest, so
`from conftest import ...` would find whichever was imported first.
"""

from __future__ import annotations

import os
import uuid

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
