"""Maintenance windows: is an alert with these labels muted at instant t, and by which window.

Every function here is pure: time is a parameter (the rule objects are memoised, which
changes no answer).

A window holds when every matcher holds (a label missing from the alert is the empty string,
as in Alertmanager; regular expressions are RE2 and fully anchored, as in Alertmanager:
trainsentry/userregex.py) and t lies in
the window: one-off windows from `starts_at` (included) to `ends_at` (excluded); recurring
windows in an occurrence, which starts at a local wall time of the RRULE (anchored at the
window's `anchor` date and `start` time in its time zone, with schedule.py's wall time rule
for times the clocks skip or repeat) and lasts `duration` of real time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from functools import lru_cache

from dateutil.rrule import rrule, rrulestr

from trainsentry.maintenance.types import MaintenanceWindow, Matcher, Recurrence
from trainsentry.oncall.schedule import wall_to_instant

# A rule with no occurrence this long after its anchor "never fires" (config.py refuses it).
FIRES_WITHIN = timedelta(days=3660)
_SLACK = timedelta(days=1)  # more than any UTC offset change


@lru_cache(maxsize=256)
def _rule(text: str, dtstart: datetime) -> rrule:
    rule = rrulestr(text, dtstart=dtstart, cache=True)
    assert isinstance(rule, rrule)  # forceset=False and no RDATE/EXDATE lines: one rule
    return rule


def rule_of(recurrence: Recurrence) -> rrule:
    """Pure: the recurrence's rule over naive local wall times."""
    return _rule(recurrence.rrule, datetime.combine(recurrence.anchor, recurrence.start))


def first_occurrence(recurrence: Recurrence) -> datetime | None:
    """Pure: the first occurrence's local wall time, None when there is none within
    FIRES_WITHIN of the anchor (the search is bounded: a rule that can never match, like
    February 30th, would otherwise be searched up to year 9999)."""
    rule = rule_of(recurrence)
    dtstart = datetime.combine(recurrence.anchor, recurrence.start)
    # dateutil keeps COUNT and UNTIL here (checked by tests/maintenance/test_match.py).
    count, until = getattr(rule, "_count", None), getattr(rule, "_until", None)
    if count == 0:
        return None
    limit = dtstart + FIRES_WITHIN if until is None else min(until, dtstart + FIRES_WITHIN)
    found: datetime | None = rule.replace(count=None, until=limit).after(dtstart, inc=True)
    return found


def outlasts(recurrence: Recurrence, cap: timedelta) -> bool:
    """Pure: whether the window lasts longer than `cap` in all, from its first occurrence's
    start to its last occurrence's end (a rule without COUNT or UNTIL always does). Reads the
    occurrences only up to the first one that ends past the cap."""
    first = first_occurrence(recurrence)
    if first is None:
        return False
    start = wall_to_instant(first, recurrence.tz)
    latest = first + cap - recurrence.duration  # the last start (wall time) that may fit
    for occurrence in rule_of(recurrence).xafter(latest - _SLACK, inc=True):
        if wall_to_instant(occurrence, recurrence.tz) + recurrence.duration - start > cap:
            return True
        if occurrence > latest + _SLACK:  # past any offset change: it did not fit above
            break
    return False


def occurrence_at(recurrence: Recurrence, t: datetime) -> tuple[datetime, datetime] | None:
    """Pure: (start, end) instants of the occurrence covering `t`, the one ending last when
    several overlap; None when none covers `t`."""
    wall = t.astimezone(recurrence.tz).replace(tzinfo=None)
    candidates = rule_of(recurrence).between(
        wall - recurrence.duration - _SLACK, wall + _SLACK, inc=True
    )
    best: tuple[datetime, datetime] | None = None
    for occurrence in candidates:
        start = wall_to_instant(occurrence, recurrence.tz)
        end = start + recurrence.duration
        if start <= t < end and (best is None or end > best[1]):
            best = (start, end)
    return best


def active_span(window: MaintenanceWindow, t: datetime) -> tuple[datetime, datetime] | None:
    """Pure: (start, end) of the window's stretch covering `t`, None when it is not active."""
    if window.recurring is not None:
        return occurrence_at(window.recurring, t)
    starts_at, ends_at = window.starts_at, window.ends_at
    if starts_at is not None and ends_at is not None and starts_at <= t < ends_at:
        return (starts_at, ends_at)
    return None


def matcher_holds(matcher: Matcher, labels: Mapping[str, str]) -> bool:
    """Pure: equality, or a full match of the regular expression (on the value's first
    userregex.MAX_VALUE_CHARS characters)."""
    value = labels.get(matcher.label, "")
    if not isinstance(value, str):
        return False
    if matcher.pattern is not None:
        return matcher.pattern.fullmatch(value)
    return value == matcher.value


def labels_match(window: MaintenanceWindow, labels: Mapping[str, str]) -> bool:
    """Pure: every matcher of the window holds for `labels`."""
    return all(matcher_holds(matcher, labels) for matcher in window.matchers)


def muted_by(
    windows: Iterable[MaintenanceWindow], labels: Mapping[str, str], t: datetime
) -> MaintenanceWindow | None:
    """Pure: the first window (in the given order) that mutes an alert with `labels` at `t`."""
    for window in windows:
        if labels_match(window, labels) and active_span(window, t) is not None:
            return window
    return None
