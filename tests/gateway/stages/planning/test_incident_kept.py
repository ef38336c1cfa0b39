"""The planner keeps the incidents it wrote (issue 46: a storm's incident is a megabyte of
JSON that every batch read and decoded again): a batch that finds a row still holding the
text it wrote takes the state it kept instead. That changes nothing: whatever webhooks
arrive, the incidents, memberships and notifications written are those of a planner that
decodes every row, and a kept state equals the one decoded from its row."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from sqlalchemy import event, select

from tests.gateway.stages.planning.test_incident_property import POLICIES, webhooks
from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning import incidents as ledger_module
from trainsentry.gateway.stages.planning.incidents import as_loaded, state_of
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.store import create_engine, migrate
from trainsentry.store.engine import Engine
from trainsentry.store.incidents import StoredIncident, acknowledge_incident
from trainsentry.store.schema import alert_events, alerts, incident_alerts, incidents, notifications
from trainsentry.store.writes import record_receipts


async def _written(engine: Engine) -> dict[str, Any]:
    """Everything the planning wrote about incidents and notices, comparable across runs."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(incidents).order_by(incidents.c.id))).all()
        members = (await conn.execute(select(incident_alerts))).all()
        notes = (
            await conn.execute(
                select(
                    notifications.c.channel,
                    notifications.c.idempotency_key,
                    notifications.c.payload,
                ).order_by(notifications.c.id)
            )
        ).all()
    return {
        "incidents": [tuple(r) for r in rows],
        "members": sorted(tuple(m) for m in members),
        "notifications": [tuple(n) for n in notes],
    }


async def _check_kept(engine: Engine, plan: PolicyPlan) -> None:
    """Each kept state whose row still holds its text equals the state decoded from it."""
    kept = plan.incidents.kept()
    async with engine.connect() as conn:
        rows = {
            r.id: r
            for r in (
                await conn.execute(select(incidents.c.id, incidents.c.state, incidents.c.acked_by))
            ).all()
        }
    for incident_id, state in kept.items():
        row = rows[incident_id]
        decoded = state_of(StoredIncident(row.id, dict(row.state), row.acked_by, None))
        assert as_loaded(state, row.acked_by) == decoded


async def _replay(
    db: Path, grouping: str, stream: list[tuple[str, list[dict[str, Any]]]], keep: bool
) -> dict[str, Any]:
    engine = create_engine(f"sqlite:///{db}")
    try:
        await migrate(engine)
        plan = PolicyPlan(POLICIES[grouping], channels=("console", "feishu_bot", "phone"))
        for step, (group, alert_list) in enumerate(stream):
            at = BASE_TIME + timedelta(seconds=10 * step)
            receipt = parse_webhook(encode(make_body(alert_list, group_key=group)), at)
            async with engine.begin() as conn:
                await record_receipts(conn, [receipt])
            if step % 3 == 2:
                if not keep:
                    plan.incidents.forget()  # every row decoded
                await PolicyWorker(engine, plan, clock=lambda at=at: at).drain()
                if keep:
                    await _check_kept(engine, plan)
        end = BASE_TIME + timedelta(hours=1)
        if not keep:
            plan.incidents.forget()
        await PolicyWorker(engine, plan, clock=lambda: end).drain()
        async with engine.begin() as conn:
            await plan.tick(conn, end + timedelta(hours=1))
        return await _written(engine)
    finally:
        await engine.dispose()


async def _plan_storm_batch(engine: Engine, plan: PolicyPlan, batch: int) -> datetime:
    """Batch `batch` of a storm of one Alertmanager group: 10 new DiskFull alerts recorded,
    10 s after the batch before, then planned; returns its time."""
    at = BASE_TIME + timedelta(seconds=10 * batch)
    body = make_body(
        [make_alert(batch * 10 + i, name="DiskFull") for i in range(10)], group_key="storm"
    )
    async with engine.begin() as conn:
        await record_receipts(conn, [parse_webhook(encode(body), at)])
    await PolicyWorker(engine, plan, clock=lambda: at).drain()
    return at


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(webhooks())
def test_kept_incidents_write_what_decoded_ones_write(
    case: tuple[str, list[tuple[str, list[dict[str, Any]]]]],
) -> None:
    grouping, stream = case
    with tempfile.TemporaryDirectory() as tmp:
        kept = asyncio.run(_replay(Path(tmp) / "kept.db", grouping, stream, keep=True))
        decoded = asyncio.run(_replay(Path(tmp) / "decoded.db", grouping, stream, keep=False))
    assert kept == decoded


async def test_a_storm_incident_is_decoded_once_and_an_ack_is_read_from_its_column(
    tmp_path: Path,
) -> None:
    """Three batches of one group: the incident is decoded by none of them after it opened
    (the kept state is taken), and an ack between batches is the kept state's (the ack
    writes its columns only, never the state's text)."""
    engine = create_engine(f"sqlite:///{tmp_path / 'kept.db'}")
    await migrate(engine)
    plan = PolicyPlan(load_policy(), channels=("console",))
    decoded: list[int] = []
    original = ledger_module.state_of

    def counting(stored: StoredIncident) -> Any:
        decoded.append(stored.id)
        return original(stored)

    try:
        ledger_module.state_of = counting  # type: ignore[assignment]
        for batch in range(3):
            at = await _plan_storm_batch(engine, plan, batch)
            if batch == 0:
                (incident_id,) = plan.incidents.kept()
                async with engine.begin() as conn:
                    await acknowledge_incident(conn, incident_id, "alice", at)
        (state,) = plan.incidents.kept().values()
    finally:
        ledger_module.state_of = original  # type: ignore[assignment]
        await engine.dispose()
    assert decoded == []
    assert plan.incidents.kept_hits == 2
    assert state.acked_by == "alice"


async def test_alerts_joining_an_acked_incident_are_acked_and_others_cost_no_ack_query(
    tmp_path: Path,
) -> None:
    """Issue 46: a batch whose alerts join only incidents it read unacknowledged asks the
    store for no joined acks (one query per storm batch saved); once the incident is
    acknowledged, the alerts that join it are acknowledged as they join, by its
    acknowledger, each with its `acked` event."""
    engine = create_engine(f"sqlite:///{tmp_path / 'acks.db'}")
    await migrate(engine)
    plan = PolicyPlan(load_policy(), channels=("console",))
    asked: list[int] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "incidents.acked_at IS NOT NULL" in statement:
            asked.append(1)

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    per_batch = []
    try:
        for batch in range(4):
            at = await _plan_storm_batch(engine, plan, batch)
            per_batch.append(len(asked))
            if batch == 1:
                (incident_id,) = plan.incidents.kept()
                async with engine.begin() as conn:
                    await acknowledge_incident(conn, incident_id, "alice", at)
        async with engine.connect() as conn:
            acked = dict(
                (await conn.execute(select(alerts.c.fingerprint, alerts.c.acked_by))).all()
            )
            joined = (
                await conn.execute(
                    select(alert_events.c.detail).where(alert_events.c.kind == "acked")
                )
            ).scalars()
            joined_acks = [d for d in joined if d.get("joined")]
    finally:
        await engine.dispose()
    assert per_batch == [0, 0, 1, 2]  # no look until the incident was acknowledged
    assert all(who == "alice" for who in acked.values()), acked
    assert len(joined_acks) == 20  # the 20 alerts of batches 2 and 3
