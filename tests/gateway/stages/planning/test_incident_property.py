"""Property (issue 34): whatever webhooks arrive, in whatever groups, order and batches, every
alert the store holds is in exactly one incident, through the real intake, planning and
store (SQLite): alerts in = alerts in incidents, each incident's count is its members, and a
resolved incident has no firing alert left."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.store import create_engine, migrate
from trainsentry.store.schema import alerts, incident_alerts, incidents
from trainsentry.store.writes import record_receipts

POLICIES = {
    by: load_policy(overrides={"grouping": {"by": by}})
    for by in ("group_key", "alertname", "alert")
}
GROUPS = ('{}:{alertname="A"}', '{}/{priority="P0"}:{job="x"}', "")  # "" : no group key
NAMES = ("DiskFull", "GPUFellOffBus", "NodeDown")


@st.composite
def webhooks(draw: st.DrawFn) -> tuple[str, list[tuple[str, list[dict[str, Any]]]]]:
    """(grouping, [(group key, alerts)]): alerts of a few fingerprints, each firing in one or
    two occurrences and maybe resolving, sent in random groups, repeated and shuffled."""
    sent: list[tuple[str, list[dict[str, Any]]]] = []
    for index in range(draw(st.integers(1, 8))):
        name = draw(st.sampled_from(NAMES))
        labels = {"priority": draw(st.sampled_from(("P0", "P1", "P2"))), "node": f"n{index % 3}"}
        group = draw(st.sampled_from(GROUPS))
        for occurrence in range(draw(st.integers(1, 2))):
            start = BASE_TIME + timedelta(seconds=100 * occurrence)
            firing = make_alert(
                index, name=name, labels=labels, starts_at=start, fingerprint=f"{index:016x}"
            )
            sent += [(group, [firing])] * draw(st.integers(1, 2))
            if draw(st.booleans()):
                resolved = make_alert(
                    index,
                    name=name,
                    labels=labels,
                    status="resolved",
                    starts_at=start,
                    fingerprint=f"{index:016x}",
                )
                sent.append((group, [resolved]))
    order = draw(st.permutations(range(len(sent))))
    grouping = draw(st.sampled_from(("group_key", "alertname", "alert")))
    return grouping, [sent[i] for i in order]


async def replay(db: Path, grouping: str, stream: list[tuple[str, list[dict[str, Any]]]]) -> None:
    engine = create_engine(f"sqlite:///{db}")
    try:
        await migrate(engine)
        plan = PolicyPlan(POLICIES[grouping], channels=("console", "feishu_bot", "phone"))
        for step, (group, alert_list) in enumerate(stream):
            at = BASE_TIME + timedelta(seconds=10 * step)
            receipt = parse_webhook(encode(make_body(alert_list, group_key=group)), at)
            async with engine.begin() as conn:
                await record_receipts(conn, [receipt])
            if step % 3 == 2:  # the planner runs behind the intake: batches of several
                await PolicyWorker(engine, plan, clock=lambda at=at: at).drain()
        end = BASE_TIME + timedelta(hours=1)
        await PolicyWorker(engine, plan, clock=lambda: end).drain()
        async with engine.begin() as conn:
            await plan.tick(conn, end + timedelta(hours=1))  # held resolutions, follow-ups

        async with engine.connect() as conn:
            stored = set((await conn.execute(select(alerts.c.id))).scalars())
            member = (await conn.execute(select(incident_alerts.c.alert_id))).scalars().all()
            counted = dict(
                (
                    await conn.execute(
                        select(incident_alerts.c.incident_id, func.count()).group_by(
                            incident_alerts.c.incident_id
                        )
                    )
                ).all()
            )
            rows = (await conn.execute(select(incidents))).all()
        assert set(member) == stored, "alerts in = alerts in incidents"
        assert len(member) == len(set(member)), "in exactly one"
        for row in rows:
            assert row.alerts_total == counted.get(row.id, 0), row
            assert 0 <= row.alerts_firing <= row.alerts_total
            assert row.status == "firing" or row.alerts_firing == 0
    finally:
        await engine.dispose()


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(webhooks())
def test_every_alert_is_in_exactly_one_incident(
    case: tuple[str, list[tuple[str, list[dict[str, Any]]]]],
) -> None:
    grouping, stream = case
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(replay(Path(folder) / "store.db", grouping, stream))
