"""Per-job storm collapse (pure).

A job is a `trainingjob` (or `job_name`) label, else the `namespace`/`job` labels, else
the whole cluster. More than S new alerts of one job within W seconds put it in storm
mode; its start is announced only once an incident is folded into it (`announce_start`:
one incident of 25 alerts, all on its own card, is no reason for a storm card). While in
storm, notifications are folded into a `Tally` and sent as one summary per interval; the first
P0 of the storm still pages, once. The storm ends when the job has
stayed at or below S per W for `calm_after` seconds: a last summary goes out then.

Alerts folded into a storm resolve later; their resolutions are folded too (into a summary
even after the storm ended) so a storm never turns into a stream of single resolves.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import JOB_KEY_LABELS, JOB_KEY_PREFIX, Priority, job_key
from trainsentry.gateway.policy.rules import Policy, StormPolicy
from trainsentry.gateway.policy.storm_tally import (
    OTHER,
    PRIORITY_KEYS,
    StormEntry,
    Tally,
    build_summary,
    render_summary,
)

# The tally's names, as the storm's own (callers read them from here).
__all__ = [
    "OTHER",
    "PRIORITY_KEYS",
    "StormEntry",
    "StormMessage",
    "StormMessageKind",
    "StormState",
    "Tally",
    "Verdict",
    "announce_start",
    "build_summary",
    "bulk_of",
    "collapse",
    "count_cause",
    "due",
    "job_key",
    "job_labels",
    "job_title",
    "observe_new",
    "render_summary",
    "verdict",
]

# The new causes a storm remembers having paged for (the oldest are forgotten first).
PAGED_CAUSES = 50
# Sliding-window resolution: the window is counted in this many buckets.
BUCKETS_PER_WINDOW = 30


def job_title(key: str) -> str:
    """Pure: the job as cards name it ("ml/llama-70b" for `trainingjob:ml/llama-70b`), the
    same words an alert's card uses (`JobRef`), so a storm and its alerts name one job."""
    if key.startswith(JOB_KEY_PREFIX):
        return key.removeprefix(JOB_KEY_PREFIX).removeprefix("/")
    return key.removeprefix("job:").strip("/") or key


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def job_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels that identify the job (what a storm summary is routed by)."""
    return {name: labels[name] for name in JOB_KEY_LABELS if labels.get(name)}


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


def bucket_index(at: datetime, rules: StormPolicy) -> int:
    width = rules.window / BUCKETS_PER_WINDOW
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
    # new firing alerts by cause (incident.cause_of) since the window was last empty, through
    # the storm: its bulk, against which a P0 of another cause pages on its own
    causes: Mapping[str, int] = field(default_factory=dict)
    paged_causes: tuple[str, ...] = ()  # the new causes that paged in this storm, once each
    # its `storm_started` card went out (or is not owed: no storm); False from the storm's
    # start until the first incident is folded into it (`announce_start`)
    start_told: bool = True

    @classmethod
    def new(cls, labels: Mapping[str, str]) -> StormState:
        return cls(job=job_key(labels), labels=job_labels(labels))

    def window_count(self, at: datetime, rules: StormPolicy) -> int:
        oldest = bucket_index(at, rules) - BUCKETS_PER_WINDOW
        return sum(n for b, n in self.buckets.items() if b > oldest)

    def next_due(self, policy: Policy) -> datetime | None:
        """When `due` next has something to do (for the gateway's timer)."""
        times: list[datetime] = []
        if self.next_summary_at is not None and self.tally.folded:
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
            "causes": dict(self.causes),
            "paged_causes": list(self.paged_causes),
            "start_told": self.start_told,
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
            causes=dict(data.get("causes") or {}),
            paged_causes=tuple(data.get("paged_causes") or ()),
            start_told=bool(data.get("start_told", True)),  # stored before: it was sent
        )

    @property
    def bulk(self) -> str:
        """The cause most of the storm's new alerts share ("" when none is known)."""
        return bulk_of(self.causes)


def bulk_of(causes: Mapping[str, int]) -> str:
    """Pure: the most frequent cause (ties: the first by name), "" for none."""
    return min(causes, key=lambda c: (-causes[c], c)) if causes else ""


def count_cause(causes: Mapping[str, int], cause: str, fresh: bool, cap: int) -> dict[str, int]:
    """Pure: `causes` with one more alert of `cause`; `fresh`: the window was empty before
    it (nothing recent to compare with: counting starts again)."""
    counted = {} if fresh else dict(causes)
    if cause and (cause in counted or len(counted) < cap):
        counted[cause] = counted.get(cause, 0) + 1
    return counted


def observe_new(
    state: StormState, at: datetime, priority: Priority, policy: Policy, cause: str = ""
) -> tuple[StormState, list[StormMessage]]:
    """Counts one new firing alert of the job (of `cause`); enters storm mode above S per W
    (its start is announced by `announce_start`, once something is folded)."""
    rules = policy.storm
    if not rules.enabled:
        return state, []
    bucket = bucket_index(at, rules)
    oldest = bucket - BUCKETS_PER_WINDOW
    buckets = {b: n for b, n in state.buckets.items() if b > oldest}
    causes = count_cause(state.causes, cause, not buckets and not state.active, rules.max_keys)
    buckets[bucket] = buckets.get(bucket, 0) + 1
    count = sum(buckets.values())
    if count <= rules.threshold:
        return replace(state, buckets=buckets, causes=causes), []
    hot_at = at if state.last_hot_at is None else max(at, state.last_hot_at)
    if state.active:
        return replace(state, buckets=buckets, last_hot_at=hot_at, causes=causes), []
    episode = at.isoformat()
    state = replace(
        state,
        buckets=buckets,
        causes=causes,
        last_hot_at=hot_at,
        active=True,
        episode=episode,
        p0_paged=False,
        paged_causes=(),
        seq=0,
        storms=state.storms + 1,
        peak=priority,
        next_summary_at=at + timedelta(seconds=rules.summary_interval),
        start_told=False,
    )
    return state, []


def announce_start(
    state: StormState, at: datetime, policy: Policy
) -> tuple[StormState, list[StormMessage]]:
    """Pure: the storm's `storm_started` message, when an incident was just folded into it
    at `at` and none went out yet (with the new alerts counted in the window then)."""
    if not state.active or state.start_told:
        return state, []
    count = state.window_count(at, policy.storm)
    message = started_message(
        state.job, state.labels, state.episode, at, state.peak, count, policy.storm
    )
    return replace(state, start_told=True), [message]


def verdict(
    state: StormState, priority: Priority, *, fresh_page: bool, cause: str = ""
) -> tuple[StormState, Verdict]:
    """How a new incident of this job is announced. `fresh_page`: it opens with a firing
    that would page; `cause`: its cause. During a storm a P0 of another cause than the
    storm's bulk pages on its own (a new cause always pages, once per storm); the first P0
    of the bulk pages once; the rest is summarised."""
    if not state.active:
        return state, Verdict.DELIVER
    if fresh_page and priority is Priority.P0:
        if cause and state.causes and cause != state.bulk:
            if cause in state.paged_causes:
                return state, Verdict.COLLAPSE
            paged = (*state.paged_causes, cause)[-PAGED_CAUSES:]
            return replace(state, paged_causes=paged), Verdict.PAGE
        if not state.p0_paged:
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


def summary_message(
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
    summary_at = state.next_summary_at if state.tally.folded else None
    if summary_at is not None and summary_at <= now and (calm_at is None or summary_at < calm_at):
        messages.append(summary_message(state, policy, StormMessageKind.SUMMARY, summary_at))
        following = summary_at + timedelta(seconds=rules.summary_interval)
        while following <= now and (calm_at is None or following < calm_at):
            following += timedelta(seconds=rules.summary_interval)
        state = replace(state, tally=Tally(), seq=state.seq + 1, next_summary_at=following)
    if calm_at is not None and calm_at <= now:
        # the end says what was still collected; with nothing collected, no card at all
        if state.tally.folded:
            messages.append(summary_message(state, policy, StormMessageKind.ENDED, calm_at))
        state = replace(
            state,
            active=False,
            tally=Tally(),
            seq=state.seq + 1,
            next_summary_at=None,
            last_hot_at=None,
            peak=Priority.P3,
            causes={},
            paged_causes=(),
        )
    return state, messages
