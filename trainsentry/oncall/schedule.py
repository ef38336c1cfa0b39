"""Schedule math: who is on call at an instant, until when, and the timeline over a range.

Every function here is pure: time is a parameter, nothing reads the clock or does I/O.

Wall time rule (handoffs, restriction edges, layer starts and ends): an event at local wall
time W happens at the first instant the schedule's clock shows W or later. So a weekly 09:00
handoff stays at 09:00 local across DST; an event inside a spring-forward gap (02:30 when the
clocks jump from 02:00 to 03:00) happens at the jump; an event inside a fall-back repeat
(02:30 when 02:00-03:00 runs twice) happens the first time.

Precedence at an instant: the override covering it first, then the layers that cover it, last
configured layer first. A swap covering the instant puts its `who` in the place of the person
it replaces, in every layer. A person appears once, at their first place.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

from trainsentry.oncall.types import (
    OVERRIDE_LAYER,
    Layer,
    OnCall,
    Restriction,
    Schedule,
    Segment,
)

# `until` looks this far ahead; a person on call for longer gets until=None.
UNTIL_HORIZON = timedelta(days=400)
_CHUNK = timedelta(days=8)
_DAY = timedelta(days=1)


def wall_to_instant(wall: datetime, tz: ZoneInfo) -> datetime:
    """Pure: the first instant (UTC) at which a clock in `tz` shows `wall` (naive) or later.

    Existing wall times map to their first occurrence (fold=0); a wall time in a gap maps to
    the instant the clocks jump over it.
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first
    # In a gap: fold=0 read `wall` with the offset before the jump (too late), fold=1 with the
    # offset after it (too early). The jump lies between; find it to the second.
    low = int(wall.replace(tzinfo=tz, fold=1).timestamp())  # shows a time before `wall`
    high = int(first.timestamp()) + 1  # shows a time after `wall`
    while high - low > 1:
        mid = (low + high) // 2
        if _wall(datetime.fromtimestamp(mid, UTC), tz) >= wall:
            high = mid
        else:
            low = mid
    return datetime.fromtimestamp(high, UTC)


def _wall(t: datetime, tz: ZoneInfo) -> datetime:
    return t.astimezone(tz).replace(tzinfo=None)


def handoff(layer: Layer, tz: ZoneInfo, k: int) -> datetime:
    """Pure: the instant of the layer's k-th handoff (k=0: its start)."""
    return wall_to_instant(layer.start_wall + k * layer.shift, tz)


def shift_index(layer: Layer, tz: ZoneInfo, t: datetime) -> int:
    """Pure: the number of the shift running at `t` (0 = the first), -1 before the start."""
    if t < handoff(layer, tz, 0):
        return -1
    k = max(0, (_wall(t, tz) - layer.start_wall) // layer.shift)
    while k > 0 and handoff(layer, tz, k) > t:
        k -= 1
    while handoff(layer, tz, k + 1) <= t:
        k += 1
    return k


def _range_instants(
    restrict: Restriction, tz: ZoneInfo, day: date
) -> list[tuple[datetime, datetime]]:
    out = []
    for hours in restrict.ranges:
        start = wall_to_instant(datetime.combine(day, hours.start), tz)
        end_day = day + _DAY if hours.end is None or hours.over_midnight else day
        end = wall_to_instant(datetime.combine(end_day, hours.end or time(0)), tz)
        out.append((start, end))
    return out


def restriction_covers(restrict: Restriction, tz: ZoneInfo, t: datetime) -> bool:
    """Pure: whether `t` lies in one of the daily ranges (a range that crosses midnight
    belongs to the day it starts on)."""
    today = t.astimezone(tz).date()
    return any(
        start <= t < end
        for day in (today - _DAY, today)
        for start, end in _range_instants(restrict, tz, day)
    )


def layer_member_at(layer: Layer, tz: ZoneInfo, t: datetime) -> str | None:
    """Pure: who the layer puts on call at `t`, None where it does not cover `t`."""
    if layer.end_wall is not None and t >= wall_to_instant(layer.end_wall, tz):
        return None
    k = shift_index(layer, tz, t)
    if k < 0:
        return None
    if layer.restrict is not None and not restriction_covers(layer.restrict, tz, t):
        return None
    return layer.members[k % len(layer.members)]


def entries_at(schedule: Schedule, t: datetime) -> tuple[tuple[str, str], ...]:
    """Pure: (name, layer) pairs on call at `t`, first = who gets paged (see module doc)."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for override in schedule.overrides:
        if override.start <= t < override.end and override.who not in seen:
            out.append((override.who, OVERRIDE_LAYER))
            seen.add(override.who)
    for layer in reversed(schedule.layers):
        who = layer_member_at(layer, schedule.tz, t)
        if who is not None:
            who = _swapped(schedule, who, t)
        if who is not None and who not in seen:
            out.append((who, layer.name))
            seen.add(who)
    return tuple(out)


def _swapped(schedule: Schedule, who: str, t: datetime) -> str:
    for swap in schedule.swaps:
        if swap.replaces == who and swap.start <= t < swap.end:
            return swap.who
    return who


def _layer_boundaries(layer: Layer, tz: ZoneInfo, a: datetime, b: datetime) -> set[datetime]:
    found: set[datetime] = set()
    first = max(0, shift_index(layer, tz, a))
    last = max(0, shift_index(layer, tz, b)) + 1
    found.update(handoff(layer, tz, k) for k in range(first, last + 1))
    if layer.end_wall is not None:
        found.add(wall_to_instant(layer.end_wall, tz))
    if layer.restrict is not None:
        day, stop = a.astimezone(tz).date() - _DAY, b.astimezone(tz).date() + _DAY
        while day <= stop:
            for start, end in _range_instants(layer.restrict, tz, day):
                found.update((start, end))
            day += _DAY
    return {point for point in found if a < point <= b}


def boundaries(schedule: Schedule, a: datetime, b: datetime) -> list[datetime]:
    """Pure: sorted instants in (a, b] at which the answer may change (handoffs, restriction
    edges, layer starts and ends, override starts and ends). Between two of them it cannot."""
    found: set[datetime] = set()
    for layer in schedule.layers:
        found |= _layer_boundaries(layer, schedule.tz, a, b)
    edges = [(o.start, o.end) for o in schedule.overrides]
    edges += [(s.start, s.end) for s in schedule.swaps]
    for edge in edges:
        found.update(point for point in edge if a < point <= b)
    return sorted(found)


def timeline(schedule: Schedule, start: datetime, end: datetime) -> list[Segment]:
    """Pure: the answer from `start` to `end` as segments; neighbours always differ; none
    when `end` is not after `start`."""
    segments: list[Segment] = []
    if end <= start:
        return segments
    points = [start, *(p for p in boundaries(schedule, start, end) if p < end), end]
    for here, there in pairwise(points):
        entries = entries_at(schedule, here)
        if segments and segments[-1].entries == entries:
            segments[-1] = Segment(segments[-1].start, there, entries)
        else:
            segments.append(Segment(here, there, entries))
    return segments


def on_call(schedule: Schedule, at: datetime, horizon: timedelta = UNTIL_HORIZON) -> list[OnCall]:
    """Pure: who is on call at `at`, first = who gets paged, each with `until`: the next
    instant at which that person stops being on call in that layer (for the first entry: at
    which someone else, or nobody, comes first); None if not within `horizon`."""
    entries = entries_at(schedule, at)
    until: dict[int, datetime] = {}
    cursor, stop = at, at + horizon
    while len(until) < len(entries) and cursor < stop:
        chunk_end = min(cursor + _CHUNK, stop)
        for point in boundaries(schedule, cursor, chunk_end):
            now = entries_at(schedule, point)
            for i, entry in enumerate(entries):
                holds = now[:1] == (entry,) if i == 0 else entry in now
                if i not in until and not holds:
                    until[i] = point
            if len(until) == len(entries):
                break
        cursor = chunk_end
    return [
        OnCall(name=name, layer=layer, until=until.get(i))
        for i, (name, layer) in enumerate(entries)
    ]
