"""Schema version 6 (maintenance windows): a store upgraded from an earlier version has the
maintenance tables exactly as a new store has them, on SQLite and the real PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, inspect

from tests.support.old_stores import version_1_tables
from tests.support.webhook_factory import BASE_TIME
from trainsentry.store import create_engine, migrate
from trainsentry.store.schema import SCHEMA_VERSION, metadata, schema_version

TABLES = ("maintenance_windows", "maintenance_mutes")


def shape(sync: Connection) -> dict[str, Any]:
    found = inspect(sync)
    return {
        table: (
            [(c["name"], str(c["type"]), bool(c["nullable"])) for c in found.get_columns(table)],
            sorted((i["name"], tuple(i["column_names"])) for i in found.get_indexes(table)),
            found.get_pk_constraint(table)["constrained_columns"],
            [fk["referred_table"] for fk in found.get_foreign_keys(table)],
        )
        for table in TABLES
    }


async def test_an_upgraded_store_has_the_maintenance_tables_as_a_new_one(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        old = version_1_tables()
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: old[0].metadata.create_all(sync))
            await conn.execute(schema_version.insert().values(version=1, applied_at=BASE_TIME))
            tables = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
        assert not set(TABLES) & set(tables)
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            upgraded = await conn.run_sync(shape)
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.drop_all(sync))
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            assert upgraded == await conn.run_sync(shape)
        assert upgraded["maintenance_mutes"][3] == ["alerts"]
    finally:
        await engine.dispose()
