"""On-call types, one place: people, schedules (layers, restrictions, overrides) and the
answer to "who is on call" (maintenance windows: trainsentry/maintenance/types.py).

All are frozen and already validated (oncall/config.py builds them); the pure functions in
schedule.py and ical.py never see raw configuration text.

Invariants (checked by config.py, relied on by the math):
- every instant (`datetime`) is timezone-aware; every wall time (`time`, naive `datetime` named
  `*_wall`) is local to the schedule's or window's `tz`;
- `Layer.shift` is at least one hour; `members` is not empty and names known people;
- `Restriction.ranges` do not overlap each other; no range is empty;
- `Layer.end_wall`, when set, is after `start_wall`; an override's `end` is after its `start`;
- the overrides of one schedule do not overlap each other; nor do two swaps of one person;
- an escalation step names a known schedule or known people, never both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

OVERRIDE_LAYER = "override"  # the `layer` of an answer that comes from an override


@dataclass(frozen=True)
class Person:
    name: str
    phone: str | None = None
    feishu_open_id: str | None = None
    email: str | None = None


@dataclass(frozen=True)
class HourRange:
    """A daily stretch of local wall time, [start, end). `end` <= `start` crosses midnight
    (20:00-08:00 runs from 20:00 to 08:00 the next day); `end` None means 24:00."""

    start: time
    end: time | None

    @property
    def over_midnight(self) -> bool:
        return self.end is not None and self.end <= self.start

    def __str__(self) -> str:
        end = "24:00" if self.end is None else self.end.strftime("%H:%M")
        return f"{self.start:%H:%M}-{end}"


@dataclass(frozen=True)
class Restriction:
    """The layer covers only these daily ranges of local wall time."""

    ranges: tuple[HourRange, ...]


@dataclass(frozen=True)
class Layer:
    """A rotation: members take turns, one shift each, from `start_wall` on (handoffs at local
    wall time start_wall + k*shift). Covers nothing before its start or from its end on, and
    only inside its restriction when it has one."""

    name: str
    start_wall: datetime
    shift: timedelta
    members: tuple[str, ...]
    restrict: Restriction | None = None
    end_wall: datetime | None = None


@dataclass(frozen=True)
class Override:
    """`who` takes the pager from `start` to `end` (instants), ahead of every layer."""

    who: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Swap:
    """From `start` to `end` (instants) `who` takes every shift of `replaces`, in every layer,
    keeping that layer's place (unlike an override, which goes ahead of every layer)."""

    who: str
    replaces: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Schedule:
    """Layers in configuration order: a later layer wins where it covers the time."""

    name: str
    tz: ZoneInfo
    layers: tuple[Layer, ...]
    overrides: tuple[Override, ...] = ()
    swaps: tuple[Swap, ...] = ()


@dataclass(frozen=True)
class EscalationStep:
    """Who one step calls: the person at `position` (1 = first) of `schedule`'s answer at the
    time of the call, or every one of `people`; then it waits `wait` for an ack."""

    name: str
    wait: timedelta
    schedule: str | None = None
    position: int = 1
    people: tuple[str, ...] = ()


@dataclass(frozen=True)
class EscalationPolicyConfig:
    """Steps in order, the whole list `repeat` times; then, with `call_every`, the last step
    again every `call_every` until `stop_after` has passed since the first call."""

    name: str
    steps: tuple[EscalationStep, ...]
    repeat: int = 1
    call_every: timedelta | None = None
    stop_after: timedelta = timedelta(hours=24)


@dataclass(frozen=True)
class OncallConfig:
    people: dict[str, Person]
    schedules: dict[str, Schedule]
    escalation_policies: dict[str, EscalationPolicyConfig] = field(default_factory=dict)


@dataclass(frozen=True)
class OnCall:
    """One person in the answer. `until`: the next instant at which this stops being true
    (for the first entry: at which someone else, or nobody, is first), None if not within
    schedule.UNTIL_HORIZON."""

    name: str
    layer: str
    until: datetime | None


@dataclass(frozen=True)
class Segment:
    """From `start` to `end` the answer is `entries` ((name, layer) pairs, first = primary)."""

    start: datetime
    end: datetime
    entries: tuple[tuple[str, str], ...]
