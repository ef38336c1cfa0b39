"""Handoffs: the instants at which the person paged first changes. Pure: time is a parameter."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainsentry.oncall.schedule import UNTIL_HORIZON, boundaries, entries_at
from trainsentry.oncall.types import Schedule

_CHUNK = timedelta(days=8)


@dataclass(frozen=True)
class Handoff:
    """At `at` the pager passes from `before` to `after` ((name, layer) or None: nobody)."""

    at: datetime
    before: tuple[str, str] | None
    after: tuple[str, str] | None


def _first(schedule: Schedule, t: datetime) -> tuple[str, str] | None:
    entries = entries_at(schedule, t)
    return entries[0] if entries else None


def handoffs(schedule: Schedule, after: datetime, until: datetime) -> list[Handoff]:
    """Pure: the handoffs in (after, until], in order. A layer change that keeps the same
    person first (alice's primary shift ends as her night starts) counts too."""
    found: list[Handoff] = []
    before = _first(schedule, after)
    for point in boundaries(schedule, after, until):
        now = _first(schedule, point)
        if now != before:
            found.append(Handoff(point, before, now))
            before = now
    return found


def next_handoff(
    schedule: Schedule, after: datetime, horizon: timedelta = UNTIL_HORIZON
) -> datetime | None:
    """Pure: the first handoff after `after`, None if not within `horizon`."""
    cursor, stop = after, after + horizon
    while cursor < stop:
        chunk_end = min(cursor + _CHUNK, stop)
        found = handoffs(schedule, cursor, chunk_end)
        if found:
            return found[0].at
        cursor = chunk_end
    return None
