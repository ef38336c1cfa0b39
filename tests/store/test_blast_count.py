"""The blast-radius count the policy classifies with (`distinct_nodes`), on SQLite and the
real PostgreSQL: one statement for all of a batch's jobs, exact per (namespace, job, alertname);
and its covering index (version 6) on upgraded stores as on new ones."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection, inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.gateway.stages.planning.test_policy_inbox import intake
from tests.support.old_stores import version_1_tables
from tests.support.webhook_factory import BASE_TIME, make_alert
from trainsentry.store import create_engine, migrate
from trainsentry.store.policy_state import distinct_nodes
from trainsentry.store.schema import SCHEMA_VERSION, metadata, schema_version

JOB = ("ml", "llama-70b", "GPUXidError")


async def test_counts_distinct_nodes_per_job_and_alertname_within_the_window(
    engine: AsyncEngine,
) -> None:
    alerts = [make_alert(i, starts_at=BASE_TIME + timedelta(seconds=i)) for i in range(10)]
    # the same node again (another GPU, another fingerprint): one node
    alerts.append(make_alert(1000, starts_at=BASE_TIME + timedelta(seconds=20)))
    # started before the window: not counted
    alerts.append(make_alert(11, starts_at=BASE_TIME - timedelta(seconds=400)))
    # another alertname, another namespace, no node: each counted apart or not at all
    alerts.append(make_alert(12, name="NodeDown", starts_at=BASE_TIME))
    alerts.append(make_alert(13, labels={"namespace": "dev"}, starts_at=BASE_TIME))
    alerts.append(make_alert(14, labels={"node": ""}, starts_at=BASE_TIME))
    # more jobs than one statement takes (100), to cover the chunking
    alerts += [
        make_alert(2000 + j, labels={"trainingjob": f"job-{j:03d}"}, starts_at=BASE_TIME)
        for j in range(150)
    ]
    await intake(engine, alerts)

    pairs = [
        JOB,
        JOB,  # asked twice: one answer
        ("ml", "llama-70b", "NodeDown"),
        ("dev", "llama-70b", "GPUXidError"),
        ("ml", "llama-70b", "NoSuchAlert"),
        ("ml", "", "GPUXidError"),  # no job: the alert itself
        *[("ml", f"job-{j:03d}", "GPUXidError") for j in range(150)],
    ]
    async with engine.connect() as conn:
        counts = await distinct_nodes(conn, pairs, BASE_TIME - timedelta(seconds=300))
        later = await distinct_nodes(conn, [JOB], BASE_TIME + timedelta(seconds=5))

    assert counts[JOB] == 10
    assert counts[("ml", "llama-70b", "NodeDown")] == 1
    assert counts[("dev", "llama-70b", "GPUXidError")] == 1
    assert counts[("ml", "llama-70b", "NoSuchAlert")] == 0
    assert counts[("ml", "", "GPUXidError")] == 1
    assert all(counts[("ml", f"job-{j:03d}", "GPUXidError")] == 1 for j in range(150))
    assert len(counts) == 5 + 150
    # nodes 5..9 started at or after the window's start, and node 0 again at +20 s
    assert later == {JOB: 6}


def _alert_indexes(sync: Connection) -> list[tuple[str, tuple[str, ...]]]:
    found = inspect(sync).get_indexes("alerts")
    return sorted((str(i["name"]), tuple(i["column_names"])) for i in found)


async def test_upgrading_gives_the_alerts_the_indexes_a_new_store_has(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        v1_tables = version_1_tables()
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: v1_tables[0].metadata.create_all(sync))
            await conn.execute(schema_version.insert().values(version=1, applied_at=BASE_TIME))
            old = await conn.run_sync(_alert_indexes)
        assert ("ix_alerts_blast", ("job_name", "alertname", "starts_at")) in old
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            upgraded = await conn.run_sync(_alert_indexes)
        async with engine.begin() as conn:
            await conn.run_sync(lambda sync: metadata.drop_all(sync))
        assert await migrate(engine) == SCHEMA_VERSION
        async with engine.connect() as conn:
            assert upgraded == await conn.run_sync(_alert_indexes)
        names = [name for name, _ in upgraded]
        assert "ix_alerts_blast_nodes" in names and "ix_alerts_blast" not in names
    finally:
        await engine.dispose()
