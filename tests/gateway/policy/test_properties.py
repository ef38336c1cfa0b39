"""Property: any interleaving and replay of repeated webhooks yields at most one notification
per (fingerprint, status change), and a replay never mints a new idempotency key."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.policy.factory import at, change
from tests.gateway.policy.planned import decide
from trainsentry.alerts import AlertChange, ChangeKind, NotificationDraft
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy
from trainsentry.gateway.policy.storm import StormState, job_key

BASE = load_policy()
POLICIES = {
    "default": BASE,
    "flappy": merge_policy(BASE, {"dedup": {"flap_transitions": 2, "flap_hold": 30}}),
    "stormy": merge_policy(BASE, {"storm": {"threshold": 2, "summary_interval": 20}}),
}
FINGERPRINTS = ("fa", "fb", "fc")


@dataclass(frozen=True)
class TrueChange:
    fingerprint: str
    kind: ChangeKind
    occurrence: float


@st.composite
def timelines(draw: st.DrawFn) -> list[TrueChange]:
    """What really happened: per fingerprint, occurrences that fire and maybe resolve."""
    changes: list[TrueChange] = []
    for fingerprint in draw(st.lists(st.sampled_from(FINGERPRINTS), min_size=1, unique=True)):
        start = 0.0
        for _ in range(draw(st.integers(1, 4))):
            start += draw(st.integers(1, 500))
            changes.append(TrueChange(fingerprint, ChangeKind.FIRING, start))
            end = draw(st.sampled_from([None, ChangeKind.RESOLVED, ChangeKind.EXPIRED]))
            if end is not None:
                changes.append(TrueChange(fingerprint, end, start))
    return changes


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[TrueChange | None], str]:
    """The webhook stream: every true change repeated 1-4 times, shuffled; None = a timer tick."""
    truth = draw(timelines())
    repeated = [c for c in truth for _ in range(draw(st.integers(1, 4)))]
    ticks: list[TrueChange | None] = [None] * draw(st.integers(0, 6))
    stream = draw(st.permutations([*repeated, *ticks]))
    return stream, draw(st.sampled_from(sorted(POLICIES)))


def run(stream: list[TrueChange | None], policy: Policy) -> list[NotificationDraft]:
    fps: dict[str, dict[str, object]] = {}
    storms: dict[str, dict[str, object]] = {}
    drafts: list[NotificationDraft] = []
    for step, item in enumerate(stream):
        now = at(step * 7.0)  # the store stamps changes as they arrive
        if item is None:
            tick = decide_tick(
                [FingerprintState.from_json(s) for s in fps.values()],
                [StormState.from_json(s) for s in storms.values()],
                policy=policy,
                now=now,
            )
            fps.update({k: v.to_json() for k, v in tick.fingerprint_states.items()})
            storms.update({k: v.to_json() for k, v in tick.storm_states.items()})
            drafts.extend(tick.drafts)
            continue
        ch: AlertChange = change(
            item.kind,
            step * 7.0,
            occurrence=item.occurrence,
            fingerprint=item.fingerprint,
            labels={"node": item.fingerprint, "priority": "P0"},
        )
        key = job_key(ch.alert.labels)
        stored_fp, stored_storm = fps.get(item.fingerprint), storms.get(key)
        result = decide(
            ch,
            fingerprint_state=FingerprintState.from_json(stored_fp) if stored_fp else None,
            storm_state=StormState.from_json(stored_storm) if stored_storm else None,
            distinct_nodes_in_window=1,
            policy=policy,
            now=now,
        )
        fps[item.fingerprint] = json.loads(json.dumps(result.fingerprint_state.to_json()))
        storms[key] = json.loads(json.dumps(result.storm_state.to_json()))
        drafts.extend(result.drafts)
    # Drain the timers so held resolutions and summaries come out too.
    final = decide_tick(
        [FingerprintState.from_json(s) for s in fps.values()],
        [StormState.from_json(s) for s in storms.values()],
        policy=policy,
        now=at(len(stream) * 7.0 + 100_000),
    )
    return drafts + final.drafts


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deliveries())
def test_at_most_one_notification_per_status_change(
    case: tuple[list[TrueChange | None], str],
) -> None:
    stream, policy_name = case
    policy = POLICIES[policy_name]
    drafts = run(stream, policy)

    keys = [d.idempotency_key for d in drafts]
    assert len(keys) == len(set(keys)), "a notification was produced twice"

    true_firing = {
        (c.fingerprint, at(c.occurrence).isoformat())
        for c in stream
        if c and c.kind is ChangeKind.FIRING
    }
    true_resolved = {
        (c.fingerprint, at(c.occurrence).isoformat())
        for c in stream
        if c and c.kind is not ChangeKind.FIRING
    }
    per_change: Counter[tuple[str, str, str, str]] = Counter()
    for draft in drafts:
        if draft.kind != "alert":
            continue
        payload = draft.payload
        occurrence = (payload["fingerprint"], payload["starts_at"])
        event = payload["event"]
        if event in ("firing", "recurrence"):
            assert occurrence in true_firing
            per_change[(draft.channel, *occurrence, "firing")] += 1
        elif event == "resolved":
            assert occurrence in true_resolved
            per_change[(draft.channel, *occurrence, "resolved")] += 1
        else:
            assert event == "flapping"
            per_change[(draft.channel, *occurrence, "flapping")] += 1
    assert not [k for k, n in per_change.items() if n > 1]

    if policy_name == "default":
        # Liveness: the first firing each fingerprint delivered was announced.
        first_seen: dict[str, TrueChange] = {}
        for item in stream:
            if item is not None:
                first_seen.setdefault(item.fingerprint, item)
        for fingerprint, first in first_seen.items():
            if first.kind is ChangeKind.FIRING:
                assert (
                    "feishu", fingerprint, at(first.occurrence).isoformat(), "firing"
                ) in per_change  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(deliveries())
def test_replaying_the_whole_stream_adds_nothing(case: tuple[list[TrueChange | None], str]) -> None:
    stream, policy_name = case
    policy = POLICIES[policy_name]
    once = run(stream, policy)
    twice = run(stream + stream, policy)
    # The replay is a second delivery of every webhook: no new keys may appear.
    assert {d.idempotency_key for d in twice} >= {d.idempotency_key for d in once}
    assert len(twice) == len({d.idempotency_key for d in twice})


def test_replaying_a_storm_with_a_held_resolution_adds_nothing() -> None:
    """Found by the property above: fc flaps during a storm, its last resolution is held
    (released at 12:10:42, long after the storm calmed at 12:02:35). The single run releases
    it in the final (late) tick, the replay's webhooks end the storm before that; both must
    announce the same: the storm ends without a card, the release goes into a summary after it."""
    firing, resolved = ChangeKind.FIRING, ChangeKind.RESOLVED
    stream: list[TrueChange | None] = [
        TrueChange("fa", firing, 1.0),
        TrueChange("fa", firing, 2.0),
        TrueChange("fb", firing, 1.0),
        TrueChange("fc", firing, 1.0),
        TrueChange("fc", resolved, 1.0),
        TrueChange("fc", firing, 2.0),
        *[TrueChange("fc", resolved, 2.0)] * 4,
        TrueChange("fc", resolved, 3.0),
        TrueChange("fc", firing, 3.0),
    ]
    policy = POLICIES["stormy"]
    once = run(stream, policy)
    twice = run(stream + stream, policy)
    assert {d.idempotency_key for d in twice} == {d.idempotency_key for d in once}
    events = [d.payload.get("event") for d in once if d.channel == "feishu" and d.kind == "storm"]
    assert events == ["storm_started", "storm_summary", "storm_summary", "storm_summary"]
