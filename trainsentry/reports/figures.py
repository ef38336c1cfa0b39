"""The weekly report's figures as types: what `stats.compute` returns and the renderers
(weekly.py, charts.py, digest.py) read. Pure data; `nearest_rank` is the percentile rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

from trainsentry.reports.period import Period
from trainsentry.store.report_loads import Occurrence, Scope


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
class Hangs:
    """Hang incidents of the period: one per job and stall (its hang alerts merged)."""

    incidents: int = 0
    paged: int = 0  # a notification went out
    not_paged: int = 0  # the diagnosis held the page back (checkpoint, not confirmed)
    #: stall start -> first notification, over the paged incidents.
    detection: Durations = Durations()
    max_detection_s: float | None = None


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
class QuietWindow:
    """A maintenance window still open at the period's end although every alert it muted
    resolved long before (StatsOptions.maintenance_quiet_s): forgotten, probably."""

    id: str
    reason: str
    created_by: str
    ends_at: datetime | None  # None: a recurring window
    muted: int
    last_resolved_at: datetime


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
    hangs: Hangs = Hangs()
    quiet_windows: tuple[QuietWindow, ...] = ()

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


def nearest_rank(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank method: the ceil(q*n)-th smallest value."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[rank - 1])
