"""Phone escalation across policy batches, on SQLite and the real PostgreSQL.

The policy plans changes in batches; a backlog (or a restart) can bring an alert's firing and
its resolve into one batch. Resolved incidents must neither keep calling nor pile up in the
escalation state, whose every change is planned on the event loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.alerts import Person, Priority
from trainsentry.gateway.policy.escalation import (
    EscalationPolicy,
    EscalationState,
    Escalator,
    Layer,
    Roster,
    new_state,
)
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.steps import plan_steps
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.gateway.stages.services.ack import AckService
from trainsentry.gateway.stages.services.paging import ESCALATION_KEY, ESCALATION_SCOPE, Paging
from trainsentry.store.policy_state import load_states, save_states
from trainsentry.store.schema import notifications, policy_state
from trainsentry.store.writes import record_receipts

ESCALATOR = Escalator(
    Roster(
        (
            Layer("primary", (Person("alice", phone="+8613800000001"),)),
            Layer("secondary", (Person("bob", phone="+8613800000002"),)),
        )
    ),
    EscalationPolicy(ack_timeout=timedelta(minutes=5)),
)
P0 = {"priority": "P0"}


async def intake(engine: AsyncEngine, alert_dicts: list[dict[str, Any]], at_s: int = 0) -> None:
    receipt = parse_webhook(
        encode(make_body(alert_dicts)), received_at=BASE_TIME + timedelta(seconds=at_s)
    )
    async with engine.begin() as conn:
        await record_receipts(conn, [receipt])


async def plan_all(engine: AsyncEngine, paging: Paging, at_s: int) -> None:
    plan = PolicyPlan(load_policy(), channels=("phone",), steps=plan_steps(paging=paging))
    now = BASE_TIME + timedelta(seconds=at_s)
    await PolicyWorker(engine, plan, clock=lambda: now).drain()
    async with engine.begin() as conn:  # the ticker's turn: due escalation steps
        await plan.tick(conn, now)


async def ringing_calls(engine: AsyncEngine) -> list[tuple[int, str]]:
    """Call rows that were or will be sent."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(notifications.c.alert_id, notifications.c.status).where(
                notifications.c.kind == "call",
                notifications.c.status.in_(("pending", "sending", "sent")),
            )
        )
        return [(int(row.alert_id), row.status) for row in rows]


async def escalation_row(engine: AsyncEngine) -> tuple[dict[str, Any], Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(policy_state.c.state, policy_state.c.due_at).where(
                    policy_state.c.scope == ESCALATION_SCOPE,
                    policy_state.c.key == ESCALATION_KEY,
                )
            )
        ).one()
        return dict(row.state), row.due_at


async def test_fire_and_resolve_in_one_batch_never_calls(engine: AsyncEngine) -> None:
    """Both changes wait in the inbox (a backlog, a restart); planned together on SQLite, one
    after the other on PostgreSQL (its claim takes one change per fingerprint at a time)."""
    paging = Paging(ESCALATOR)
    await intake(engine, [make_alert(1, labels=P0)])
    await intake(engine, [make_alert(1, status="resolved", labels=P0)], at_s=30)
    await plan_all(engine, paging, at_s=60)
    await plan_all(engine, paging, at_s=60 + 600)  # past every layer's ack timeout
    assert await ringing_calls(engine) == []
    state, due_at = await escalation_row(engine)
    assert state["incidents"] == {} and due_at is None


async def test_resolved_incident_is_forgotten_and_a_late_ack_still_answers(
    engine: AsyncEngine,
) -> None:
    paging = Paging(ESCALATOR)
    await intake(engine, [make_alert(1, labels=P0)])
    await plan_all(engine, paging, at_s=0)
    assert await ringing_calls(engine) == [(1, "pending")]
    state, _ = await escalation_row(engine)
    assert state["incidents"]["1"]["status"] == "open"

    await intake(engine, [make_alert(1, status="resolved", labels=P0)], at_s=60)
    await plan_all(engine, paging, at_s=60)
    state, due_at = await escalation_row(engine)
    assert state["incidents"] == {} and due_at is None

    now = BASE_TIME + timedelta(minutes=2)
    acks = AckService(engine, channels=("phone",), clock=lambda: now, paging=paging)
    result = await acks.acknowledge(1, "bob")
    assert result is not None
    assert (result.status, result.acked_by, result.already_acked) == ("resolved", "bob", False)
    assert not result.escalation_stopped


async def test_a_batch_of_resolves_drops_exactly_the_paged_alerts_incidents(
    engine: AsyncEngine,
) -> None:
    """2,000 escalated alerts still firing (or acked); a batch of 400 resolves, 100 of them of
    paged alerts. Before, resolved incidents stayed forever and every resolve copied the whole
    state (~9 s of blocked event loop for this batch; now one copy per batch)."""
    now = BASE_TIME
    state = ESCALATOR.open(new_state(), 0, Priority.P0, now)
    state, _ = ESCALATOR.plan(state, now)
    first = replace(state.incidents[0], calls=())
    state = EscalationState(dict.fromkeys(range(2000), first))
    async with engine.begin() as conn:
        await save_states(conn, ESCALATION_SCOPE, {ESCALATION_KEY: (state.to_json(), None)}, now)

    paging = Paging(ESCALATOR)
    resolved = list(range(100)) + list(range(10_000, 10_300))
    later = now + timedelta(minutes=1)
    async with engine.begin() as conn:
        await paging.page(conn, [], resolved, later)
    async with engine.connect() as conn:
        incidents = (await load_states(conn, ESCALATION_SCOPE, [ESCALATION_KEY]))[ESCALATION_KEY]
    assert sorted(map(int, incidents["incidents"])) == list(range(100, 2000))


async def test_an_ack_waits_for_the_policy_transaction_in_progress(engine: AsyncEngine) -> None:
    """On SQLite a transaction reads before it takes the write lock: the ticker could plan the
    next call from the state it read, then write it back over an ack committed meanwhile. The
    ack takes the policy's lock, as the policy worker and the ticker do."""
    paging = Paging(ESCALATOR)
    await intake(engine, [make_alert(1, labels=P0)])
    await plan_all(engine, paging, at_s=0)
    policy_lock = asyncio.Lock()
    now = BASE_TIME + timedelta(minutes=1)
    acks = AckService(engine, channels=(), clock=lambda: now, paging=paging, lock=policy_lock)
    async with policy_lock:  # a policy transaction (the ticker) is running
        ack = asyncio.create_task(acks.acknowledge(1, "alice"))
        await asyncio.sleep(0.3)
        assert not ack.done(), "the ack must wait for the policy transaction"
    result = await ack
    assert result is not None and result.escalation_stopped


async def test_an_alert_acked_before_its_firing_is_planned_never_calls(
    engine: AsyncEngine,
) -> None:
    """The firing waits in the inbox (a backlog, a restart) while someone acks the alert."""
    paging = Paging(ESCALATOR)
    # two causes: two incidents (one alert of one incident acked, the other's still pages)
    await intake(engine, [make_alert(1, labels=P0), make_alert(2, labels=P0, name="NodeDown")])
    now = BASE_TIME + timedelta(seconds=10)
    acks = AckService(engine, channels=("console",), clock=lambda: now, paging=paging)
    assert await acks.acknowledge(1, "alice") is not None
    await plan_all(engine, paging, at_s=20)
    assert await ringing_calls(engine) == [(2, "pending")]


async def test_an_ack_card_follows_the_alerts_own_cards(engine: AsyncEngine) -> None:
    """The outbox keeps order within a group: the ack shares the alert cards' group."""
    await intake(engine, [make_alert(1, labels=P0)])
    channels = ("console", "feishu_bot")  # the ack goes where the alert's cards went
    plan = PolicyPlan(load_policy(), channels=channels)
    await PolicyWorker(engine, plan, clock=lambda: BASE_TIME).drain()
    acks = AckService(engine, channels=channels, clock=lambda: BASE_TIME)
    await acks.acknowledge(1, "alice")
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(notifications.c.channel, notifications.c.kind, notifications.c.group_key)
            )
        ).all()
    groups = {(channel, kind): group for channel, kind, group in rows}
    assert groups[("console", "ack")] == groups[("console", "alert")]
    assert ("feishu_bot", "ack") in groups, "a bot-only team sees the ack too"
