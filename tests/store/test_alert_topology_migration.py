"""Version 10 (an alert's place in the topology) upgrades a store in place, on SQLite and the
real PostgreSQL: stored alerts keep their rows (with no place), and the upgraded table is the
one a new store gets."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, inspect, select

from tests.support.old_stores import version_1_tables
from tests.support.webhook_factory import BASE_TIME
from trainsentry.store.engine import create_engine, migrate
from trainsentry.store.infra import set_places
from trainsentry.store.schema import SCHEMA_VERSION, alerts, metadata, schema_version


def alerts_shape(sync: Connection) -> tuple[list[tuple[str, bool, str]], list[Any]]:
    found = inspect(sync)
    columns = sorted(
        (c["name"], bool(c["nullable"]), type(c["type"]).__name__)
        for c in found.get_columns("alerts")
    )
    indexes = sorted(
        (str(i["name"]), tuple(i["column_names"])) for i in found.get_indexes("alerts")
    )
    return columns, indexes


async def test_alerts_gain_their_place_on_upgrade(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        v1_tables = version_1_tables()
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: v1_tables[0].metadata.create_all(sync))
            await conn.execute(schema_version.insert().values(version=1, applied_at=BASE_TIME))
            await conn.exec_driver_sql(
                "INSERT INTO alerts (fingerprint, starts_at, alertname, status, labels,"
                " annotations, generator_url, job_namespace, job_name, node, created_at,"
                " last_received_at) VALUES ('f', :t, 'A', 'firing', '{}', '{}', '', '', '', '',"
                " :t, :t)".replace(":t", "'2026-01-01 00:00:00'")
            )
            columns, indexes = await conn.run_sync(alerts_shape)
            assert "topology" not in {name for name, _, _ in columns}
            assert "ix_alerts_node_starts" not in {name for name, _ in indexes}
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.begin() as conn:
            upgraded = await conn.run_sync(alerts_shape)
            assert (await conn.execute(select(alerts.c.topology))).scalars().all() == [None]
            alert_id = (await conn.execute(select(alerts.c.id))).scalar_one()
            await set_places(conn, [(alert_id, {"leaf_switch": "leaf-7"})])
        async with engine.connect() as conn:
            stored: Any = (await conn.execute(select(alerts.c.topology))).scalar_one()
        assert stored == {"leaf_switch": "leaf-7"}
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.drop_all(sync))
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            assert upgraded == await conn.run_sync(alerts_shape)
        assert ("ix_alerts_node_starts", ("node", "starts_at")) in upgraded[1]
    finally:
        await engine.dispose()
