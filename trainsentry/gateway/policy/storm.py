"""Per-job storm collapse (pure).

A job is a `trainingjob` (or `job_name`) label, else the `namespace`/`job` labels, else
the whole cluster. More than S new alerts of one job within W seconds put it in storm mode.
While in storm, notifications are folded into a `Tally` and sent as one summary per
interval; the first P0 of the storm still pages, once. The storm ends when the job has
stayed at or below S per W for `calm_after` seconds: a last summary goes out then.

Alerts folded into a storm resolve later; their resolutions are folded too (into a summary
even after the storm ended) so a storm never turns into a stream of single resolves.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import Alert, AlertStatus, Priority
from trainsentry.gateway.policy.rules import Policy, StormPolicy
from trainsentry.labels import (
    JOB_NAME_LABELS,
    NAMESPACE_LABEL,
    SCRAPE_JOB_LABEL,
    first_label,
    job_name_of,
)

OTHER = "(other)"
# Sliding-window resolution: the window is counted in this many buckets.
_BUCKETS_PER_WINDOW = 30
_JOB_LABELS = (NAMESPACE_LABEL, *JOB_NAME_LABELS, SCRAPE_JOB_LABEL)


def job_key(labels: Mapping[str, str]) -> str:
    """The storm unit an alert belongs to."""
    namespace = labels.get(NAMESPACE_LABEL, "")
    name = job_name_of(labels)
    if name:
        return f"trainingjob:{namespace}/{name}"
    job = labels.get(SCRAPE_JOB_LABEL, "")
    if namespace or job:
        return f"job:{namespace}/{job}"
    return "cluster"


def job_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels that identify the job (what a storm summary is routed by)."""
    return {name: labels[name] for name in _JOB_LABELS if labels.get(name)}


@dataclass(frozen=True, slots=True)
class StormEntry:
    """One alert change as a storm summary counts it."""

    alert: Alert
    priority: Priority
    status: AlertStatus
    at: datetime
    alert_id: int | None = None


def _line(entry: StormEntry, policy: Policy) -> dict[str, Any]:
    labels = entry.alert.labels
    line: dict[str, Any] = {
        "alertname": entry.alert.name,
        "priority": entry.priority.value,
        "status": entry.status.value,
        "fingerprint": entry.alert.fingerprint,
        "node": first_label(labels, policy.node_labels),
        "gpu": first_label(labels, policy.gpu_labels),
        "summary": entry.alert.annotations.get("summary", ""),
        "at": entry.at.isoformat(),
    }
    job = entry.alert.job
    if job is not None:
        line["job"] = str(job)
    if entry.alert_id is not None:
        line["alert_id"] = entry.alert_id
    return line


def _line_order(line: Mapping[str, Any]) -> tuple[int, int, str, str]:
    # Most urgent first, firing before resolved, then earliest, then stable by fingerprint.
    status_rank = 0 if line["status"] == AlertStatus.FIRING.value else 1
    return (int(line["priority"][1]), status_rank, line["at"], line["fingerprint"])


# Priorities are never folded into OTHER: there are only four, and the storm's own priority
# is read back from them (`Tally.priority`).
PRIORITY_KEYS = len(Priority)


def _bump(counts: Mapping[str, int], key: str, cap: int) -> dict[str, int]:
    updated = dict(counts)
    if key not in updated and len(updated) >= cap:
        key = OTHER
    updated[key] = updated.get(key, 0) + 1
    return updated


@dataclass(frozen=True, slots=True)
class Tally:
    """Counts of the alert changes folded since the last summary (bounded in size)."""

    total: int = 0
    firing: int = 0
    resolved: int = 0
    by_alertname: Mapping[str, int] = field(default_factory=dict)
    by_priority: Mapping[str, int] = field(default_factory=dict)
    by_node: Mapping[str, int] = field(default_factory=dict)
    by_gpu: Mapping[str, int] = field(default_factory=dict)
    top: tuple[Mapping[str, Any], ...] = ()
    first_at: datetime | None = None
    last_at: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.total == 0

    @property
    def priority(self) -> Priority:
        """The most urgent priority counted (P3 when empty)."""
        levels = [int(p[1]) for p, n in self.by_priority.items() if n > 0]
        return Priority(f"P{min(levels)}") if levels else Priority.P3

    def add(self, entry: StormEntry, policy: Policy) -> Tally:
        rules = policy.storm
        cap = rules.max_keys
        labels = entry.alert.labels
        node = first_label(labels, policy.node_labels) or "(none)"
        gpu = first_label(labels, policy.gpu_labels)
        gpu_key = f"{node}/{gpu}" if gpu else "(none)"
        top = self.top
        if rules.top_lines:
            order = (
                entry.priority.level,
                0 if entry.status is AlertStatus.FIRING else 1,
                entry.at.isoformat(),
                entry.alert.fingerprint,
            )
            if len(top) < rules.top_lines or order < _line_order(top[-1]):
                line = _line(entry, policy)
                top = tuple(sorted((*top, line), key=_line_order)[: rules.top_lines])
        firing = entry.status is AlertStatus.FIRING
        return Tally(
            total=self.total + 1,
            firing=self.firing + (1 if firing else 0),
            resolved=self.resolved + (0 if firing else 1),
            by_alertname=_bump(self.by_alertname, entry.alert.name or "(unnamed)", cap),
            by_priority=_bump(self.by_priority, entry.priority.value, PRIORITY_KEYS),
            by_node=_bump(self.by_node, node, cap),
            by_gpu=_bump(self.by_gpu, gpu_key, cap),
            top=top,
            first_at=entry.at if self.first_at is None else min(self.first_at, entry.at),
            last_at=entry.at if self.last_at is None else max(self.last_at, entry.at),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "firing": self.firing,
            "resolved": self.resolved,
            "by_alertname": dict(self.by_alertname),
            "by_priority": dict(self.by_priority),
            "by_node": dict(self.by_node),
            "by_gpu": dict(self.by_gpu),
            "top": [dict(line) for line in self.top],
            "first_at": _iso(self.first_at),
            "last_at": _iso(self.last_at),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tally:
        return cls(
            total=int(data["total"]),
            firing=int(data["firing"]),
            resolved=int(data["resolved"]),
            by_alertname=dict(data["by_alertname"]),
            by_priority=dict(data["by_priority"]),
            by_node=dict(data["by_node"]),
            by_gpu=dict(data["by_gpu"]),
            top=tuple(dict(line) for line in data["top"]),
            first_at=_dt(data.get("first_at")),
            last_at=_dt(data.get("last_at")),
        )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _sorted_counts(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def render_summary(
    tally: Tally,
    policy: Policy,
    *,
    job: str,
    start: datetime,
    end: datetime,
    **extra: Any,
) -> dict[str, Any]:
    """The summary dict a channel renders (the `storm` field of the payload contract)."""
    summary: dict[str, Any] = {
        "job": job,
        "total": tally.total,
        "firing": tally.firing,
        "resolved": tally.resolved,
        "by_alertname": _sorted_counts(tally.by_alertname),
        "by_priority": dict(sorted(tally.by_priority.items())),
        "by_node": _sorted_counts(tally.by_node),
        "by_gpu": _sorted_counts(tally.by_gpu),
        "items": [dict(line) for line in tally.top],
        "start": start.isoformat(),
        "end": end.isoformat(),
        "window_s": max(0, int((end - start).total_seconds())),
    }
    if policy.storm.list_url:
        summary["list_url"] = policy.storm.list_url.format(
            job=job, start=start.isoformat(), end=end.isoformat()
        )
    summary.update(extra)
    return summary


def build_summary(
    entries: Iterable[StormEntry],
    policy: Policy,
    *,
    job: str,
    start: datetime,
    end: datetime,
) -> dict[str, Any]:
    """The summary of the given alert changes (e.g. the stored alerts of one interval)."""
    tally = Tally()
    for entry in entries:
        tally = tally.add(entry, policy)
    return render_summary(tally, policy, job=job, start=start, end=end)


class StormMessageKind(enum.StrEnum):
    STARTED = "storm_started"
    SUMMARY = "storm_summary"
    ENDED = "storm_ended"


@dataclass(frozen=True, slots=True)
class StormMessage:
    """Something the storm logic wants sent to the job's channels."""

    kind: StormMessageKind
    job: str
    episode: str  # the storm's start time (ISO); "" for resolves folded after a storm
    seq: int  # summary number within the episode
    at: datetime
    priority: Priority
    summary: dict[str, Any]
    labels: Mapping[str, str]


class Verdict(enum.StrEnum):
    DELIVER = "deliver"  # not in storm: send individually
    COLLAPSE = "collapse"  # folded into the next summary
    PAGE = "page"  # the storm's one P0 page


def _bucket(at: datetime, rules: StormPolicy) -> int:
    width = rules.window / _BUCKETS_PER_WINDOW
    return math.floor(at.timestamp() / width)


@dataclass(frozen=True, slots=True)
class StormState:
    """What the policy remembers about one job (persisted by the store)."""

    job: str
    labels: Mapping[str, str] = field(default_factory=dict)
    buckets: Mapping[int, int] = field(default_factory=dict)  # bucket -> new alerts
    active: bool = False
    episode: str = ""  # ISO start of the current (or last) storm
    last_hot_at: datetime | None = None  # last time the window held more than S
    p0_paged: bool = False
    seq: int = 0
    tally: Tally = field(default_factory=Tally)
    next_summary_at: datetime | None = None
    storms: int = 0  # storms this job has had (for metrics and display)
    peak: Priority = Priority.P3  # most urgent priority seen in the current storm

    @classmethod
    def new(cls, labels: Mapping[str, str]) -> StormState:
        return cls(job=job_key(labels), labels=job_labels(labels))

    def window_count(self, at: datetime, rules: StormPolicy) -> int:
        oldest = _bucket(at, rules) - _BUCKETS_PER_WINDOW
        return sum(n for b, n in self.buckets.items() if b > oldest)

    def next_due(self, policy: Policy) -> datetime | None:
        """When `due` next has something to do (for the gateway's timer)."""
        times: list[datetime] = []
        if self.next_summary_at is not None and not self.tally.empty:
            times.append(self.next_summary_at)
        if self.active and self.last_hot_at is not None:
            times.append(self.last_hot_at + timedelta(seconds=policy.storm.calm_after))
        return min(times) if times else None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "labels": dict(self.labels),
            "buckets": {str(b): n for b, n in self.buckets.items()},
            "active": self.active,
            "episode": self.episode,
            "last_hot_at": _iso(self.last_hot_at),
            "p0_paged": self.p0_paged,
            "seq": self.seq,
            "tally": self.tally.to_json(),
            "next_summary_at": _iso(self.next_summary_at),
            "storms": self.storms,
            "peak": self.peak.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StormState:
        return cls(
            job=data["job"],
            labels=dict(data.get("labels") or {}),
            buckets={int(b): int(n) for b, n in (data.get("buckets") or {}).items()},
            active=bool(data.get("active", False)),
            episode=data.get("episode", ""),
            last_hot_at=_dt(data.get("last_hot_at")),
            p0_paged=bool(data.get("p0_paged", False)),
            seq=int(data.get("seq", 0)),
            tally=Tally.from_json(data["tally"]) if data.get("tally") else Tally(),
            next_summary_at=_dt(data.get("next_summary_at")),
            storms=int(data.get("storms", 0)),
            peak=Priority(data.get("peak", "P3")),
        )


def observe_new(
    state: StormState, at: datetime, priority: Priority, policy: Policy
) -> tuple[StormState, list[StormMessage]]:
    """Counts one new firing alert of the job; enters storm mode above S per W."""
    rules = policy.storm
    if not rules.enabled:
        return state, []
    bucket = _bucket(at, rules)
    oldest = bucket - _BUCKETS_PER_WINDOW
    buckets = {b: n for b, n in state.buckets.items() if b > oldest}
    buckets[bucket] = buckets.get(bucket, 0) + 1
    count = sum(buckets.values())
    if count <= rules.threshold:
        return replace(state, buckets=buckets), []
    hot_at = at if state.last_hot_at is None else max(at, state.last_hot_at)
    if state.active:
        return replace(state, buckets=buckets, last_hot_at=hot_at), []
    episode = at.isoformat()
    state = replace(
        state,
        buckets=buckets,
        last_hot_at=hot_at,
        active=True,
        episode=episode,
        p0_paged=False,
        seq=0,
        storms=state.storms + 1,
        peak=priority,
        next_summary_at=at + timedelta(seconds=rules.summary_interval),
    )
    started = started_message(state.job, state.labels, episode, at, priority, count, rules)
    return state, [started]


def verdict(
    state: StormState, priority: Priority, *, fresh_page: bool
) -> tuple[StormState, Verdict]:
    """How one notice of this job is delivered. `fresh_page`: a firing that would page."""
    if not state.active:
        return state, Verdict.DELIVER
    if fresh_page and priority is Priority.P0 and not state.p0_paged:
        return replace(state, p0_paged=True), Verdict.PAGE
    return state, Verdict.COLLAPSE


def collapse(state: StormState, entry: StormEntry, policy: Policy) -> StormState:
    """Folds one alert change into the next summary."""
    next_at = state.next_summary_at
    if next_at is None or (state.tally.empty and next_at <= entry.at):
        next_at = entry.at + timedelta(seconds=policy.storm.summary_interval)
    peak = entry.priority if entry.priority.at_least(state.peak) else state.peak
    return replace(state, tally=state.tally.add(entry, policy), next_summary_at=next_at, peak=peak)


def started_message(
    job: str,
    labels: Mapping[str, str],
    episode: str,
    at: datetime,
    priority: Priority,
    count: int,
    rules: StormPolicy,
) -> StormMessage:
    """Pure: the notice that a job's storm started (`count` alerts within the window)."""
    return StormMessage(
        kind=StormMessageKind.STARTED,
        job=job,
        episode=episode,
        seq=0,
        at=at,
        priority=priority,
        summary={
            "job": job,
            "total": count,
            "window_s": int(rules.window),
            "threshold": rules.threshold,
            "start": episode,
        },
        labels=labels,
    )


def _summary_message(
    state: StormState, policy: Policy, kind: StormMessageKind, at: datetime
) -> StormMessage:
    tally = state.tally
    start = tally.first_at or at
    summary = render_summary(
        tally,
        policy,
        job=state.job,
        start=start,
        end=at,
        episode=state.episode,
        seq=state.seq + 1,
        in_storm=state.active,
        ended=kind is StormMessageKind.ENDED,
    )
    return StormMessage(
        kind=kind,
        job=state.job,
        episode=state.episode,
        seq=state.seq + 1,
        at=at,
        priority=state.peak if kind is StormMessageKind.ENDED else tally.priority,
        summary=summary,
        labels=state.labels,
    )


def due(state: StormState, now: datetime, policy: Policy) -> tuple[StormState, list[StormMessage]]:
    """Summaries whose interval has passed, and the end of a storm that calmed down.
    Messages are timed by their schedule, not by `now`, so a late call sends the same."""
    rules = policy.storm
    messages: list[StormMessage] = []
    calm_at = (
        state.last_hot_at + timedelta(seconds=rules.calm_after)
        if state.active and state.last_hot_at is not None
        else None
    )
    summary_at = state.next_summary_at if not state.tally.empty else None
    if summary_at is not None and summary_at <= now and (calm_at is None or summary_at < calm_at):
        messages.append(_summary_message(state, policy, StormMessageKind.SUMMARY, summary_at))
        following = summary_at + timedelta(seconds=rules.summary_interval)
        while following <= now and (calm_at is None or following < calm_at):
            following += timedelta(seconds=rules.summary_interval)
        state = replace(state, tally=Tally(), seq=state.seq + 1, next_summary_at=following)
    if calm_at is not None and calm_at <= now:
        messages.append(_summary_message(state, policy, StormMessageKind.ENDED, calm_at))
        state = replace(
            state,
            active=False,
            tally=Tally(),
            seq=state.seq + 1,
            next_summary_at=None,
            last_hot_at=None,
            peak=Priority.P3,
        )
    return state, messages
