"""Planning partitions of the policy inbox (store/inbox.py, issue 46), on the real
PostgreSQL: concurrent claims (two replicas' transactions) take disjoint partitions, most
urgent first; a P0 waits for another replica's partition at most that replica's batch; an
alert's changes keep their order even when they lie in two partitions (rows written before
schema version 15)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.alerts import ChangeKind, job_key
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.store.inbox import Claimed, claim_inbox, clear_inbox, partition_key, partition_of
from trainsentry.store.schema import alert_events, alerts, policy_inbox
from trainsentry.store.writes import record_receipts


async def intake(engine: AsyncEngine, alert_dicts: list[dict[str, object]], at_s: int = 0) -> None:
    receipt = parse_webhook(
        encode(make_body(alert_dicts)), received_at=BASE_TIME + timedelta(seconds=at_s)
    )
    async with engine.begin() as conn:
        await record_receipts(conn, [receipt])


def storm(jobs: int, per_job: int, priority: str = "P3") -> list[dict[str, object]]:
    """`jobs` × `per_job` alerts, the jobs interleaved as a storm arrives."""
    return [
        make_alert(n, labels={"trainingjob": f"job-{n % jobs}", "priority": priority})
        for n in range(jobs * per_job)
    ]


def jobs_of(claimed: Claimed) -> set[str]:
    return {job_key(change.alert.labels) for change in claimed.changes}


def only_postgresql(engine: AsyncEngine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("replicas share one store only on PostgreSQL")


def test_the_partition_is_the_job_else_the_node_of_a_cluster_alert() -> None:
    assert partition_key({"trainingjob": "llama", "namespace": "ml", "node": "n1"}) == (
        "trainingjob:ml/llama"
    )
    assert partition_key({"job": "node-exporter", "namespace": "mon", "node": "n1"}) == (
        "job:mon/node-exporter"
    )
    assert partition_key({"alertname": "KubeNodeNotReady", "node": "n1"}) == "node:n1"
    assert partition_key({"alertname": "Watchdog"}) == "cluster"
    # stable across processes (a replica started later agrees), signed 32-bit
    assert partition_of({"alertname": "Watchdog"}) == 1707436436
    assert all(-(2**31) <= partition_of({"node": f"n{i}"}) < 2**31 for i in range(100))


async def test_two_replicas_claim_disjoint_partitions_of_a_storm(engine: AsyncEngine) -> None:
    """Before partitions, both claims took 50 rows spread over all 4 jobs: each batch would
    lock every job's storm state and incidents, and the replicas planned one after the
    other."""
    only_postgresql(engine)
    await intake(engine, storm(jobs=4, per_job=50))
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        mine = await claim_inbox(first, 50)
        await second.begin()
        theirs = await claim_inbox(second, 50)
        assert len(mine.changes) == len(theirs.changes) == 50
        assert len(jobs_of(mine)) == len(jobs_of(theirs)) == 1  # a partition holds 50 rows
        assert not jobs_of(mine) & jobs_of(theirs)
        assert not set(mine.event_ids) & set(theirs.event_ids)
        # oldest first within each: the claims are in event order
        assert mine.event_ids == sorted(mine.event_ids)
        await clear_inbox(first, mine.event_ids)
        await clear_inbox(second, theirs.event_ids)
        await first.commit()
        await second.commit()


async def test_a_claim_takes_partitions_until_it_holds_a_batch(engine: AsyncEngine) -> None:
    only_postgresql(engine)
    await intake(engine, storm(jobs=6, per_job=10))
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        mine = await claim_inbox(first, 25)  # 3 partitions of 10 rows hold a batch of 25
        await second.begin()
        theirs = await claim_inbox(second, 100)  # only the 3 left
        assert len(mine.changes) == 25 and len(jobs_of(mine)) == 3
        assert len(theirs.changes) == 30 and len(jobs_of(theirs)) == 3
        assert not jobs_of(mine) & jobs_of(theirs)
        await first.rollback()
        await second.rollback()


async def test_a_p0_waits_for_another_replicas_partition_at_most_its_batch(
    engine: AsyncEngine,
) -> None:
    only_postgresql(engine)
    await intake(engine, storm(jobs=2, per_job=300))
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        held = await claim_inbox(first, 250)  # replica 1 plans job-0's batch
        (busy_job,) = jobs_of(held)
        # a P0 of that job arrives while the batch is planned
        page = make_alert(
            9999, name="GPUFallenOffBus", labels={"trainingjob": "job-0", "priority": "P0"}
        )
        await intake(engine, [page], at_s=1)
        await second.begin()
        other = await claim_inbox(second, 250)  # replica 2 cannot take job-0: the other job
        assert busy_job == "trainingjob:ml/job-0" and jobs_of(other) == {"trainingjob:ml/job-1"}
        await clear_inbox(first, held.event_ids)
        await first.commit()  # replica 1's batch ends
        async with engine.begin() as third:  # the next claim, by any replica: the P0 first
            after = await claim_inbox(third, 250)
            assert after.changes[0].alert.labels["priority"] == "P0"
        await second.rollback()


async def test_an_alerts_changes_in_two_partitions_keep_their_order(engine: AsyncEngine) -> None:
    """An alert fired before the upgrade to version 15 (its row in partition 0) resolves
    after it (its own partition): the resolve waits until the firing is planned."""
    only_postgresql(engine)
    await intake(engine, [make_alert(1)], at_s=0)
    async with engine.begin() as conn:
        await conn.execute(update(policy_inbox).values(part=0))  # as the migration leaves it
    await intake(engine, [make_alert(1, status="resolved")], at_s=60)
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        held = await claim_inbox(first, 1)
        assert [c.kind for c in held.changes] == [ChangeKind.FIRING]
        await second.begin()
        assert (await claim_inbox(second, 10)).changes == []  # the resolve waits
        await clear_inbox(first, held.event_ids)
        await first.commit()
        await second.rollback()
    async with engine.begin() as conn:
        last = await claim_inbox(conn, 10)
    assert [c.kind for c in last.changes] == [ChangeKind.RESOLVED]


async def test_the_intake_writes_each_change_with_its_alerts_partition(
    engine: AsyncEngine,
) -> None:
    await intake(engine, storm(jobs=3, per_job=2))
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(policy_inbox.c.part, alerts.c.labels)
                .join(alert_events, alert_events.c.id == policy_inbox.c.event_id)
                .join(alerts, alerts.c.id == alert_events.c.alert_id)
            )
        ).all()
    assert len(rows) == 6
    assert all(part == partition_of(labels) for part, labels in rows)
    assert len({part for part, _ in rows}) == 3


async def test_cluster_alerts_are_partitioned_by_node(engine: AsyncEngine) -> None:
    """60 cluster-wide alerts on 60 nodes: 60 partitions of one row; two claims of 25 each
    take disjoint nodes and a full batch."""
    only_postgresql(engine)
    cluster = {"trainingjob": "", "namespace": ""}
    await intake(
        engine, [make_alert(n, name="KubeNodeNotReady", labels=cluster) for n in range(60)]
    )
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        mine = await claim_inbox(first, 25)
        await second.begin()
        theirs = await claim_inbox(second, 25)
        nodes = [{c.alert.labels["node"] for c in claimed.changes} for claimed in (mine, theirs)]
        assert len(nodes[0]) == len(nodes[1]) == 25
        assert not nodes[0] & nodes[1]
        assert {partition_key(c.alert.labels) for c in mine.changes} == {
            f"node:{node}" for node in nodes[0]
        }
        await first.rollback()
        await second.rollback()
