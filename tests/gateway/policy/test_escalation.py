"""The pure escalation timeline with an injected clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from trainsentry.alerts import Person, Priority
from trainsentry.config.escalation import EscalationSettings
from trainsentry.gateway.policy.escalation import (
    ACKED,
    EXHAUSTED,
    OPEN,
    CallDue,
    EscalationState,
    Escalator,
    IncidentPage,
    Layer,
    Roster,
    acknowledge,
    new_state,
    next_wakeup,
    postpone,
)
from trainsentry.gateway.policy.escalation import EscalationPolicy as Policy
from trainsentry.gateway.policy.roster import escalation_policy_of, roster_of

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
ALICE, BOB, CAROL, DAVE = (Person(n, phone=f"+1555000{i}") for i, n in enumerate("abcd"))
ROSTER = Roster((Layer("primary", (ALICE,)), Layer("secondary", (BOB, CAROL))))
ESC = Escalator(ROSTER, Policy(ack_timeout=timedelta(minutes=5), calls_per_layer=1))


def who(calls: list[CallDue]) -> list[tuple[int, str, int]]:
    return [(c.alert_id, c.person.name, c.step) for c in calls]


def run(
    esc: Escalator, state: dict[str, Any], minutes: list[float]
) -> tuple[dict[str, Any], list[CallDue]]:
    calls: list[CallDue] = []
    for m in minutes:
        state, due = esc.plan(state, T0 + timedelta(minutes=m))
        calls += due
    return state, calls


def test_layer1_then_layer2_after_timeout_then_exhausted() -> None:
    state = ESC.open(new_state(), 1, Priority.P0, T0)
    state, calls = run(ESC, state, [0, 1, 4.99])
    assert who(calls) == [(1, "a", 0)]
    state, calls = run(ESC, state, [5, 6])
    assert who(calls) == [(1, "b", 1), (1, "c", 1)]
    assert calls[0].layer == "secondary" and calls[0].due_at == T0 + timedelta(minutes=5)
    state, calls = run(ESC, state, [10, 30])
    assert calls == [] and state.incidents[1].status == EXHAUSTED


def test_ack_stops_further_calls() -> None:
    state = ESC.open(new_state(), 1, Priority.P0, T0)
    state, calls = run(ESC, state, [0])
    assert who(calls) == [(1, "a", 0)]
    state = acknowledge(state, 1, "ou_alice", T0 + timedelta(minutes=2))
    state, calls = run(ESC, state, [5, 10, 60])
    assert calls == []
    assert state.incidents[1].status == ACKED
    assert state.incidents[1].acked_by == "ou_alice"
    assert next_wakeup(state) is None


def test_a_resolved_page_is_dropped_and_never_calls() -> None:
    """A page resolved in the batch that opens it, or before its first call, is dropped
    (`batch`, as paging.py runs it): no call at all."""
    page = IncidentPage(1, Priority.P0, "GPU fell off the bus")
    state, calls = ESC.batch(new_state(), T0, pages=[page], resolved=[1])
    assert calls == [] and dict(state.incidents) == {}
    state = ESC.open(new_state(), 1, Priority.P0, T0)
    state, calls = ESC.batch(state, T0, resolved=[1])
    state, later = run(ESC, state, [5, 10])
    assert calls == later == [] and dict(state.incidents) == {}


def test_below_threshold_never_calls() -> None:
    state = new_state()
    for alert_id, priority in ((1, Priority.P1), (2, Priority.P2), (3, Priority.P3)):
        state = ESC.open(state, alert_id, priority, T0)
    state, calls = run(ESC, state, [0, 5, 10])
    assert calls == [] and state.incidents == {}
    esc_p1 = Escalator(ROSTER, Policy(min_priority=Priority.P1))
    state = esc_p1.open(new_state(), 1, Priority.P1, T0)
    state, calls = run(esc_p1, state, [0])
    assert who(calls) == [(1, "a", 0)]


def restart(state: EscalationState) -> EscalationState:
    """What a restart reads back: the persisted JSON of the state."""
    return EscalationState.from_json(json.loads(json.dumps(state.to_json())))


# What a gateway before the typed state persisted (escalation state version 1): an incident
# of a job's own roster that was escalated now once, and one of a named policy, acked.
V1_STATE = {
    "version": 1,
    "incidents": {
        "7": {
            "priority": "P0",
            "status": "open",
            "opened_at": "2026-11-20T10:00:00+00:00",
            "next_step": 1,
            "next_at": "2026-11-20T10:05:00+00:00",
            "stopped_at": None,
            "acked_by": None,
            "calls": [{"step": 0, "layer": "l1", "person": "a", "at": "2026-11-20T10:00:00+00:00"}],
            "text": "trainsentry P0 alert GPUFellOffBus.",
            "roster": "team-a/llm",
            "escalated_by": [{"by": "bob", "at": "2026-11-20T10:01:00+00:00"}],
        },
        "8": {
            "priority": "P1",
            "status": "acked",
            "opened_at": "2026-11-20T10:00:00+00:00",
            "next_step": 1,
            "next_at": None,
            "stopped_at": "2026-11-20T10:02:00+00:00",
            "acked_by": "ou_alice",
            "calls": [],
            "policy": "gpu-p0",
        },
    },
}


def test_the_state_a_gateway_persisted_before_reads_as_typed_and_writes_back_the_same() -> None:
    state = EscalationState.from_json(V1_STATE)
    seven, eight = state.incidents[7], state.incidents[8]
    assert (seven.status, seven.roster, seven.next_step, seven.priority) == (
        OPEN,
        "team-a/llm",
        1,
        Priority.P0,
    )
    assert [(c.person, c.step) for c in seven.calls] == [("a", 0)]
    assert [e.by for e in seven.escalated_by] == ["bob"]
    assert (eight.status, eight.acked_by, eight.policy, eight.next_at) == (
        ACKED,
        "ou_alice",
        "gpu-p0",
        None,
    )
    assert state.to_json() == V1_STATE
    with pytest.raises(ValueError, match="version"):
        EscalationState.from_json({**V1_STATE, "version": 2})
    with pytest.raises(ValueError, match="status"):
        EscalationState.from_json(
            {"version": 1, "incidents": {"1": {**V1_STATE["incidents"]["8"], "status": "x"}}}
        )


def test_restart_midway_resumes_without_duplicate_call() -> None:
    state = ESC.open(new_state(), 1, Priority.P0, T0)
    state, first = ESC.plan(state, T0)
    # The gateway persists the state, dies, and restarts 2 minutes later.
    restored = restart(state)
    restored, again = ESC.plan(restored, T0 + timedelta(minutes=2))
    assert who(first) == [(1, "a", 0)] and again == []
    restored, later = ESC.plan(restored, T0 + timedelta(minutes=5))
    assert who(later) == [(1, "b", 1), (1, "c", 1)]
    keys = [c.idempotency_key for c in first + later]
    assert len(set(keys)) == len(keys)


def test_long_downtime_calls_the_current_step_once() -> None:
    state = ESC.open(new_state(), 1, Priority.P0, T0)
    state, _ = ESC.plan(state, T0)
    state, calls = ESC.plan(restart(state), T0 + timedelta(hours=1))
    assert who(calls) == [(1, "b", 1), (1, "c", 1)]  # not layer 2 *and* exhaustion at once


def test_plan_is_pure_and_idempotency_keys_are_stable() -> None:
    state = ESC.open(new_state(), 9, Priority.P0, T0)
    snapshot = json.dumps(state.to_json(), sort_keys=True)
    _, a = ESC.plan(state, T0)
    _, b = ESC.plan(state, T0)
    assert json.dumps(state.to_json(), sort_keys=True) == snapshot
    assert [c.idempotency_key for c in a] == [c.idempotency_key for c in b] == ["esc:9:0:a"]


def test_calls_again_before_next_layer_and_rotation() -> None:
    rotating = Layer("primary", (ALICE, DAVE), rotation_start=T0 - timedelta(hours=1),
                     shift=timedelta(hours=12))  # fmt: skip
    esc = Escalator(Roster((rotating, Layer("mgr", (BOB,)))), Policy(calls_per_layer=2))
    state = esc.open(new_state(), 1, Priority.P0, T0)
    state, calls = run(esc, state, [0, 5, 10])
    assert who(calls) == [(1, "a", 0), (1, "a", 1), (1, "b", 2)]
    # Twelve hours later the rotation hands layer 1 to Dave.
    later = T0 + timedelta(hours=12)
    state = acknowledge(state, 1, "ou_bob", later)
    state = esc.open(state, 2, Priority.P0, later)
    state, calls = esc.plan(state, later)
    assert who(calls) == [(2, "d", 0)]


def test_several_incidents_and_forgetting_old_ones() -> None:
    state = ESC.open(new_state(), 1, Priority.P0, T0)
    state = ESC.open(state, 2, Priority.P0, T0 + timedelta(minutes=1))
    state, calls = run(ESC, state, [0, 1])
    assert who(calls) == [(1, "a", 0), (2, "a", 0)]
    assert next_wakeup(state) == T0 + timedelta(minutes=5)
    state = acknowledge(state, 1, "ou_alice", T0 + timedelta(minutes=2))
    later = T0 + timedelta(minutes=3)
    state, calls = ESC.batch(state, later, forget_before=later)  # as paging.py runs it
    assert list(state.incidents) == [2] and calls == []


def test_roster_from_settings() -> None:
    settings = EscalationSettings.model_validate(
        {
            "ack_timeout_min": 3,
            "calls_per_layer": 2,
            "layers": [
                {"name": "sre", "members": [{"name": "a", "phone": "+1"}, {"name": "b"}],
                 "rotation_start": "2026-11-01T00:00:00", "shift_hours": 24},
                {"name": "lead", "members": [{"name": "c", "feishu_open_id": "ou_c"}]},
            ],
        }
    )  # fmt: skip
    roster, policy = roster_of(settings), escalation_policy_of(settings)
    assert policy.ack_timeout == timedelta(minutes=3) and policy.calls_per_layer == 2
    assert roster.layers[0].on_call(datetime(2026, 11, 2, 1, tzinfo=UTC))[0].name == "b"
    assert roster.layers[1].on_call(T0)[0].feishu_open_id == "ou_c"


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        ESC.open(new_state(), 1, Priority.P0, datetime(2026, 1, 1))


def test_a_held_page_postpones_the_next_step() -> None:
    """A checkpoint within its limit: layer 1's call waits in the outbox until minute 30, so
    layer 2 comes an ack timeout after that, not at minute 5; a stopped incident stays."""
    state, calls = run(ESC, ESC.open(new_state(), 1, Priority.P0, T0), [0])
    assert who(calls) == [(1, "a", 0)]
    state = postpone(state, 1, T0 + timedelta(minutes=35))
    assert next_wakeup(state) == T0 + timedelta(minutes=35)
    state, calls = run(ESC, state, [5, 34.9])
    assert calls == []
    state, calls = run(ESC, state, [35])
    assert who(calls) == [(1, "b", 1), (1, "c", 1)]
    # never earlier than already planned, and an acked incident is left alone
    later = postpone(state, 1, T0)
    assert next_wakeup(later) == next_wakeup(state)
    acked = acknowledge(state, 1, "alice", T0 + timedelta(minutes=36))
    assert postpone(acked, 1, T0 + timedelta(hours=2)) == acked
