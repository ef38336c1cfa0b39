"""Stores as earlier schema versions left them, for upgrade tests."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.webhook_factory import BASE_TIME
from trainsentry.store.migrations import MIGRATIONS
from trainsentry.store.schema import metadata, policy_inbox, schema_version


async def create_version_2_schema(conn: AsyncConnection) -> None:
    """In `conn`'s transaction: the schema as version 2 left it (the inbox without its
    urgency column)."""
    v1_tables = [t for t in metadata.sorted_tables if t is not policy_inbox]
    await conn.run_sync(lambda sync: metadata.create_all(sync, tables=v1_tables))
    for step in MIGRATIONS[2]:
        assert not isinstance(step, str)
        await conn.run_sync(step)
    await conn.execute(schema_version.insert().values(version=2, applied_at=BASE_TIME))
