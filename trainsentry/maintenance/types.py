"""Maintenance window types, one place: a window (one-off or recurring), its label matchers
and its recurrence.

All are frozen and already validated (maintenance/windows.py builds them from a request, or
from a stored row); the pure functions of maintenance/match.py never see raw request text.
Invariants: every instant is timezone-aware; a recurrence's wall times are local to its `tz`;
at least one matcher does not match the empty string (windows.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from trainsentry.userregex import UserRegex


@dataclass(frozen=True)
class Matcher:
    """`label` equals `value`, or fully matches the regular expression `pattern` (RE2,
    trainsentry/userregex.py)."""

    label: str
    value: str | None = None
    pattern: UserRegex | None = None

    @property
    def matches_empty(self) -> bool:
        """Whether an alert without the label (the empty string) is matched."""
        return self.pattern.matches_empty if self.pattern is not None else self.value == ""


@dataclass(frozen=True)
class Recurrence:
    """Occurrences start at the local wall times of `rrule` (anchored at `anchor` + `start`)
    and last `duration` of real time each."""

    rrule: str
    start: time
    anchor: date
    tz: ZoneInfo
    duration: timedelta


@dataclass(frozen=True)
class MaintenanceWindow:
    """Either one-off (`starts_at`..`ends_at`) or `recurring`; matchers all must hold."""

    id: str
    matchers: tuple[Matcher, ...]
    reason: str = ""
    created_by: str = ""
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    recurring: Recurrence | None = None
