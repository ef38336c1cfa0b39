"""Per-fingerprint state machine: every path, table-driven, with a JSON round trip per step."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.policy.factory import at, expire, fire, resolve
from trainsentry.alerts import AlertChange, AlertStatus
from trainsentry.gateway.policy import dedup
from trainsentry.gateway.policy.dedup import Decision, FingerprintState, Notice, Suppression
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy

# R=3600 K=4 T=900 H=600, as shipped.
POLICY = load_policy()


@dataclass(frozen=True)
class Tick:
    when: float


Step = AlertChange | Tick


def run(
    steps: list[Step], policy: Policy = POLICY
) -> tuple[FingerprintState | None, list[Decision]]:
    """Feeds steps through the state machine; the state goes through JSON between steps."""
    state: FingerprintState | None = None
    out: list[Decision] = []
    for step in steps:
        if isinstance(step, Tick):
            assert state is not None
            state, decisions = dedup.tick(state, at(step.when))
        else:
            state, decisions = dedup.advance(state, step, policy, step.at)
        out.extend(decisions)
        state = FingerprintState.from_json(json.loads(json.dumps(state.to_json())))
    return state, out


def outcome(decisions: list[Decision]) -> list[str]:
    return [d.notice.value if d.notice else f"-{d.suppressed}" for d in decisions]


R = POLICY.dedup.recurrence_window
H = POLICY.dedup.flap_hold

PATHS: list[tuple[str, list[Step], list[str]]] = [
    ("new firing notifies", [fire(0)], ["firing"]),
    ("repeats of an unchanged alert are silent",
     [fire(0), fire(30, 0), fire(60, 0), fire(90, 0)],
     ["firing", "-repeat", "-repeat", "-repeat"]),
    ("resolve notifies", [fire(0), resolve(60, 0)], ["firing", "resolved"]),
    ("repeated resolve is silent", [fire(0), resolve(60, 0), resolve(90, 0)],
     ["firing", "resolved", "-repeat"]),
    ("resolve of an alert never seen firing is silent", [resolve(60, 0)], ["-resolve-unseen"]),
    ("late replay of the old firing after resolve is stale",
     [fire(0), resolve(60, 0), fire(70, 0)], ["firing", "resolved", "-stale"]),
    ("out of order: resolved before firing of the same occurrence",
     [resolve(60, 0), fire(61, 0)], ["-resolve-unseen", "-stale"]),
    ("older occurrence after a newer one is stale",
     [fire(100), fire(110, 50)], ["firing", "-stale"]),
    ("fires again within R: recurrence, not a page",
     [fire(0), resolve(60, 0), fire(1200)], ["firing", "resolved", "recurrence"]),
    ("fires again after R: a fresh page",
     [fire(0), resolve(60, 0), fire(60 + R + 1)], ["firing", "resolved", "firing"]),
    ("expired firing becomes resolved; a late resolved is a repeat",
     [fire(0), expire(400, 0), resolve(500, 0)], ["firing", "resolved", "-repeat"]),
    ("new occurrence while still firing (missed resolve) is silent",
     [fire(0), fire(500, 400), resolve(600, 0), resolve(610, 400)],
     ["firing", "-repeat", "-stale", "resolved"]),
    # issue 43 finding 5: a resolve needs the firing it resolves
    ("resolve of an occurrence never seen firing resolves nothing",
     [fire(0), resolve(100, 50), resolve(110, 0)], ["firing", "-resolve-unseen", "resolved"]),
    ("K transitions within T: one flapping notice, resolution held",
     [fire(0), resolve(60, 0), fire(120), resolve(180, 120)],
     ["firing", "resolved", "recurrence", "flapping"]),
    ("while flapping, more transitions are silent",
     [fire(0), resolve(60, 0), fire(120), resolve(180, 120), fire(240), resolve(300, 240),
      fire(360)],
     ["firing", "resolved", "recurrence", "flapping", "-flapping", "-held", "-flapping"]),
    ("held resolution is released by the timer after H",
     [fire(0), resolve(60, 0), fire(120), resolve(180, 120), Tick(180 + H - 1),
      Tick(180 + H)],
     ["firing", "resolved", "recurrence", "flapping", "resolved"]),
    ("a late tick releases once",
     [fire(0), resolve(60, 0), fire(120), resolve(180, 120), Tick(9999), Tick(99999)],
     ["firing", "resolved", "recurrence", "flapping", "resolved"]),
    ("firing during the hold cancels it; the next resolve is held again",
     [fire(0), resolve(60, 0), fire(120), resolve(180, 120), fire(300), resolve(400, 300),
      Tick(400 + H)],
     ["firing", "resolved", "recurrence", "flapping", "-flapping", "-held", "resolved"]),
    ("slow transitions (spaced beyond T) never flap",
     [fire(0), resolve(1000, 0), fire(2000), resolve(3000, 2000), fire(4000),
      resolve(5000, 4000)],
     ["firing", "resolved", "recurrence", "resolved", "recurrence", "resolved"]),
    ("after a released flap episode the count starts again",
     [fire(0), resolve(60, 0), fire(120), resolve(180, 120), Tick(180 + H), fire(1000),
      resolve(1060, 1000)],
     ["firing", "resolved", "recurrence", "flapping", "resolved", "recurrence", "resolved"]),
]  # fmt: skip


@pytest.mark.parametrize(("steps", "expected"), [p[1:] for p in PATHS], ids=[p[0] for p in PATHS])
def test_state_machine_paths(steps: list[Step], expected: list[str]) -> None:
    _, decisions = run(steps)
    assert outcome(decisions) == expected


def test_recurrence_count_grows_and_resets_after_a_fresh_page() -> None:
    policy = merge_policy(POLICY, {"dedup": {"flap_transitions": 50}})
    steps: list[Step] = [fire(0)]
    for i in range(1, 4):
        steps += [resolve(i * 1000 - 500, (i - 1) * 1000), fire(i * 1000)]
    steps += [resolve(3500, 3000), fire(3500 + R + 10)]
    _, decisions = run(steps, policy)
    notices = [(d.notice, d.recurrences) for d in decisions if d.notice is not Notice.RESOLVED]
    assert notices == [
        (Notice.FIRING, 0),
        (Notice.RECURRENCE, 1),
        (Notice.RECURRENCE, 2),
        (Notice.RECURRENCE, 3),
        (Notice.FIRING, 0),
    ]


def test_flapping_notice_carries_the_count_and_the_hold() -> None:
    state, decisions = run([fire(0), resolve(60, 0), fire(120), resolve(180, 120)])
    flap = decisions[-1]
    assert flap.notice is Notice.FLAPPING
    assert flap.flap_transitions == 4
    assert flap.held_until == at(180 + H)
    assert state is not None and state.flapping and state.hold_until == at(180 + H)
    assert state.status is AlertStatus.RESOLVED


def test_decide_releases_a_due_hold_before_the_change() -> None:
    state, _ = run([fire(0), resolve(60, 0), fire(120), resolve(180, 120)])
    assert state is not None
    late = fire(180 + H + 30)
    new_state, decisions = dedup.advance(state, late, POLICY, late.at)
    assert [(d.notice, d.released) for d in decisions] == [
        (Notice.RESOLVED, True),
        (Notice.RECURRENCE, False),
    ]
    assert decisions[0].at == at(180 + H)  # timed by the hold, not by the clock
    assert not new_state.flapping


def test_expired_is_marked() -> None:
    _, decisions = run([fire(0), expire(400, 0)])
    assert decisions[-1].notice is Notice.RESOLVED and decisions[-1].expired


def test_tick_without_hold_changes_nothing() -> None:
    state, _ = run([fire(0)])
    assert state is not None
    assert dedup.tick(state, at(10**6)) == (state, [])


def test_state_of_another_fingerprint_is_refused() -> None:
    state, _ = run([fire(0)])
    with pytest.raises(ValueError, match="fp-1"):
        dedup.advance(state, fire(10, fingerprint="fp-2"), POLICY, at(10))


def test_state_json_is_small_and_round_trips() -> None:
    steps: list[Step] = [fire(0)]
    for i in range(1, 200):  # a long flapping history stays bounded
        steps.append(resolve(i * 2 - 1, (i - 1) * 2) if i % 2 else fire(i * 2))
    state, _ = run(steps)
    assert state is not None
    encoded = json.dumps(state.to_json())
    assert len(encoded) < 20_000
    assert FingerprintState.from_json(json.loads(encoded)) == state


def test_suppression_reasons_are_stable_strings() -> None:
    # Metrics and docs use these names.
    assert {s.value for s in Suppression} == {
        "repeat",
        "stale",
        "flapping",
        "held",
        "resolve-unseen",
    }


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "collapsed": st.booleans(),
            "alert_id": st.none() | st.integers(0, 10**9),
            "context": st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
        },
    )
)
def test_amended_is_replace_for_every_field(changes: dict[str, Any]) -> None:
    """`FingerprintState.amended` (issue 46: decide.py's copy per firing change) is
    `dataclasses.replace`: every field set off its default is kept (a field added to the
    state and not to `amended` fails here), the changed ones taken."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    state = FingerprintState(
        fingerprint="fp",
        status=AlertStatus.RESOLVED,
        occurrence=start,
        changed_at=start + timedelta(seconds=1),
        resolved_at=start + timedelta(seconds=2),
        recurrences=3,
        transitions=(start, start + timedelta(seconds=1)),
        flapping=True,
        hold_until=start + timedelta(seconds=3),
        expired=True,
        collapsed=True,
        alert_id=7,
        context={"alert": {"fingerprint": "fp"}},
    )
    before = start - timedelta(days=1)
    defaults = FingerprintState("x", AlertStatus.FIRING, before, before)
    assert all(
        getattr(state, f.name) != getattr(defaults, f.name)
        for f in fields(FingerprintState)
        if f.name != "fingerprint"
    )
    assert state.amended(changes) == replace(state, **changes)
    assert state.amended({**changes, "recurrences": 9}) == replace(state, **changes, recurrences=9)
