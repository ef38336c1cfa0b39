"""Escalation policies over schedules, pure, on virtual time: who each step calls (the
schedule's person at the time of the call, handoffs and overrides included), the waits, the
repeats, "call every X minutes until acknowledged", steps over a gap in the schedule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from trainsentry.alerts import Priority
from trainsentry.gateway.policy.escalation import (
    ACKED,
    EXHAUSTED,
    Escalator,
    IncidentPage,
    acknowledge,
    batch,
    escalate_now,
    new_state,
    plan,
)
from trainsentry.gateway.policy.roster import escalator_of
from trainsentry.oncall.changes import with_changes
from trainsentry.oncall.config import parse_oncall
from trainsentry.oncall.types import Override

T0 = datetime(2026, 10, 24, 18, 0, tzinfo=UTC)  # 20:00 in Berlin, the night layer starts
SECTION = """
people: {alice: {phone: "+4915100000001"}, bob: {}, dave: {phone: "+4915100000004"}, lead: {}}
schedules:
  s:
    timezone: Europe/Berlin
    layers:
      - {name: primary, start: "2026-10-19T09:00", shift: 1w, members: [alice, bob]}
      - {name: nights, start: "2026-10-19T20:00", shift: 1d, members: [dave],
         restrict: {hours: "20:00-22:00"}}
"""


def policy(**fields: Any) -> dict[str, Any]:
    return {"steps": [{"schedule": "s", "wait_minutes": 10}, {"people": ["lead"]}], **fields}


def escalator(raw: dict[str, Any], overrides: tuple[Override, ...] = ()) -> Escalator:
    config = parse_oncall({**yaml.safe_load(SECTION), "escalation_policies": {"p": raw}})
    schedules = {"s": with_changes(config.schedules["s"], overrides)}
    return escalator_of(config.escalation_policies["p"], config, schedules)


def run(esc: Escalator, minutes: int, every: int = 1) -> list[tuple[int, str]]:
    """(minute, person) of every call placed in `minutes` of virtual time."""
    state, _ = batch(
        new_state(),
        T0,
        pages=[IncidentPage(1, Priority.P1, "x", "p")],
        roster=esc.roster,
        policy=esc.policy,
        named={"p": esc},
    )
    calls = [(0, c.person.name) for c in _first_calls(esc)]
    for minute in range(every, minutes + 1, every):
        state, due = plan(
            state,
            T0 + timedelta(minutes=minute),
            roster=esc.roster,
            policy=esc.policy,
            named={"p": esc},
        )
        calls += [(minute, c.person.name) for c in due]
    return calls


def _first_calls(esc: Escalator) -> list[Any]:
    _, due = batch(
        new_state(),
        T0,
        pages=[IncidentPage(1, Priority.P1, "x", "p")],
        roster=esc.roster,
        policy=esc.policy,
        named={"p": esc},
    )
    return due


def test_the_schedules_person_then_the_lead_after_the_wait() -> None:
    # 20:00 Berlin: the night layer (dave) comes first; after 10 minutes the lead; then done.
    assert run(escalator(policy()), 60) == [(0, "dave"), (10, "lead")]


def test_the_person_is_resolved_at_the_time_of_each_call() -> None:
    # Twice over, 60 minutes apart: at 22:00 the night layer ends, so the second pass calls
    # alice (primary), not dave.
    raw = policy(repeat=2)
    raw["steps"] = [{"schedule": "s", "wait_minutes": 60}, {"people": ["lead"], "wait_minutes": 60}]
    assert run(escalator(raw), 240) == [(0, "dave"), (60, "lead"), (120, "alice"), (180, "lead")]


def test_an_override_is_who_the_first_step_calls() -> None:
    bob_covers = Override("bob", T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    assert run(escalator(policy(), (bob_covers,)), 15)[0] == (0, "bob")


def test_call_every_x_minutes_until_acknowledged_within_its_limit() -> None:
    raw = policy(call_every_minutes=5, stop_after_hours=1)
    calls = run(escalator(raw), 120)
    # dave at 0, the lead at 10, then the lead every 5 minutes until an hour after the first
    assert calls[:2] == [(0, "dave"), (10, "lead")]
    assert [minute for minute, who in calls[2:]] == list(range(15, 61, 5))
    assert {who for _, who in calls[2:]} == {"lead"}


def test_an_ack_stops_it_and_the_state_says_who() -> None:
    esc = escalator(policy(call_every_minutes=5))
    state, _ = batch(
        new_state(),
        T0,
        pages=[IncidentPage(1, Priority.P0, "x", "p")],
        roster=esc.roster,
        policy=esc.policy,
        named={"p": esc},
    )
    state = acknowledge(state, 1, "dave", T0 + timedelta(minutes=3))
    state, due = plan(
        state, T0 + timedelta(hours=3), roster=esc.roster, policy=esc.policy, named={"p": esc}
    )
    assert due == [] and state.incidents[1].status == ACKED
    assert state.incidents[1].acked_by == "dave"


def test_a_step_with_nobody_on_call_is_passed_over_at_once() -> None:
    raw = {"steps": [{"schedule": "s", "position": 3}, {"people": ["lead"]}]}  # nobody third
    assert run(escalator(raw), 30) == [(0, "lead")]


def test_escalate_now_makes_the_next_step_due() -> None:
    esc = escalator(policy())
    state, _ = batch(
        new_state(),
        T0,
        pages=[IncidentPage(1, Priority.P0, "x", "p")],
        roster=esc.roster,
        policy=esc.policy,
        named={"p": esc},
    )
    state = escalate_now(state, 1, T0 + timedelta(minutes=1))
    state, due = plan(
        state, T0 + timedelta(minutes=1), roster=esc.roster, policy=esc.policy, named={"p": esc}
    )
    assert [c.person.name for c in due] == ["lead"]
    state, due = plan(
        state, T0 + timedelta(hours=1), roster=esc.roster, policy=esc.policy, named={"p": esc}
    )
    assert due == [] and state.incidents[1].status == EXHAUSTED


def test_a_page_without_a_policy_name_follows_the_default_roster() -> None:
    esc = escalator(policy())
    default = Escalator(esc.roster.__class__(()), esc.policy)
    state, due = batch(
        new_state(),
        T0,
        pages=[IncidentPage(1, Priority.P0, "x", "")],
        roster=default.roster,
        policy=default.policy,
        named={"p": esc},
    )
    assert due == [] and state.incidents[1].status == EXHAUSTED
