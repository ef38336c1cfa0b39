"""Report periods: calendar weeks (or day ranges) in a configured timezone. Pure.

A week runs from 00:00 on `week_start` (Monday by default) to 00:00 seven days later, local
time, so a week that crosses a DST change is 167 or 169 hours long. Periods are half-open
`[start, end)`; `start`/`end` are timezone-aware datetimes in the report's zone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from trainsentry.config.reports import WEEKDAYS

_ISO_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")
_RANGE = re.compile(r"^(\d{4}-\d{2}-\d{2})\.\.(\d{4}-\d{2}-\d{2})$")
_WEEKS_AGO = re.compile(r"^(\d+)-weeks?-ago$")

PERIOD_HELP = (
    "last-week (default), this-week (so far), N-weeks-ago, an ISO week YYYY-Www, "
    "or a day range YYYY-MM-DD..YYYY-MM-DD (both days included)"
)


class PeriodError(ValueError):
    """A period or timezone the user gave cannot be understood."""


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise PeriodError(
            f"unknown timezone {name!r} (use an IANA name like Asia/Shanghai)"
        ) from exc


@dataclass(frozen=True, slots=True)
class Period:
    """A report period: local days `first_day` .. `last_day` (inclusive) in `tz`."""

    first_day: date
    days: int
    tz: str
    weekly: bool = True

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.tz)

    @property
    def last_day(self) -> date:
        return self.first_day + timedelta(days=self.days - 1)

    @property
    def start(self) -> datetime:
        return datetime.combine(self.first_day, time(0), tzinfo=self.zone)

    @property
    def end(self) -> datetime:
        return datetime.combine(
            self.first_day + timedelta(days=self.days), time(0), tzinfo=self.zone
        )

    @property
    def key(self) -> str:
        """Stable identity of the period (used for idempotent sending)."""
        kind = "week" if self.weekly else f"{self.days}d"
        return f"{kind}:{self.first_day.isoformat()}:{self.tz}"

    @property
    def title(self) -> str:
        first, last = self.first_day, self.last_day
        if first.year == last.year:
            span = f"{first:%a %d %b} – {last:%a %d %b %Y}"
        else:
            span = f"{first:%a %d %b %Y} – {last:%a %d %b %Y}"
        return f"{'Week' if self.weekly else 'Period'} {span} ({self.tz})"

    def day_list(self) -> list[date]:
        return [self.first_day + timedelta(days=i) for i in range(self.days)]

    def previous(self) -> Period:
        """The period of the same length just before this one."""
        return Period(self.first_day - timedelta(days=self.days), self.days, self.tz, self.weekly)

    def next(self) -> Period:
        return Period(self.first_day + timedelta(days=self.days), self.days, self.tz, self.weekly)

    def local_day(self, moment: datetime) -> date:
        return moment.astimezone(self.zone).date()


def week_containing(moment: datetime, tz: str, week_start: str = "monday") -> Period:
    """The week (starting on `week_start`, local time in `tz`) that contains `moment`."""
    if week_start not in WEEKDAYS:
        raise PeriodError(f"week_start must be one of {', '.join(WEEKDAYS)}, not {week_start!r}")
    if moment.tzinfo is None:
        raise PeriodError("moment must be timezone-aware")
    today = moment.astimezone(zone(tz)).date()
    offset = (today.weekday() - WEEKDAYS.index(week_start)) % 7
    return Period(today - timedelta(days=offset), 7, tz)


def last_full_week(now: datetime, tz: str, week_start: str = "monday") -> Period:
    return week_containing(now, tz, week_start).previous()


def parse_period(spec: str, now: datetime, tz: str, week_start: str = "monday") -> Period:
    """Turns what the user typed (see PERIOD_HELP) into a Period."""
    spec = spec.strip()
    zone(tz)  # validate early
    if spec in ("last-week", "previous-week"):
        return last_full_week(now, tz, week_start)
    if spec == "this-week":
        return week_containing(now, tz, week_start)
    if match := _WEEKS_AGO.match(spec):
        period = week_containing(now, tz, week_start)
        return Period(period.first_day - timedelta(weeks=int(match[1])), 7, tz)
    if match := _ISO_WEEK.match(spec):
        try:
            monday = date.fromisocalendar(int(match[1]), int(match[2]), 1)
        except ValueError as exc:
            raise PeriodError(f"no such ISO week: {spec}") from exc
        return Period(monday, 7, tz)
    if match := _RANGE.match(spec):
        try:
            first, last = date.fromisoformat(match[1]), date.fromisoformat(match[2])
        except ValueError as exc:
            raise PeriodError(f"bad date in {spec!r}: {exc}") from exc
        if last < first:
            raise PeriodError(f"period ends before it starts: {spec}")
        days = (last - first).days + 1
        if days > 366:
            raise PeriodError("a report period is at most 366 days")
        return Period(first, days, tz, weekly=False)
    raise PeriodError(f"cannot read period {spec!r}; use {PERIOD_HELP}")


def due_weeks(
    last_sent: date | None, now: datetime, tz: str, week_start: str = "monday", catch_up: int = 4
) -> list[Period]:
    """Full weeks not yet reported, oldest first: those after `last_sent` (the first day of
    the newest week already sent) up to the last full week, at most `catch_up` of them.
    With nothing sent yet, only the last full week is due."""
    newest = last_full_week(now, tz, week_start)
    if last_sent is None:
        return [newest]
    due: list[Period] = []
    period = newest
    while period.first_day > last_sent and len(due) < max(1, catch_up):
        due.append(period)
        period = period.previous()
    return list(reversed(due))
