"""Property: folding a batch's changes into each job's mutable storm state (`fold_into`,
storm_fold.py, what the planner does) gives exactly what planning them alert by alert gives
(a batch of one each, the storm state frozen between them: tests/gateway/policy/planned.py):
the same drafts, decisions, storm messages, counts and fingerprint states per change, and
the same storm states (to the order of their JSON) at the end of every batch. The random
streams cross storms starting, summaries and ends falling due inside a batch, the one P0
page, count maps over `max_keys`, an infrastructure incident and a job's own route."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime, timedelta

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.gateway.policy.factory import at, change
from tests.gateway.policy.planned import decide, plan_change
from trainsentry.alerts import AlertChange, ChangeKind, JobRef
from trainsentry.gateway.policy.decide import ChangeResult, decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.infra import InfraFold, InfraState, Sighting
from trainsentry.gateway.policy.route import JOB_CHANNEL, JobRoute
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy
from trainsentry.gateway.policy.storm import StormState, job_key
from trainsentry.gateway.policy.storm_fold import StormFold

BASE = load_policy()
STORM = {"threshold": 2, "window": 60, "summary_interval": 20, "calm_after": 45}
POLICIES = {
    "stormy": merge_policy(BASE, {"storm": STORM}),
    "narrow": merge_policy(BASE, {"storm": {**STORM, "top_lines": 2, "max_keys": 2}}),
    "no top": merge_policy(BASE, {"storm": {**STORM, "top_lines": 0, "threshold": 1}}),
    "off": merge_policy(BASE, {"storm": {**STORM, "enabled": False}}),
    "flappy": merge_policy(
        BASE, {"storm": STORM, "dedup": {"flap_transitions": 2, "flap_hold": 30}}
    ),
}
CHANNELS = {"feishu", "phone", "console", JOB_CHANNEL}
JOB_ROUTES = {JobRef("team-a", "llm"): JobRoute(feishu=True, owners=("ou_alice",), roster=True)}
PLACE = {"leaf_switch": "leaf-7"}
SEEN = {"leaf_switch=leaf-7": Sighting(frozenset({"n0", "n1", "n2"}), frozenset({"team-a/llm"}))}
FINGERPRINTS = 16


@dataclass(frozen=True)
class Step:
    fingerprint: int
    kind: ChangeKind
    after: int  # seconds after the previous change
    fresh: bool  # a new occurrence of the fingerprint (else its current one)
    priority: str


def labels_of(step: Step) -> dict[str, str]:
    """Two jobs; fingerprints 0-1 are fabric alerts on the leaf switch (infrastructure)."""
    fp = step.fingerprint
    labels = {
        "trainingjob": "llm" if fp % 2 == 0 else "bert",
        "node": f"n{fp}",
        "gpu": str(fp % 3),
        "priority": step.priority,
        "alertname": f"Alert{fp % 3}",
    }
    if fp < 2:
        labels.update(alertname="IBLinkFlapping", component="fabric")
    return labels


steps = st.builds(
    Step,
    fingerprint=st.integers(0, FINGERPRINTS - 1),
    kind=st.sampled_from([ChangeKind.FIRING] * 3 + [ChangeKind.RESOLVED]),
    after=st.sampled_from([0, 0, 0, 0, 0, 1, 2, 5, 30]),
    fresh=st.sampled_from([True, True, True, False]),
    priority=st.sampled_from(["P0", "P1", "P2", "P3"]),
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[list[Step]], list[int], list[bool], str]:
    """The stream cut into planning batches, each planned `late` seconds after its last
    change, some followed by a timer tick."""
    stream = draw(st.lists(steps, min_size=10, max_size=120))
    cuts = sorted(draw(st.sets(st.integers(1, len(stream)), max_size=8)) | {len(stream)})
    groups = [stream[a:b] for a, b in zip([0, *cuts], cuts, strict=False) if b > a]
    late = [draw(st.sampled_from([0, 3, 30])) for _ in groups]
    ticks = [draw(st.booleans()) for _ in groups]
    return groups, late, ticks, draw(st.sampled_from(sorted(POLICIES)))


@dataclass
class States:
    fps: dict[str, FingerprintState]
    storms: dict[str, StormState]
    infra: dict[str, InfraState]


def _changes(groups: list[list[Step]]) -> list[list[AlertChange]]:
    clock, alert_id, out = 0, 0, []
    occurrences: dict[int, int] = {}
    for group in groups:
        batch = []
        for step in group:
            clock += step.after
            alert_id += 1
            started = occurrences.get(step.fingerprint, -1000)
            if step.fresh:
                started = occurrences[step.fingerprint] = clock
            batch.append(
                change(
                    step.kind,
                    clock,
                    occurrence=started,
                    fingerprint=f"fp{step.fingerprint}",
                    labels=labels_of(step),
                    alert_id=alert_id,
                )
            )
        out.append(batch)
    return out


def _infra(ch: AlertChange, states: States, policy: Policy) -> InfraFold | None:
    if ch.alert.labels.get("component") != "fabric":
        return None
    return InfraFold(policy, PLACE, states.infra, SEEN, ch.alert.labels)


def _plan(
    batch: list[AlertChange], states: States, now: datetime, policy: Policy, *, folded: bool
) -> list[ChangeResult]:
    """One planning batch, as the planner runs it (folded: one fold per job for the batch)
    or alert by alert (a batch of one each); each change's incidents drafted after it."""
    results: list[ChangeResult] = []
    folds: dict[str, StormFold] = {}
    for ch in batch:
        key = job_key(ch.alert.labels)
        common = {
            "fingerprint_state": states.fps.get(ch.alert.fingerprint),
            "distinct_nodes_in_window": 1 + ch.alert_id % 3,
            "policy": policy,
            "now": now,
            "channels": CHANNELS,
            "job_routes": JOB_ROUTES,
            "place": PLACE if ch.alert.labels.get("component") else None,
            "infra": _infra(ch, states, policy),
        }
        result: ChangeResult
        if folded:
            if key not in folds:
                stored = states.storms.get(key)
                folds[key] = StormFold.of(stored or StormState.new(ch.alert.labels))
            result = plan_change(folds[key], ch, **common)  # type: ignore[arg-type]
        else:
            decided = decide(ch, storm_state=states.storms.get(key), **common)  # type: ignore[arg-type]
            states.storms[key] = decided.storm_state
            result = decided
        states.fps[ch.alert.fingerprint] = result.fingerprint_state
        states.infra.update(result.infra_states)
        results.append(result)
    states.storms.update((key, fold.freeze()) for key, fold in folds.items())
    return results


def _fields(result: ChangeResult) -> dict[str, object]:
    return {f.name: getattr(result, f.name) for f in fields(ChangeResult)}


def _storm_json(states: States) -> str:
    return json.dumps({k: v.to_json() for k, v in states.storms.items()})


# A burst of one job's alerts past every count map's cap, in two batches.
BURST = [
    Step(n % FINGERPRINTS, ChangeKind.FIRING, n % 2, True, f"P{3 - n % 4}") for n in range(2, 40)
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
@example(([BURST[:15], BURST[15:]], [0, 0], [False, True], "narrow"))
def test_folding_a_batch_equals_deciding_alert_by_alert(
    case: tuple[list[list[Step]], list[int], list[bool], str],
) -> None:
    groups, late, ticks, policy_name = case
    policy = POLICIES[policy_name]
    one, fold = States({}, {}, {}), States({}, {}, {})
    for batch, extra, tick in zip(_changes(groups), late, ticks, strict=True):
        now = batch[-1].at + timedelta(seconds=extra)
        expected = _plan(batch, one, now, policy, folded=False)
        got = _plan(batch, fold, now, policy, folded=True)
        for want, have in zip(expected, got, strict=True):
            assert _fields(have) == _fields(want)
        assert fold.storms == one.storms
        assert _storm_json(fold) == _storm_json(one)  # the stored JSON, key order included
        assert fold.fps == one.fps and fold.infra == one.infra
        if tick:
            later = now + timedelta(seconds=25)
            for states in (one, fold):
                result = decide_tick(
                    list(states.fps.values()),
                    list(states.storms.values()),
                    policy=policy,
                    now=later,
                    channels=CHANNELS,
                    job_routes=JOB_ROUTES,
                )
                states.fps.update(result.fingerprint_states)
                states.storms.update(result.storm_states)
            assert _storm_json(fold) == _storm_json(one)


def test_a_frozen_state_does_not_change_when_its_fold_goes_on() -> None:
    policy = POLICIES["stormy"]
    fold = StormFold.of(StormState.new({"trainingjob": "llm", "namespace": "team-a"}))
    for n in range(4):
        ch = change(ChangeKind.FIRING, n, fingerprint=f"fp{n}", labels={"node": f"n{n}"})
        plan_change(
            fold, ch, fingerprint_state=None, distinct_nodes_in_window=1, policy=policy, now=at(n)
        )
    frozen = fold.freeze()
    before = json.dumps(frozen.to_json())
    assert frozen.active and frozen.tally.total == 2  # two alerts past the threshold
    ch = change(ChangeKind.FIRING, 5, fingerprint="fp9", labels={"node": "n9"})
    plan_change(
        fold, ch, fingerprint_state=None, distinct_nodes_in_window=1, policy=policy, now=at(5)
    )
    assert json.dumps(frozen.to_json()) == before
    assert fold.freeze().tally.total == 3
