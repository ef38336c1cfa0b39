"""Run-time overrides and swaps (added through the API or CLI, kept in the store): the request
validated, and a schedule with them merged in. Pure: the time is a parameter.

A request: `{"kind": "override"|"swap", "who": NAME, "replaces": NAME (swaps only),
"start": ISO8601, "end": ISO8601}`; a time without a UTC offset is the schedule's local
wall time. Refused (OncallConfigError naming the field): an unknown person, `end` at or before
`start`, `end` already past, longer than MAX_CHANGE, an override overlapping another override
of the schedule (configured or stored), a swap overlapping another swap of the same person.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from trainsentry.oncall.config import FieldError, OncallConfigError, as_instant
from trainsentry.oncall.types import Override, Person, Schedule, Swap

MAX_CHANGE = timedelta(days=366)
KINDS = ("override", "swap")
_KEYS = frozenset({"kind", "who", "replaces", "start", "end"})


def parse_change(
    body: Mapping[str, Any],
    *,
    schedule: Schedule,
    people: Mapping[str, Person],
    now: datetime,
) -> Override | Swap:
    """Pure: the override or swap a request asks for, checked against `schedule` (which
    holds every override and swap already in force)."""
    try:
        return _parse(body, schedule, people, now)
    except FieldError as exc:
        raise OncallConfigError(str(exc)) from None


def _person(value: Any, field: str, people: Mapping[str, Person]) -> str:
    if not isinstance(value, str) or value not in people:
        raise FieldError(field, f"unknown person {str(value)[:64]!r}")
    return value


def _parse(
    body: Mapping[str, Any], schedule: Schedule, people: Mapping[str, Person], now: datetime
) -> Override | Swap:
    raw = dict(body)
    for key in sorted(set(raw) - _KEYS):
        raise FieldError(str(key)[:64], f"unknown field (known: {', '.join(sorted(_KEYS))})")
    for key in ("who", "start", "end"):
        if raw.get(key) is None:
            raise FieldError(key, "is required")
    kind = raw.get("kind") or "override"
    if kind not in KINDS:
        raise FieldError("kind", f"must be one of {', '.join(KINDS)}")
    who = _person(raw["who"], "who", people)
    start = as_instant(raw["start"], "start", schedule.tz)
    end = as_instant(raw["end"], "end", schedule.tz)
    if end <= start:
        raise FieldError("end", f"is not after start ({start.isoformat()})")
    if end <= now:
        raise FieldError("end", "is in the past")
    if end - start > MAX_CHANGE:
        raise FieldError("end", f"makes the {kind} longer than {MAX_CHANGE.days} days")
    if kind == "override":
        if raw.get("replaces") is not None:
            raise FieldError("replaces", "applies to a swap only")
        for other in schedule.overrides:
            if start < other.end and other.start < end:
                raise FieldError("start", f"overlaps the override of {other.who} ({_span(other)})")
        return Override(who=who, start=start, end=end)
    replaces = _person(raw.get("replaces"), "replaces", people)
    if replaces == who:
        raise FieldError("replaces", "is the same person as who")
    for swap in schedule.swaps:
        if swap.replaces == replaces and start < swap.end and swap.start < end:
            raise FieldError(
                "start", f"overlaps the swap of {replaces} with {swap.who} ({_span(swap)})"
            )
    return Swap(who=who, replaces=replaces, start=start, end=end)


def _span(change: Override | Swap) -> str:
    return f"{change.start.isoformat()} to {change.end.isoformat()}"


def with_changes(schedule: Schedule, changes: Sequence[Override | Swap]) -> Schedule:
    """Pure: `schedule` with run-time overrides and swaps added to its configured ones."""
    if not changes:
        return schedule
    overrides = [c for c in changes if isinstance(c, Override)]
    swaps = [c for c in changes if isinstance(c, Swap)]
    return dataclasses.replace(
        schedule,
        overrides=(*schedule.overrides, *overrides),
        swaps=(*schedule.swaps, *swaps),
    )
