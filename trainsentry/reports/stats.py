"""Weekly statistics over the store: a connection and a period in, a `WeeklyStats` out.

Two layers: the store's `load_*` (store/report_loads.py) read rows for a period (the only
I/O), `compute` here turns rows into numbers (pure, unit-tested with hand-computed weeks).
`collect` runs both, for the period and the one before it (for the change column).

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
- A *hang* is one job's stall: its hang alerts (`hang_alertnames`: the probe's trigger and
  the fallback rules) whose starts lie within `hang_merge_s` of the first one's. Time to
  detection = first notification sent for any of them - the stall's start (the probe's
  `stalled_since`; for a hang only the rules saw, the first rule's `startsAt`, so the rule's
  threshold and `for:` are not counted). Not paged = no notification went out before the
  period's end (the diagnosis found a checkpoint, or no hang).
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from typing import Any

from trainsentry.alerts import PROBE_HANG_ALERT, Priority
from trainsentry.gateway.policy import Policy
from trainsentry.reports.figures import (
    Change,
    Durations,
    Hangs,
    Headline,
    JobCount,
    Pages,
    QuietWindow,
    RuleNoise,
    Storm,
    WeeklyStats,
)
from trainsentry.reports.hardware import fault_count, hardware, policy_of
from trainsentry.reports.period import Period
from trainsentry.store.engine import Connection
from trainsentry.store.maintenance_windows import quiet_open_windows
from trainsentry.store.report_loads import (
    Occurrence,
    PageRow,
    Scope,
    StormRow,
    load_first_notices,
    load_history,
    load_occurrences,
    load_pages,
    load_storms,
)

# The default scope: every alert.
EVERYTHING = Scope()
PRIORITIES: tuple[str, ...] = tuple(p.value for p in Priority)


@dataclass(frozen=True, slots=True)
class StatsOptions:
    """Thresholds the statistics use; `from_policy` takes K, T, R from the alert policy."""

    recurrence_window_s: float = 3600.0
    flap_transitions: int = 4
    flap_window_s: float = 900.0
    short_lived_s: float = 300.0  # an occurrence resolved faster than this is "short-lived"
    top: int = 10
    paging_channels: tuple[str, ...] = ("phone",)
    hang_alertnames: tuple[str, ...] = (
        "TrainingJobHang",
        "TrainingRankStalledBehindPeers",
        PROBE_HANG_ALERT,
    )
    hang_merge_s: float = 900.0
    # a maintenance window still open this long after its muted alerts all resolved is listed
    maintenance_quiet_s: float = 86400.0
    # The alert policy whose node_health weighs hardware faults (None: the shipped one).
    policy: Policy | None = None

    @classmethod
    def from_policy(cls, policy: Any, **overrides: Any) -> StatsOptions:
        dedup = policy.dedup
        return cls(
            policy=policy,
            recurrence_window_s=float(dedup.recurrence_window),
            flap_transitions=int(dedup.flap_transitions),
            flap_window_s=float(dedup.flap_window),
            paging_channels=tuple(policy.routing.paging_channels) or ("phone",),
            **overrides,
        )


# ---------------------------------------------------------------- numbers


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


def _stall_start(occ: Occurrence) -> datetime:
    return occ.stalled_since or occ.starts_at


def hang_incidents(
    occs: Sequence[Occurrence],
    first_notices: Mapping[int, datetime],
    end: datetime,
    opts: StatsOptions = StatsOptions(),
) -> Hangs:
    """Pure: the period's hangs and their time to detection (see the module docstring)."""
    names = set(opts.hang_alertnames)
    by_job: dict[str, list[Occurrence]] = defaultdict(list)
    for occ in occs:
        if occ.alertname in names:
            by_job[occ.job_ref].append(occ)
    incidents: list[list[Occurrence]] = []
    for found in by_job.values():
        found.sort(key=lambda o: (_stall_start(o), o.id))
        group: list[Occurrence] = []
        for occ in found:
            if (
                group
                and (_stall_start(occ) - _stall_start(group[0])).total_seconds() > opts.hang_merge_s
            ):
                incidents.append(group)
                group = []
            group.append(occ)
        incidents.append(group)
    detections: list[float] = []
    for incident in incidents:
        stalled = min(_stall_start(o) for o in incident)
        sent = [t for o in incident if (t := _before(first_notices.get(o.id), end)) is not None]
        if sent:
            detections.append(max(0.0, (min(sent) - stalled).total_seconds()))
    return Hangs(
        incidents=len(incidents),
        paged=len(detections),
        not_paged=len(incidents) - len(detections),
        detection=Durations.of(detections),
        max_detection_s=max(detections) if detections else None,
    )


def compute(
    period: Period,
    occurrences: Sequence[Occurrence],
    history: Sequence[Occurrence] = (),
    pages: Sequence[PageRow] = (),
    storms: Sequence[StormRow] = (),
    opts: StatsOptions = StatsOptions(),
    scope: Scope = EVERYTHING,
    first_notices: Mapping[int, datetime] | None = None,
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

    policy = policy_of(opts.policy)
    hot_nodes, hot_gpus, hot_ports, xids = hardware(occs, opts.top, policy, end)
    hardware_faults = fault_count(occs, policy)
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
        hangs=hang_incidents(occs, first_notices or {}, end, opts),
        hardware_faults=hardware_faults,
    )


def compare(current: WeeklyStats, previous: Headline) -> WeeklyStats:
    """`current` with the previous period's headline and the change against it."""
    now = current.headline()
    changes = [
        Change("Alerts", now.total, previous.total),
        *(
            Change(f"{p} alerts", now.by_priority[p], previous.by_priority.get(p, 0))
            for p in PRIORITIES
        ),
        Change("Hardware faults", now.hardware, previous.hardware),
        Change("Recurring", now.recurring, previous.recurring),
        Change("Flapping", now.flapping, previous.flapping),
        Change("Storms", now.storms, previous.storms),
        Change("Pages", now.pages, previous.pages),
        Change("MTTA median", now.mtta_median_s, previous.mtta_median_s, "seconds"),
        Change("MTTR median", now.mttr_median_s, previous.mttr_median_s, "seconds"),
    ]
    return replace(current, previous=previous, changes=tuple(changes))


async def collect_period(
    conn: Connection,
    period: Period,
    opts: StatsOptions = StatsOptions(),
    scope: Scope = EVERYTHING,
) -> WeeklyStats:
    """Loads the rows of `period` and computes its statistics (no comparison)."""
    start, end = period.start, period.end
    occurrences = await load_occurrences(conn, start, end, scope)
    lookback = timedelta(seconds=max(opts.recurrence_window_s, opts.flap_window_s))
    history = await load_history(conn, (o.fingerprint for o in occurrences), start, lookback)
    pages = await load_pages(conn, start, end, opts.paging_channels, scope)
    storms = await load_storms(conn, start, end, scope)
    names = set(opts.hang_alertnames)
    notices = await load_first_notices(conn, (o.id for o in occurrences if o.alertname in names))
    return compute(period, occurrences, history, pages, storms, opts, scope, notices)


async def collect(
    conn: Connection,
    period: Period,
    opts: StatsOptions = StatsOptions(),
    scope: Scope = EVERYTHING,
) -> WeeklyStats:
    """Statistics of `period` compared against the period before it."""
    current = await collect_period(conn, period, opts, scope)
    previous = await collect_period(conn, period.previous(), opts, scope)
    quiet = await quiet_open_windows(
        conn, now=period.end, quiet_since=period.end - timedelta(seconds=opts.maintenance_quiet_s)
    )
    windows = tuple(
        QuietWindow(w.id, w.reason, w.created_by, w.ends_at, muted, last)
        for w, muted, last in quiet
    )
    return replace(compare(current, previous.headline()), quiet_windows=windows)
