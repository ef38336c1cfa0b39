"""A job's storm state, mutable for the length of one planning batch (pure: no I/O).

`storm.py`'s functions copy the whole `StormState` (and its `Tally`, with four count maps)
for every alert: during a storm that was a third of `decide()`. `StormFold` holds the same
fields as plain mutable values; `decide.fold_into` folds each change of a batch into its
job's fold, and the batch freezes each fold back into one `StormState` at its end.

Invariant: for any sequence of calls, `StormFold.of(s)` followed by the fold's methods and
`freeze()` gives exactly the state (and the messages) that `observe_new`, `verdict`,
`collapse` and `due` of storm.py give for the same calls, including the order of the
buckets' keys (tests/gateway/policy/test_storm_fold.py checks it on random sequences).
`freeze()` copies, so a frozen state never changes when the fold goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from trainsentry.alerts import AlertStatus, Priority
from trainsentry.gateway.policy import storm as frozen
from trainsentry.gateway.policy.rules import Policy, StormPolicy
from trainsentry.gateway.policy.storm import (
    BUCKETS_PER_WINDOW,
    PAGED_CAUSES,
    StormMessage,
    StormMessageKind,
    StormState,
    Verdict,
    bucket_index,
    bulk_of,
    count_cause,
    started_message,
    summary_message,
)
from trainsentry.gateway.policy.storm_tally import (
    OTHER,
    PRIORITY_KEYS,
    StormEntry,
    Tally,
    line_of,
    line_order,
)
from trainsentry.labels import gpu_label


def _bump(counts: dict[str, int], key: str, cap: int) -> None:
    if key not in counts and len(counts) >= cap:
        key = OTHER
    counts[key] = counts.get(key, 0) + 1


@dataclass(slots=True)
class TallyFold:
    """`storm.Tally`, counted in place."""

    total: int = 0
    firing: int = 0
    resolved: int = 0
    own: int = 0
    by_alertname: dict[str, int] = field(default_factory=dict)
    by_priority: dict[str, int] = field(default_factory=dict)
    by_node: dict[str, int] = field(default_factory=dict)
    by_gpu: dict[str, int] = field(default_factory=dict)
    by_incident: dict[str, int] = field(default_factory=dict)
    top: list[Mapping[str, Any]] = field(default_factory=list)
    first_at: datetime | None = None
    last_at: datetime | None = None

    @classmethod
    def of(cls, tally: Tally) -> TallyFold:
        return cls(
            tally.total,
            tally.firing,
            tally.resolved,
            tally.own,
            dict(tally.by_alertname),
            dict(tally.by_priority),
            dict(tally.by_node),
            dict(tally.by_gpu),
            dict(tally.by_incident),
            list(tally.top),
            tally.first_at,
            tally.last_at,
        )

    def freeze(self) -> Tally:
        return Tally(
            total=self.total,
            firing=self.firing,
            resolved=self.resolved,
            own=self.own,
            by_alertname=dict(self.by_alertname),
            by_priority=dict(self.by_priority),
            by_node=dict(self.by_node),
            by_gpu=dict(self.by_gpu),
            by_incident=dict(self.by_incident),
            top=tuple(self.top),
            first_at=self.first_at,
            last_at=self.last_at,
        )

    def add(self, entry: StormEntry, policy: Policy) -> None:
        """`Tally.add`, in place."""
        rules = policy.storm
        cap = rules.max_keys
        labels = entry.alert.labels
        node = entry.alert.node or "(none)"
        gpu = gpu_label(labels, policy.gpu_labels)
        top = self.top
        if rules.top_lines:
            order = (
                entry.priority.level,
                0 if entry.status is AlertStatus.FIRING else 1,
                entry.at.isoformat(),
                entry.alert.fingerprint,
            )
            if len(top) < rules.top_lines or order < line_order(top[-1]):
                top.append(line_of(entry, policy))
                top.sort(key=line_order)  # stable, as sorted() in Tally.add
                del top[rules.top_lines :]
        firing = entry.status is AlertStatus.FIRING
        self.total += 1
        if entry.own:
            self.own += 1
        if firing:
            self.firing += 1
        else:
            self.resolved += 1
        _bump(self.by_alertname, entry.alert.name or "(unnamed)", cap)
        _bump(self.by_priority, entry.priority.value, PRIORITY_KEYS)
        _bump(self.by_node, node, cap)
        _bump(self.by_gpu, f"{node}/{gpu}" if gpu else "(none)", cap)
        if entry.incident:
            _bump(self.by_incident, entry.incident, cap)
        at = entry.at
        self.first_at = at if self.first_at is None else min(self.first_at, at)
        self.last_at = at if self.last_at is None else max(self.last_at, at)


@dataclass(slots=True)
class StormFold:
    """`storm.StormState`, changed in place by the storm steps of one batch."""

    job: str
    labels: Mapping[str, str]
    buckets: dict[int, int]
    active: bool
    episode: str
    last_hot_at: datetime | None
    p0_paged: bool
    seq: int
    tally: TallyFold
    next_summary_at: datetime | None
    storms: int
    peak: Priority
    causes: dict[str, int]
    paged_causes: tuple[str, ...]
    start_told: bool

    @classmethod
    def of(cls, state: StormState) -> StormFold:
        return cls(
            state.job,
            state.labels,
            dict(state.buckets),
            state.active,
            state.episode,
            state.last_hot_at,
            state.p0_paged,
            state.seq,
            TallyFold.of(state.tally),
            state.next_summary_at,
            state.storms,
            state.peak,
            dict(state.causes),
            state.paged_causes,
            state.start_told,
        )

    def freeze(self) -> StormState:
        return StormState(
            job=self.job,
            labels=self.labels,
            buckets=dict(self.buckets),
            active=self.active,
            episode=self.episode,
            last_hot_at=self.last_hot_at,
            p0_paged=self.p0_paged,
            seq=self.seq,
            tally=self.tally.freeze(),
            next_summary_at=self.next_summary_at,
            storms=self.storms,
            peak=self.peak,
            causes=dict(self.causes),
            paged_causes=self.paged_causes,
            start_told=self.start_told,
        )

    def window_count(self, at: datetime, rules: StormPolicy) -> int:
        oldest = bucket_index(at, rules) - BUCKETS_PER_WINDOW
        return sum(n for b, n in self.buckets.items() if b > oldest)

    def observe_new(
        self, at: datetime, priority: Priority, policy: Policy, cause: str = ""
    ) -> list[StormMessage]:
        """`storm.observe_new`, in place."""
        rules = policy.storm
        if not rules.enabled:
            return []
        bucket = bucket_index(at, rules)
        oldest = bucket - BUCKETS_PER_WINDOW
        buckets = self.buckets
        for stale in [b for b in buckets if b <= oldest]:
            del buckets[stale]  # the others keep their order, as the copy in storm.py
        fresh = not buckets and not self.active
        self.causes = count_cause(self.causes, cause, fresh, rules.max_keys)
        buckets[bucket] = buckets.get(bucket, 0) + 1
        count = sum(buckets.values())
        if count <= rules.threshold:
            return []
        self.last_hot_at = at if self.last_hot_at is None else max(at, self.last_hot_at)
        if self.active:
            return []
        episode = at.isoformat()
        self.active = True
        self.episode = episode
        self.p0_paged = False
        self.paged_causes = ()
        self.seq = 0
        self.storms += 1
        self.peak = priority
        self.next_summary_at = at + timedelta(seconds=rules.summary_interval)
        self.start_told = False
        return []

    def announce_start(self, at: datetime, policy: Policy) -> list[StormMessage]:
        """`storm.announce_start`, in place."""
        if not self.active or self.start_told:
            return []
        self.start_told = True
        count = self.window_count(at, policy.storm)
        return [
            started_message(self.job, self.labels, self.episode, at, self.peak, count, policy.storm)
        ]

    def verdict(self, priority: Priority, *, fresh_page: bool, cause: str = "") -> Verdict:
        """`storm.verdict`, in place."""
        if not self.active:
            return Verdict.DELIVER
        if fresh_page and priority is Priority.P0:
            if cause and self.causes and cause != bulk_of(self.causes):
                if cause in self.paged_causes:
                    return Verdict.COLLAPSE
                self.paged_causes = (*self.paged_causes, cause)[-PAGED_CAUSES:]
                return Verdict.PAGE
            if not self.p0_paged:
                self.p0_paged = True
                return Verdict.PAGE
        return Verdict.COLLAPSE

    def collapse(self, entry: StormEntry, policy: Policy) -> None:
        """`storm.collapse`, in place."""
        next_at = self.next_summary_at
        if next_at is None or (self.tally.total == 0 and next_at <= entry.at):
            self.next_summary_at = entry.at + timedelta(seconds=policy.storm.summary_interval)
        if entry.priority.at_least(self.peak):
            self.peak = entry.priority
        self.tally.add(entry, policy)

    def due(self, now: datetime, policy: Policy) -> list[StormMessage]:
        """`storm.due`, in place (a message is rendered from a frozen copy: rare)."""
        rules = policy.storm
        messages: list[StormMessage] = []
        calm_at = (
            self.last_hot_at + timedelta(seconds=rules.calm_after)
            if self.active and self.last_hot_at is not None
            else None
        )
        summary_at = self.next_summary_at if self.tally.total > self.tally.own else None
        if (
            summary_at is not None
            and summary_at <= now
            and (calm_at is None or summary_at < calm_at)
        ):
            kind = StormMessageKind.SUMMARY
            messages.append(summary_message(self.freeze(), policy, kind, summary_at))
            following = summary_at + timedelta(seconds=rules.summary_interval)
            while following <= now and (calm_at is None or following < calm_at):
                following += timedelta(seconds=rules.summary_interval)
            self.tally = TallyFold()
            self.seq += 1
            self.next_summary_at = following
        if calm_at is not None and calm_at <= now:
            if self.tally.total > self.tally.own:
                kind = StormMessageKind.ENDED
                messages.append(summary_message(self.freeze(), policy, kind, calm_at))
            self.causes = {}
            self.paged_causes = ()
            self.active = False
            self.tally = TallyFold()
            self.seq += 1
            self.next_summary_at = None
            self.last_hot_at = None
            self.peak = Priority.P3
        return messages


# A job's storm state: frozen (one alert at a time) or a batch's fold. The `*_any` steps
# below take either: storm.py's functions (copies), or the fold's methods (in place).
S = TypeVar("S", StormState, StormFold)


def observe_any(
    storm: S, at: datetime, priority: Priority, policy: Policy, cause: str = ""
) -> tuple[S, list[StormMessage]]:
    if isinstance(storm, StormFold):
        return storm, storm.observe_new(at, priority, policy, cause)
    return frozen.observe_new(storm, at, priority, policy, cause)


def verdict_any(
    storm: S, priority: Priority, *, fresh_page: bool, cause: str = ""
) -> tuple[S, Verdict]:
    if isinstance(storm, StormFold):
        return storm, storm.verdict(priority, fresh_page=fresh_page, cause=cause)
    return frozen.verdict(storm, priority, fresh_page=fresh_page, cause=cause)


def collapse_any(storm: S, entry: StormEntry, policy: Policy) -> S:
    if isinstance(storm, StormFold):
        storm.collapse(entry, policy)
        return storm
    return frozen.collapse(storm, entry, policy)


def announce_start_any(storm: S, at: datetime, policy: Policy) -> tuple[S, list[StormMessage]]:
    if isinstance(storm, StormFold):
        return storm, storm.announce_start(at, policy)
    return frozen.announce_start(storm, at, policy)


def due_any(storm: S, now: datetime, policy: Policy) -> tuple[S, list[StormMessage]]:
    if isinstance(storm, StormFold):
        return storm, storm.due(now, policy)
    return frozen.due(storm, now, policy)
