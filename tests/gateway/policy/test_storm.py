"""Storm collapse: job keys, entering/leaving storm mode, summaries, and the 20,000-alert storm."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict, deque
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.policy.factory import at, fire, make_alert, resolve
from tests.gateway.policy.planned import decide
from trainsentry.alerts import AlertChange, AlertStatus, JobRef, NotificationDraft, Priority
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.incident import IncidentBook
from trainsentry.gateway.policy.rules import load_policy, merge_policy
from trainsentry.gateway.policy.storm import (
    OTHER,
    StormEntry,
    StormMessageKind,
    StormState,
    Tally,
    announce_start,
    build_summary,
    collapse,
    due,
    job_key,
    observe_new,
    render_summary,
)

POLICY = load_policy()


@pytest.mark.parametrize(
    ("labels", "key"),
    [
        ({"namespace": "a", "trainingjob": "llm", "job": "dcgm"}, "trainingjob:a/llm"),
        ({"namespace": "a", "job_name": "llm"}, "trainingjob:a/llm"),
        ({"namespace": "a", "job": "dcgm-exporter"}, "job:a/dcgm-exporter"),
        ({"namespace": "a"}, "job:a/"),
        ({"node": "n1"}, "cluster"),
    ],
)
def test_job_key(labels: dict[str, str], key: str) -> None:
    assert job_key(labels) == key


def _state() -> StormState:
    return StormState.new({"namespace": "a", "trainingjob": "llm"})


def test_enters_storm_above_s_in_w_and_not_at_s() -> None:
    policy = merge_policy(POLICY, {"storm": {"threshold": 5, "window": 60}})
    state = _state()
    for i in range(5):
        state, messages = observe_new(state, at(i), Priority.P2, policy)
        assert messages == [] and not state.active
    state, messages = observe_new(state, at(5), Priority.P1, policy)
    assert state.active and messages == []  # announced once something is folded
    state, messages = observe_new(state, at(6), Priority.P2, policy)
    assert messages == []
    state, messages = announce_start(state, at(7), policy)  # the first incident folded
    assert [m.kind for m in messages] == [StormMessageKind.STARTED]
    assert messages[0].summary["total"] == 7 and messages[0].priority is Priority.P1
    assert messages[0].episode == at(5).isoformat()  # the storm began at the sixth alert
    # Announced already: no second start.
    assert announce_start(state, at(8), policy)[1] == []


def test_slow_arrivals_never_storm() -> None:
    policy = merge_policy(POLICY, {"storm": {"threshold": 5, "window": 60}})
    state = _state()
    for i in range(100):  # one every 15 s: 4 per window
        state, messages = observe_new(state, at(i * 15), Priority.P2, policy)
        assert not messages
    assert not state.active
    assert len(state.buckets) <= 31  # the window's buckets, not the history


def test_summary_per_interval_then_end_when_calm() -> None:
    policy = merge_policy(
        POLICY,
        {"storm": {"threshold": 2, "window": 60, "summary_interval": 30, "calm_after": 90}},
    )
    state = _state()
    for i in range(3):
        state, _ = observe_new(state, at(i), Priority.P2, policy)
    assert state.active
    alert = make_alert({"node": "n1", "gpu": "0"})
    for i in range(4):
        entry = StormEntry(alert, Priority.P2, AlertStatus.FIRING, at(3 + i))
        state = collapse(state, entry, policy)
    state, messages = due(state, at(29), policy)
    assert messages == []
    state, messages = due(state, at(31.9), policy)
    assert messages == []  # entered at t=2: the first summary is due at 32
    state, messages = due(state, at(33), policy)
    assert [m.kind for m in messages] == [StormMessageKind.SUMMARY]
    assert messages[0].summary["total"] == 4 and messages[0].at == at(32)  # 2 + 30: on schedule
    # Nothing collected since: no empty summary.
    state, messages = due(state, at(70), policy)
    assert messages == []
    # Calm: 90 s after the last hot arrival (t=2); nothing collected since the summary, so
    # no "0 alerts" card (issue 34), and the storm is over.
    state, messages = due(state, at(92), policy)
    assert messages == [] and not state.active


def test_the_end_carries_what_was_still_collected() -> None:
    policy = merge_policy(
        POLICY,
        {"storm": {"threshold": 2, "window": 60, "summary_interval": 30, "calm_after": 90}},
    )
    state = _state()
    for i in range(3):
        state, _ = observe_new(state, at(i), Priority.P2, policy)
    entry = StormEntry(make_alert({"node": "n1"}), Priority.P2, AlertStatus.FIRING, at(3))
    state, _ = due(collapse(state, entry, policy), at(33), policy)  # the first summary
    entry = StormEntry(make_alert({"node": "n1"}), Priority.P2, AlertStatus.RESOLVED, at(80))
    state, messages = due(collapse(state, entry, policy), at(92), policy)
    assert [m.kind for m in messages] == [StormMessageKind.ENDED]
    assert messages[0].summary["ended"] is True and messages[0].summary["total"] == 1
    assert not state.active


def test_late_due_sends_one_summary_and_the_end() -> None:
    policy = merge_policy(
        POLICY, {"storm": {"threshold": 1, "summary_interval": 10, "calm_after": 60}}
    )
    state = _state()
    for i in range(2):
        state, _ = observe_new(state, at(i), Priority.P2, policy)
    state = collapse(
        state, StormEntry(make_alert(), Priority.P2, AlertStatus.FIRING, at(2)), policy
    )
    state, messages = due(state, at(1000), policy)
    # the summary, then the end with nothing left collected: no empty end card (issue 34)
    assert [m.kind for m in messages] == [StormMessageKind.SUMMARY]
    assert [m.seq for m in messages] == [1] and not state.active


def test_tally_counts_and_caps_keys() -> None:
    policy = merge_policy(POLICY, {"storm": {"max_keys": 3, "top_lines": 2}})
    tally = Tally()
    for i in range(10):
        alert = make_alert(
            {"alertname": f"A{i % 2}", "node": f"n{i}", "gpu": "1"}, fingerprint=f"f{i}"
        )
        priority = Priority.P0 if i == 7 else Priority.P2
        tally = tally.add(StormEntry(alert, priority, AlertStatus.FIRING, at(i)), policy)
    assert tally.total == 10 and tally.firing == 10
    assert tally.by_alertname == {"A0": 5, "A1": 5}
    assert tally.by_node == {"n0": 1, "n1": 1, "n2": 1, OTHER: 7}
    assert sum(tally.by_gpu.values()) == 10
    assert tally.by_priority == {"P2": 9, "P0": 1}
    assert tally.priority is Priority.P0
    assert [line["fingerprint"] for line in tally.top] == ["f7", "f0"]  # most urgent first
    assert Tally.from_json(json.loads(json.dumps(tally.to_json()))) == tally


def test_priorities_are_never_capped_into_other() -> None:
    """`max_keys` bounds node, GPU and alertname keys; there are only four priorities, and
    the storm's priority is read back from them (a key "(other)" there crashed it)."""
    policy = merge_policy(POLICY, {"storm": {"max_keys": 1}})
    tally = Tally()
    for i, priority in enumerate((Priority.P2, Priority.P1, Priority.P0)):
        alert = make_alert({"alertname": "A", "node": f"n{i}"}, fingerprint=f"f{i}")
        tally = tally.add(StormEntry(alert, priority, AlertStatus.FIRING, at(i)), policy)
    assert tally.by_priority == {"P2": 1, "P1": 1, "P0": 1}
    assert tally.priority is Priority.P0
    assert tally.by_node == {"n0": 1, OTHER: 2}


def test_build_summary_equals_the_incremental_summary() -> None:
    policy = merge_policy(POLICY, {"storm": {"list_url": "https://ts/alerts?job={job}"}})
    entries = [
        StormEntry(
            make_alert({"alertname": f"A{i % 3}", "node": f"n{i % 4}", "gpu": str(i % 8)},
                       fingerprint=f"f{i}"),
            Priority(f"P{i % 4}"),
            AlertStatus.FIRING if i % 5 else AlertStatus.RESOLVED,
            at(i),
            alert_id=i,
        )
        for i in range(40)
    ]  # fmt: skip
    summary = build_summary(entries, policy, job="trainingjob:a/llm", start=at(0), end=at(60))
    tally = Tally()
    for entry in entries:
        tally = tally.add(entry, policy)
    assert summary == render_summary(
        tally, policy, job="trainingjob:a/llm", start=at(0), end=at(60)
    )
    assert summary["total"] == 40 and summary["resolved"] == 8 and summary["firing"] == 32
    assert sum(summary["by_node"].values()) == 40
    assert summary["list_url"] == "https://ts/alerts?job=trainingjob:a/llm"
    assert summary["window_s"] == 60
    assert summary["items"][0]["priority"] == "P0"


def test_storm_state_round_trips_through_json() -> None:
    state = _state()
    for i in range(30):
        state, _ = observe_new(state, at(i * 0.5), Priority.P1, POLICY)
        state = collapse(
            state,
            StormEntry(make_alert({"node": f"n{i}"}), Priority.P1, AlertStatus.FIRING, at(i)),
            POLICY,
        )
    assert state.active
    assert StormState.from_json(json.loads(json.dumps(state.to_json()))) == state


# --- The scenario of issue 3: 20,000 alerts over 60 s for one job across 1,000 nodes. ---

CHANNELS = {"feishu", "phone", "sheet", "console"}
N_ALERTS, SPAN_S, N_NODES = 20_000, 60.0, 1_000


class BlastCounter:
    """Distinct nodes per alertname within the blast window (what the gateway's store counts)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.seen: dict[str, deque[tuple[float, str]]] = defaultdict(deque)
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)

    def add(self, alertname: str, node: str, t: float) -> int:
        seen, counts = self.seen[alertname], self.counts[alertname]
        seen.append((t, node))
        counts[node] += 1
        while seen and seen[0][0] <= t - self.window:
            _, old = seen.popleft()
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
        return len(counts)


def _storm_labels(i: int) -> dict[str, str]:
    alertname = ("NCCLTimeout", "GPUXidError", "IBPortDown")[i // 8000]
    labels = {
        "alertname": alertname,
        "namespace": "team-a",
        "trainingjob": "llm-70b",
        "node": f"node-{i % N_NODES:04d}",
        "gpu": str((i // N_NODES) % 8),
        "priority": "P2",
    }
    if alertname == "GPUXidError" and i % 50 == 0:
        labels["xid"] = "79"  # P0 by the XID table: must page once per job, not per node
    return labels


def test_storm_of_20000_alerts_over_1000_nodes() -> None:
    """The 20,000-alert storm through incidents, as the gateway plans it (one IncidentBook
    kept across the changes): each alertname of the job is one incident (no Alertmanager
    group here: job + alertname), announced or folded once, never a card per alert."""
    policy = POLICY
    started = time.perf_counter()
    storm: StormState | None = None
    book = IncidentBook(policy)
    messages_by_minute: Counter[int] = Counter()
    cards: Counter[str] = Counter()  # kind/event of each Feishu message
    phone_pages = 0
    summary_firing = 0
    blast = BlastCounter(policy.blast_radius.window)

    def account(drafts_time: float, result_drafts: list) -> None:  # type: ignore[type-arg]
        nonlocal phone_pages, summary_firing
        for draft in result_drafts:
            messages_by_minute[int(drafts_time // 60)] += 1
            if draft.channel == "phone":
                phone_pages += 1
            if draft.channel != "feishu":
                continue
            cards[f"{draft.kind}:{draft.payload['event']}"] += 1
            if draft.payload["event"] in ("storm_summary", "storm_ended"):
                storm_part = draft.payload["storm"]
                summary_firing += storm_part["firing"] - storm_part.get("own", 0)
                assert sum(storm_part["by_node"].values()) == storm_part["total"]
                assert sum(storm_part["by_priority"].values()) == storm_part["total"]
                assert sum(storm_part["by_incident"].values()) == storm_part["total"]

    next_tick = 1.0
    for i in range(N_ALERTS):
        t = i * SPAN_S / N_ALERTS
        while next_tick <= t:  # the gateway's timer, once a second
            tick = decide_tick([], [storm] if storm else [], policy=policy, now=at(next_tick),
                               channels=CHANNELS, incidents=book)  # fmt: skip
            storm = tick.storm_states.get(storm.job, storm) if storm else storm
            account(next_tick, tick.drafts)
            next_tick += 1.0
        labels = _storm_labels(i)
        nodes = blast.add(labels["alertname"], labels["node"], t)
        result = decide(
            fire(t, fingerprint=f"fp-{i}", labels=labels, alert_id=i),
            fingerprint_state=None,
            storm_state=storm,
            distinct_nodes_in_window=nodes,
            policy=policy,
            now=at(t),
            channels=CHANNELS,
            incidents=book,
        )
        storm = result.storm_state
        if i % 97 == 0:  # the gateway persists it as JSON between changes; so do we, sampled
            storm = StormState.from_json(json.loads(json.dumps(storm.to_json())))
            assert storm == result.storm_state
        account(t, result.drafts)
    assert storm is not None and storm.active
    t = next_tick
    while storm.active:
        tick = decide_tick([], [storm], policy=policy, now=at(t), channels=CHANNELS,
                           incidents=book)  # fmt: skip
        storm = tick.storm_states.get(storm.job, storm)
        account(t, tick.drafts)
        t += 1.0
        assert t < 1000, "the storm never calmed down"
    elapsed = time.perf_counter() - started

    per_minute = dict(sorted(messages_by_minute.items()))
    print(f"storm: {N_ALERTS} alerts -> {sum(per_minute.values())} channel messages "
          f"{per_minute} per minute, Feishu {dict(cards)}, {phone_pages} phone pages, "
          f"{elapsed:.1f}s")  # fmt: skip
    assert max(per_minute.values()) <= 100
    # Every alert is in exactly one incident; three alertnames, three incidents.
    incidents = list(book.by_id.values())
    assert sorted(s.cause for s in incidents) == ["GPUXidError/", "IBPortDown/", "NCCLTimeout/"]
    assert sum(s.total for s in incidents) == N_ALERTS
    # The incident opened in the storm without paging is folded: its alerts in summaries.
    folded = [s for s in incidents if s.folded]
    assert [s.cause for s in folded] == ["IBPortDown/"]
    assert summary_firing == folded[0].total
    # Feishu got a handful of messages, not one per alert: the first incident's card (and
    # its follow-ups), the storm's start, the XID's own card, summaries.
    assert sum(cards.values()) <= 15, cards
    # The P0s (XID 79 on 160 GPUs) rang the phone once for the job, not once per node: the
    # GPUXidError incident opened with one, a new cause during the storm, and paged then.
    assert phone_pages == 1
    assert not storm.active


def test_storm_messages_are_timed_by_schedule_not_by_tick() -> None:
    policy = merge_policy(POLICY, {"storm": {"threshold": 2}})
    storm: StormState | None = None
    for i in range(5):
        result = decide(
            fire(i, fingerprint=f"fp-{i}", labels={"node": f"n{i}"}),
            fingerprint_state=None,
            storm_state=storm,
            distinct_nodes_in_window=1,
            policy=policy,
            now=at(i),
        )
        storm = result.storm_state
    assert storm is not None
    early: datetime = at(200)
    late: datetime = at(900)
    keys_early = {
        d.idempotency_key for d in decide_tick([], [storm], policy=policy, now=early).drafts
    }
    keys_late = {
        d.idempotency_key for d in decide_tick([], [storm], policy=policy, now=late).drafts
    }
    assert keys_early and keys_early == keys_late


def _storm_events(
    steps: list[tuple[float, AlertChange | None]], flap_hold: float, *, newest_first: bool = False
) -> list[tuple[str, str, str, tuple[str, ...], str]]:
    """Runs webhooks (a change) and timer ticks (None) at their times, one job, states
    stored between calls; the storm cards sent: (event, status, timed at, lines, key).
    `newest_first`: ticks get the fingerprint states in reverse order of their first change."""
    policy = merge_policy(
        POLICY,
        {
            "storm": {"threshold": 2, "summary_interval": 20},
            "dedup": {"flap_transitions": 2, "flap_hold": flap_hold},
        },
    )
    fps: dict[str, FingerprintState] = {}
    storm: StormState | None = None
    drafts: list[NotificationDraft] = []
    for when, item in steps:
        if item is None:
            states = list(fps.values())[:: -1 if newest_first else 1]
            tick = decide_tick(states, [storm] if storm else [], policy=policy, now=at(when))
            fps.update(tick.fingerprint_states)
            storm = next(iter(tick.storm_states.values()), storm)
            drafts += tick.drafts
            continue
        result = decide(
            item,
            fingerprint_state=fps.get(item.alert.fingerprint),
            storm_state=storm,
            distinct_nodes_in_window=1,
            policy=policy,
            now=at(when),
        )
        fps[item.alert.fingerprint], storm = result.fingerprint_state, result.storm_state
        drafts += result.drafts
    return [
        (d.payload["event"], d.payload["status"], d.payload["at"], _items(d), d.idempotency_key)
        for d in drafts
        if d.kind == "storm" and d.channel == "feishu"
    ]


def _items(draft: NotificationDraft) -> tuple[str, ...]:
    """The lines a storm card lists, as "fingerprint status at"."""
    items = draft.payload["storm"].get("items", [])
    return tuple(f"{i['fingerprint']} {i['status']} {i['at'][11:19]}" for i in items)


@pytest.mark.parametrize(
    ("flap_hold", "last"),
    [
        (60, ("storm_summary", "resolved", at(82))),  # held until 70: in the storm
        (600, ("storm_summary", "resolved", at(630))),  # until 610: after its end (no card)
    ],
)
def test_a_held_resolution_is_folded_where_a_timely_tick_folds_it(
    flap_hold: float, last: tuple[str, str, datetime]
) -> None:
    # A storm from t=2 (calm at 122); fp-2, folded into it, flaps: its resolve at t=10 is
    # held until 10 + flap_hold. Released by a timely tick, by one late tick at 1000, or by
    # a late repeat of the same resolve at 1000: the same cards, timed alike.
    storm = [(float(i), fire(i, fingerprint=f"fp-{i}", labels={"node": f"n{i}"})) for i in range(3)]
    flap: list[tuple[float, AlertChange | None]] = [(10.0, resolve(10, 2, fingerprint="fp-2"))]
    timely = _storm_events([*storm, *flap, (10.0 + flap_hold, None), (1000.0, None)], flap_hold)
    late_tick = _storm_events([*storm, *flap, (1000.0, None)], flap_hold)
    late_webhook = _storm_events(
        [*storm, *flap, (1000.0, resolve(1000, 2, fingerprint="fp-2")), (1001.0, None)],
        flap_hold,
    )
    assert [card[:3] for card in timely] == [
        ("storm_started", "firing", at(2).isoformat()),
        ("storm_summary", "firing", at(22).isoformat()),
        (*last[:2], last[2].isoformat()),
    ]
    assert late_tick == timely
    assert late_webhook == timely


@pytest.mark.parametrize("newest_first", [False, True])
def test_one_tick_releases_held_resolutions_in_the_order_their_holds_ended(
    newest_first: bool,
) -> None:
    # The storm (from t=2, calm at 123) folds fp-2 and fp-3; both flap. fp-2's resolve is
    # held until 70 (in the storm), fp-3's until 160 (after its end). One late tick releases
    # both, whatever the order the states come in: fp-2 into the summary at 102 (beside
    # fp-3's flapping notice of t=100), fp-3 into one after the end, at 180.
    steps: list[tuple[float, AlertChange | None]] = [
        (float(i), fire(i, fingerprint=f"fp-{i}", labels={"node": f"n{i}"})) for i in range(4)
    ]
    steps += [
        (10.0, resolve(10, 2, fingerprint="fp-2")),
        (100.0, resolve(100, 3, fingerprint="fp-3")),
    ]
    cards = _storm_events([*steps, (1000.0, None)], 60, newest_first=newest_first)
    assert [card[:4] for card in cards] == [
        ("storm_started", "firing", at(2).isoformat(), ()),
        (
            "storm_summary",
            "firing",
            at(22).isoformat(),
            ("fp-2 firing 12:00:02", "fp-3 firing 12:00:03", "fp-2 firing 12:00:10"),
        ),
        (
            "storm_summary",
            "firing",
            at(102).isoformat(),
            ("fp-3 firing 12:01:40", "fp-2 resolved 12:01:10"),
        ),
        ("storm_summary", "resolved", at(180).isoformat(), ("fp-3 resolved 12:02:40",)),
    ]


def test_a_storm_summary_counts_no_hca_as_a_gpu() -> None:
    """Issue 44: IB alerts carry `device` (an HCA) and `port`; "By GPU" counted HCAs."""
    from datetime import UTC, datetime

    from trainsentry.alerts import Alert, AlertStatus, Priority
    from trainsentry.gateway.policy.rules import load_policy
    from trainsentry.gateway.policy.storm import StormEntry, build_summary

    start = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
    entries = []
    for i in range(6):
        labels = {"alertname": "IBPhysicalLinkDown", "node": f"n{i}", "device": "mlx5_0",
                  "port": "1", "component": "fabric", "priority": "P0"}  # fmt: skip
        alert = Alert(f"ib{i}", AlertStatus.FIRING, labels, {}, start, None)
        entries.append(StormEntry(alert, Priority.P0, AlertStatus.FIRING, start, alert_id=i))
    summary = build_summary(entries, load_policy(), job="ml/llm", start=start, end=start)
    assert not [key for key in summary["by_gpu"] if "mlx5" in key], summary["by_gpu"]
    assert all(not item.get("gpu") for item in summary["items"])
    assert len(summary["by_node"]) == 6


JOB_LABEL_VALUES = st.sampled_from(("", "ml", "llama-70b", "node-exporter"))


@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(("namespace", "trainingjob", "job_name", "job", "node")),
            JOB_LABEL_VALUES,
        ),
        min_size=1,
        max_size=40,
    )
)
def test_job_key_memoised_is_the_job_worked_out(cases: list[dict[str, str]]) -> None:
    """`job_key` is memoised by the labels it reads (issue 46: asked several times per alert);
    each answer is the one its labels make, asked twice or once."""

    def worked_out(labels: dict[str, str]) -> str:
        if (job := JobRef.from_labels(labels)) is not None:
            return job.key
        namespace, scrape = labels.get("namespace", ""), labels.get("job", "")
        return f"job:{namespace}/{scrape}" if namespace or scrape else "cluster"

    for labels in cases + cases:
        assert job_key(labels) == worked_out(labels)
