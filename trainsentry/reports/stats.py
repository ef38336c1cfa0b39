"""Weekly statistics over the store: a connection and a period in, a `WeeklyStats` out.

Two layers: `load_*` read rows for a period (the only I/O), `compute` turns rows into
numbers (pure, unit-tested with hand-computed weeks). `collect` runs both, for the period
and the one before it (for the change column).

Definitions (also in docs/reports.md):
- An *occurrence* is one alert row (fingerprint + startsAt). It belongs to the period in
  which it started. Everything is judged as of the period's end: an ack or resolve that
  came later does not count, so re-rendering a past week gives the same numbers.
- *new* / *recurring* / *flapping* partition the occurrences: flapping when its fingerprint
  made at least K status changes within T up to this firing; else recurring when the same
  fingerprint resolved at most R before this one started; else new. K, T and R are the
  alert policy's dedup settings.
- MTTA = acked_at - created_at (from when we knew to when a human acknowledged); MTTR =
  resolved_at - starts_at (how long the problem lasted). Median and p90 (nearest rank).
- Storms come from the storm messages the policy sent (outbox rows of kind "storm").
- Pages are outbox rows of the paging channels (default "phone"): incidents paged = distinct
  alerts, calls = rows sent; an incident is acknowledged when its alert was acked.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Priority
from trainsentry.reports.period import Period
from trainsentry.store.schema import alerts, notifications

PRIORITIES: tuple[str, ...] = tuple(p.value for p in Priority)
HARDWARE_COMPONENTS = frozenset({"gpu", "fabric", "node"})
NODE_LABELS = ("node", "Hostname", "hostname", "instance")
GPU_LABELS = ("gpu", "GPU_I_ID", "UUID")
NO_JOB = "(no job)"
_IN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class StatsOptions:
    """Thresholds the statistics use; `from_policy` takes K, T, R from the alert policy."""

    recurrence_window_s: float = 3600.0
    flap_transitions: int = 4
    flap_window_s: float = 900.0
    short_lived_s: float = 300.0  # an occurrence resolved faster than this is "short-lived"
    top: int = 10
    paging_channels: tuple[str, ...] = ("phone",)

    @classmethod
    def from_policy(cls, policy: Any, **overrides: Any) -> StatsOptions:
        dedup = policy.dedup
        return cls(
            recurrence_window_s=float(dedup.recurrence_window),
            flap_transitions=int(dedup.flap_transitions),
            flap_window_s=float(dedup.flap_window),
            paging_channels=tuple(policy.routing.paging_channels) or ("phone",),
            **overrides,
        )


@dataclass(frozen=True, slots=True)
class Scope:
    """Which alerts a report covers: everything, or the given namespaces / `ns/name` jobs."""

    name: str = "cluster"
    namespaces: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        return not self.namespaces and not self.jobs

    def covers(self, namespace: str, job: str) -> bool:
        if self.everything:
            return True
        return namespace in self.namespaces or f"{namespace}/{job}" in self.jobs


# ---------------------------------------------------------------- rows


@dataclass(frozen=True, slots=True)
class Occurrence:
    id: int
    fingerprint: str
    alertname: str
    priority: str
    component: str
    namespace: str
    job: str
    labels: Mapping[str, str]
    summary: str
    starts_at: datetime
    created_at: datetime
    resolved_at: datetime | None
    acked_at: datetime | None
    acked_by: str | None

    @property
    def job_ref(self) -> str:
        if not self.job:
            return NO_JOB
        return f"{self.namespace}/{self.job}" if self.namespace else self.job

    @property
    def node(self) -> str:
        return first_label(self.labels, NODE_LABELS)

    @property
    def hardware(self) -> bool:
        return self.component in HARDWARE_COMPONENTS


@dataclass(frozen=True, slots=True)
class PageRow:
    alert_id: int | None
    status: str
    acked_at: datetime | None


@dataclass(frozen=True, slots=True)
class StormRow:
    job: str
    event: str
    at: datetime
    total: int
    priority: str


def first_label(labels: Mapping[str, str], names: Iterable[str]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return str(value)
    return ""


def _priority(row_priority: str | None, labels: Mapping[str, str]) -> str:
    for value in (row_priority, labels.get("priority")):
        if value in PRIORITIES:
            return str(value)
    return Priority.P3.value  # unclassified alerts count as informational


def _occurrence(row: Any) -> Occurrence:
    labels = {str(k): str(v) for k, v in (row.labels or {}).items()}
    annotations = row.annotations or {}
    return Occurrence(
        id=int(row.id),
        fingerprint=row.fingerprint,
        alertname=row.alertname or labels.get("alertname", ""),
        priority=_priority(row.priority, labels),
        component=labels.get("component", "") or "unknown",
        namespace=row.job_namespace or "",
        job=row.job_name or "",
        labels=labels,
        summary=str(annotations.get("summary", "")),
        starts_at=row.starts_at,
        created_at=row.created_at,
        resolved_at=row.resolved_at,
        acked_at=row.acked_at,
        acked_by=row.acked_by,
    )


def _scope_clause(scope: Scope) -> Any:
    if scope.everything:
        return None
    clauses: list[Any] = []
    if scope.namespaces:
        clauses.append(alerts.c.job_namespace.in_(sorted(scope.namespaces)))
    for ref in sorted(scope.jobs):
        namespace, _, name = ref.rpartition("/")
        clauses.append(and_(alerts.c.job_namespace == namespace, alerts.c.job_name == name))
    return or_(*clauses)


async def load_occurrences(
    conn: AsyncConnection, start: datetime, end: datetime, scope: Scope = Scope()
) -> list[Occurrence]:
    """Occurrences that started in [start, end), oldest first."""
    query = (
        select(alerts)
        .where(alerts.c.starts_at >= start, alerts.c.starts_at < end)
        .order_by(alerts.c.starts_at, alerts.c.id)
    )
    clause = _scope_clause(scope)
    if clause is not None:
        query = query.where(clause)
    return [_occurrence(row) for row in await conn.execute(query)]


async def load_history(
    conn: AsyncConnection, fingerprints: Iterable[str], start: datetime, lookback: timedelta
) -> list[Occurrence]:
    """Earlier occurrences of `fingerprints` that were still open or resolved at most
    `lookback` before `start` (what recurrence and flapping need to look back at)."""
    found: list[Occurrence] = []
    wanted = sorted(set(fingerprints))
    for i in range(0, len(wanted), _IN_CHUNK):
        query = select(alerts).where(
            alerts.c.fingerprint.in_(wanted[i : i + _IN_CHUNK]),
            alerts.c.starts_at < start,
            or_(alerts.c.resolved_at.is_(None), alerts.c.resolved_at >= start - lookback),
        )
        found.extend(_occurrence(row) for row in await conn.execute(query))
    return sorted(found, key=lambda o: (o.starts_at, o.id))


async def load_pages(
    conn: AsyncConnection,
    start: datetime,
    end: datetime,
    channels: Sequence[str],
    scope: Scope = Scope(),
) -> list[PageRow]:
    query = (
        select(notifications.c.alert_id, notifications.c.status, alerts.c.acked_at)
        .select_from(notifications.outerjoin(alerts, notifications.c.alert_id == alerts.c.id))
        .where(
            notifications.c.channel.in_(list(channels)),
            notifications.c.created_at >= start,
            notifications.c.created_at < end,
        )
    )
    clause = _scope_clause(scope)
    if clause is not None:
        query = query.where(clause)
    return [
        PageRow(None if row.alert_id is None else int(row.alert_id), row.status, row.acked_at)
        for row in await conn.execute(query)
    ]


def _storm_job(key: str) -> tuple[str, str]:
    """("ns", "name") of a storm job key such as "trainingjob:ns/name"."""
    _, _, ref = key.partition(":")
    namespace, _, name = ref.rpartition("/")
    return namespace, name


async def load_storms(
    conn: AsyncConnection, start: datetime, end: datetime, scope: Scope = Scope()
) -> list[StormRow]:
    query = select(
        notifications.c.group_key, notifications.c.payload, notifications.c.priority
    ).where(
        notifications.c.kind == "storm",
        notifications.c.created_at >= start,
        notifications.c.created_at < end,
    )
    rows: list[StormRow] = []
    for row in await conn.execute(query):
        payload = row.payload or {}
        job = str(payload.get("job") or row.group_key.removeprefix("storm:"))
        if not scope.covers(*_storm_job(job)):
            continue
        try:
            at = datetime.fromisoformat(str(payload["at"]))
        except (KeyError, ValueError):
            continue
        total = int((payload.get("storm") or {}).get("total", 0) or 0)
        # the policy names them storm_started / storm_summary / storm_ended
        event = str(payload.get("event", "")).removeprefix("storm_")
        rows.append(StormRow(job, event, at, total, row.priority))
    return rows


# ---------------------------------------------------------------- numbers


@dataclass(frozen=True, slots=True)
class Durations:
    count: int = 0
    median_s: float | None = None
    p90_s: float | None = None

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Durations:
        if not seconds:
            return cls()
        return cls(len(seconds), float(statistics.median(seconds)), nearest_rank(seconds, 0.9))


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank method: the ceil(q*n)-th smallest value."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])


@dataclass(frozen=True, slots=True)
class RuleNoise:
    alertname: str
    component: str
    fired: int
    median_lifetime_s: float | None
    short_lived: int  # resolved within StatsOptions.short_lived_s

    @property
    def tuning_candidate(self) -> bool:
        return self.fired >= 3 and self.short_lived * 2 >= self.fired


@dataclass(frozen=True, slots=True)
class Hotspot:
    key: str
    count: int
    alertnames: tuple[str, ...]  # most frequent first


@dataclass(frozen=True, slots=True)
class XidSeen:
    code: str
    count: int
    gpus: int  # distinct node/GPU pairs that reported it


@dataclass(frozen=True, slots=True)
class Storm:
    job: str
    started_at: datetime
    alerts: int  # largest total a summary of this storm reported
    peak: str
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class JobCount:
    job: str
    total: int
    by_priority: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Pages:
    incidents: int = 0  # distinct alerts paged
    calls: int = 0  # page notifications sent
    acked: int = 0  # paged incidents acknowledged by the period's end


@dataclass(frozen=True, slots=True)
class Headline:
    """The numbers compared against the previous period."""

    total: int
    by_priority: Mapping[str, int]
    new: int
    recurring: int
    flapping: int
    storms: int
    mtta_median_s: float | None
    mttr_median_s: float | None
    pages: int
    pages_acked: int
    hardware: int


@dataclass(frozen=True, slots=True)
class Change:
    name: str
    current: float | None
    previous: float | None
    unit: str = "count"  # or "seconds"
    lower_is_better: bool = True

    @property
    def delta(self) -> float | None:
        if self.current is None or self.previous is None:
            return None
        return self.current - self.previous

    @property
    def percent(self) -> float | None:
        if self.delta is None or not self.previous:
            return None
        return 100.0 * self.delta / self.previous

    @property
    def verdict(self) -> str:
        """better / worse / same / n/a."""
        if self.delta is None:
            return "n/a"
        if self.delta == 0:
            return "same"
        return "better" if (self.delta < 0) == self.lower_is_better else "worse"


@dataclass(frozen=True, slots=True)
class WeeklyStats:
    period: Period
    scope: Scope
    occurrences: tuple[Occurrence, ...]
    classes: Mapping[int, str]  # occurrence id -> new / recurring / flapping
    by_priority: Mapping[str, int]
    by_component: Mapping[str, int]
    by_job: tuple[JobCount, ...]
    flapping_fingerprints: int
    storms: tuple[Storm, ...]
    mtta: Mapping[str, Durations]  # by priority and "all"
    mttr: Mapping[str, Durations]
    open_at_end: int
    unacked_p0_p1: int
    top_rules: tuple[RuleNoise, ...]
    hot_nodes: tuple[Hotspot, ...]
    hot_gpus: tuple[Hotspot, ...]
    hot_ports: tuple[Hotspot, ...]
    xids: tuple[XidSeen, ...]
    pages: Pages
    per_day: tuple[tuple[date, Mapping[str, int]], ...]
    mttr_per_day: tuple[tuple[date, float | None], ...]
    previous: Headline | None = None
    changes: tuple[Change, ...] = field(default=())

    @property
    def total(self) -> int:
        return len(self.occurrences)

    def count_class(self, name: str) -> int:
        return sum(1 for c in self.classes.values() if c == name)

    @property
    def hardware(self) -> int:
        return sum(1 for o in self.occurrences if o.hardware)

    def headline(self) -> Headline:
        return Headline(
            total=self.total,
            by_priority=dict(self.by_priority),
            new=self.count_class("new"),
            recurring=self.count_class("recurring"),
            flapping=self.count_class("flapping"),
            storms=len(self.storms),
            mtta_median_s=self.mtta["all"].median_s,
            mttr_median_s=self.mttr["all"].median_s,
            pages=self.pages.incidents,
            pages_acked=self.pages.acked,
            hardware=self.hardware,
        )


def _before(moment: datetime | None, end: datetime) -> datetime | None:
    """`moment` if it happened before the period's end, else None (not yet, as of then)."""
    return moment if moment is not None and moment < end else None


def classify_occurrences(
    current: Sequence[Occurrence], history: Sequence[Occurrence], end: datetime, opts: StatsOptions
) -> dict[int, str]:
    """new / recurring / flapping for every occurrence in `current` (see module docstring)."""
    by_fp: dict[str, list[Occurrence]] = defaultdict(list)
    for occ in (*history, *current):
        by_fp[occ.fingerprint].append(occ)
    window = timedelta(seconds=opts.flap_window_s)
    recurrence = timedelta(seconds=opts.recurrence_window_s)
    classes: dict[int, str] = {}
    current_ids = {o.id for o in current}
    for occs in by_fp.values():
        occs.sort(key=lambda o: (o.starts_at, o.id))
        transitions = sorted(
            [o.starts_at for o in occs]
            + [r for o in occs if (r := _before(o.resolved_at, end)) is not None]
        )
        previous: Occurrence | None = None
        for occ in occs:
            if occ.id in current_ids:
                t = occ.starts_at
                recent = bisect_right(transitions, t) - bisect_right(transitions, t - window)
                resolved = _before(previous.resolved_at, end) if previous else None
                if recent >= opts.flap_transitions:
                    classes[occ.id] = "flapping"
                elif resolved is not None and timedelta(0) <= t - resolved <= recurrence:
                    classes[occ.id] = "recurring"
                else:
                    classes[occ.id] = "new"
            previous = occ
    return classes


def _durations_by_priority(values: Iterable[tuple[str, float]]) -> dict[str, Durations]:
    grouped: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    everything: list[float] = []
    for priority, seconds in values:
        grouped[priority].append(seconds)
        everything.append(seconds)
    result = {p: Durations.of(v) for p, v in grouped.items()}
    result["all"] = Durations.of(everything)
    return result


def _hotspots(keys: Iterable[tuple[str, str]], top: int) -> tuple[Hotspot, ...]:
    """(key, alertname) pairs → the `top` keys with most alerts, ties by key."""
    names: dict[str, Counter[str]] = defaultdict(Counter)
    for key, alertname in keys:
        if key:
            names[key][alertname] += 1
    ranked = sorted(names.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:top]
    return tuple(
        Hotspot(
            key,
            sum(c.values()),
            tuple(n for n, _ in sorted(c.items(), key=lambda x: (-x[1], x[0]))),
        )
        for key, c in ranked
    )


def _storms(rows: Sequence[StormRow]) -> tuple[Storm, ...]:
    """Storm episodes from their messages: one per job and `started` time (a start sent on
    several channels is one storm). Messages of a storm that started earlier are ignored."""
    by_job: dict[str, list[StormRow]] = defaultdict(list)
    for row in rows:
        by_job[row.job].append(row)
    storms: list[Storm] = []
    for job, job_rows in by_job.items():
        job_rows.sort(key=lambda r: (r.at, r.event != "started"))
        current: Storm | None = None
        for row in job_rows:
            if row.event == "started" and (current is None or current.started_at != row.at):
                if current is not None:
                    storms.append(current)
                current = Storm(job, row.at, 0, row.priority, None)
            if current is None:
                continue
            current = replace(
                current,
                alerts=max(current.alerts, row.total),
                peak=min(current.peak, row.priority, key=PRIORITIES.index),
                ended_at=row.at if row.event == "ended" else current.ended_at,
            )
        if current is not None:
            storms.append(current)
    return tuple(sorted(storms, key=lambda s: (s.started_at, s.job)))


def _pages(rows: Sequence[PageRow], end: datetime) -> Pages:
    incidents: dict[int, bool] = {}
    for row in rows:
        if row.alert_id is not None:
            incidents[row.alert_id] = _before(row.acked_at, end) is not None
    return Pages(
        incidents=len(incidents),
        calls=sum(1 for r in rows if r.status == "sent"),
        acked=sum(1 for acked in incidents.values() if acked),
    )


def _rule_noise(
    occs: Sequence[Occurrence], end: datetime, opts: StatsOptions
) -> tuple[RuleNoise, ...]:
    groups: dict[str, list[Occurrence]] = defaultdict(list)
    for occ in occs:
        groups[occ.alertname].append(occ)
    noise = []
    for name, group in groups.items():
        lifetimes = [
            (r - o.starts_at).total_seconds()
            for o in group
            if (r := _before(o.resolved_at, end)) is not None
        ]
        noise.append(
            RuleNoise(
                alertname=name,
                component=Counter(o.component for o in group).most_common(1)[0][0],
                fired=len(group),
                median_lifetime_s=float(statistics.median(lifetimes)) if lifetimes else None,
                short_lived=sum(1 for s in lifetimes if s < opts.short_lived_s),
            )
        )
    noise.sort(
        key=lambda r: (
            -r.fired,
            math.inf if r.median_lifetime_s is None else r.median_lifetime_s,
            r.alertname,
        )
    )
    return tuple(noise[: opts.top])


def _hardware(
    occs: Sequence[Occurrence], top: int
) -> tuple[tuple[Hotspot, ...], tuple[Hotspot, ...], tuple[Hotspot, ...], tuple[XidSeen, ...]]:
    """Hot nodes, GPUs and IB ports (hardware components only), and the XID codes seen."""
    hardware = [o for o in occs if o.hardware]
    hot_nodes = _hotspots(((o.node, o.alertname) for o in hardware), top)
    hot_gpus = _hotspots(
        (
            (f"{o.node} GPU {gpu}", o.alertname)
            for o in hardware
            if o.component == "gpu" and (gpu := first_label(o.labels, GPU_LABELS))
        ),
        top,
    )
    hot_ports = _hotspots(
        (
            (f"{o.node} {o.labels['device']}:{o.labels.get('port', '?')}", o.alertname)
            for o in hardware
            if o.component == "fabric" and o.labels.get("device")
        ),
        top,
    )
    xid_counts: Counter[str] = Counter()
    xid_gpus: dict[str, set[str]] = defaultdict(set)
    for occ in occs:
        xid = occ.labels.get("xid")
        if xid:
            xid_counts[xid] += 1
            xid_gpus[xid].add(f"{occ.node}/{first_label(occ.labels, GPU_LABELS)}")
    xids = tuple(
        XidSeen(code, n, len(xid_gpus[code]))
        for code, n in sorted(xid_counts.items(), key=lambda kv: (-kv[1], _xid_order(kv[0])))
    )
    return hot_nodes, hot_gpus, hot_ports, xids


def _per_day(
    period: Period, occs: Sequence[Occurrence]
) -> tuple[tuple[tuple[date, Mapping[str, int]], ...], tuple[tuple[date, float | None], ...]]:
    """Occurrences per local day by priority, and the median time to resolve per day."""
    days = period.day_list()
    counts: dict[date, Counter[str]] = {d: Counter() for d in days}
    ttr: dict[date, list[float]] = {d: [] for d in days}
    for occ in occs:
        day = period.local_day(occ.starts_at)
        counts[day][occ.priority] += 1
        resolved = _before(occ.resolved_at, period.end)
        if resolved is not None:
            ttr[day].append((resolved - occ.starts_at).total_seconds())
    per_day = tuple((d, {p: counts[d].get(p, 0) for p in PRIORITIES}) for d in days)
    medians = tuple((d, float(statistics.median(v)) if v else None) for d, v in ttr.items())
    return per_day, medians


def compute(
    period: Period,
    occurrences: Sequence[Occurrence],
    history: Sequence[Occurrence] = (),
    pages: Sequence[PageRow] = (),
    storms: Sequence[StormRow] = (),
    opts: StatsOptions = StatsOptions(),
    scope: Scope = Scope(),
) -> WeeklyStats:
    """All statistics of one period from its rows (pure)."""
    end = period.end
    occs = tuple(sorted(occurrences, key=lambda o: (o.starts_at, o.id)))
    classes = classify_occurrences(occs, history, end, opts)

    by_priority = {p: 0 for p in PRIORITIES}
    by_priority.update(Counter(o.priority for o in occs))
    by_component = dict(
        sorted(Counter(o.component for o in occs).items(), key=lambda kv: (-kv[1], kv[0]))
    )
    jobs: dict[str, Counter[str]] = defaultdict(Counter)
    for occ in occs:
        jobs[occ.job_ref][occ.priority] += 1
    by_job = tuple(
        JobCount(job, sum(c.values()), {p: c.get(p, 0) for p in PRIORITIES})
        for job, c in sorted(jobs.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    )[: opts.top]

    tta = [
        (o.priority, (a - o.created_at).total_seconds())
        for o in occs
        if (a := _before(o.acked_at, end)) is not None
    ]
    ttr = [
        (o.priority, (r - o.starts_at).total_seconds())
        for o in occs
        if (r := _before(o.resolved_at, end)) is not None
    ]
    open_at_end = sum(1 for o in occs if _before(o.resolved_at, end) is None)
    unacked = sum(
        1 for o in occs if o.priority in ("P0", "P1") and _before(o.acked_at, end) is None
    )

    hot_nodes, hot_gpus, hot_ports, xids = _hardware(occs, opts.top)
    per_day, mttr_per_day = _per_day(period, occs)

    return WeeklyStats(
        period=period,
        scope=scope,
        occurrences=occs,
        classes=classes,
        by_priority=by_priority,
        by_component=by_component,
        by_job=by_job,
        flapping_fingerprints=len({o.fingerprint for o in occs if classes[o.id] == "flapping"}),
        storms=_storms(storms),
        mtta=_durations_by_priority(tta),
        mttr=_durations_by_priority(ttr),
        open_at_end=open_at_end,
        unacked_p0_p1=unacked,
        top_rules=_rule_noise(occs, end, opts),
        hot_nodes=hot_nodes,
        hot_gpus=hot_gpus,
        hot_ports=hot_ports,
        xids=xids,
        pages=_pages(pages, end),
        per_day=per_day,
        mttr_per_day=mttr_per_day,
    )


def _xid_order(code: str) -> tuple[int, str]:
    return (int(code), code) if code.isdigit() else (1 << 30, code)


def compare(current: WeeklyStats, previous: Headline) -> WeeklyStats:
    """`current` with the previous period's headline and the change against it."""
    now = current.headline()
    changes = [
        Change("Alerts", now.total, previous.total),
        *(
            Change(f"{p} alerts", now.by_priority[p], previous.by_priority.get(p, 0))
            for p in PRIORITIES
        ),
        Change("Hardware alerts", now.hardware, previous.hardware),
        Change("Recurring", now.recurring, previous.recurring),
        Change("Flapping", now.flapping, previous.flapping),
        Change("Storms", now.storms, previous.storms),
        Change("Pages", now.pages, previous.pages),
        Change("MTTA median", now.mtta_median_s, previous.mtta_median_s, "seconds"),
        Change("MTTR median", now.mttr_median_s, previous.mttr_median_s, "seconds"),
    ]
    return replace(current, previous=previous, changes=tuple(changes))


async def collect_period(
    conn: AsyncConnection,
    period: Period,
    opts: StatsOptions = StatsOptions(),
    scope: Scope = Scope(),
) -> WeeklyStats:
    """Loads the rows of `period` and computes its statistics (no comparison)."""
    start, end = period.start, period.end
    occurrences = await load_occurrences(conn, start, end, scope)
    lookback = timedelta(seconds=max(opts.recurrence_window_s, opts.flap_window_s))
    history = await load_history(conn, (o.fingerprint for o in occurrences), start, lookback)
    pages = await load_pages(conn, start, end, opts.paging_channels, scope)
    storms = await load_storms(conn, start, end, scope)
    return compute(period, occurrences, history, pages, storms, opts, scope)


async def collect(
    conn: AsyncConnection,
    period: Period,
    opts: StatsOptions = StatsOptions(),
    scope: Scope = Scope(),
) -> WeeklyStats:
    """Statistics of `period` compared against the period before it."""
    current = await collect_period(conn, period, opts, scope)
    previous = await collect_period(conn, period.previous(), opts, scope)
    return compare(current, previous.headline())
