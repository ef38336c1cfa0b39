"""The `oncall:` configuration section: parsed, validated and turned into the frozen types of
oncall/types.py (maintenance-window requests: oncall/windows.py, with the same helpers).

Pure: nothing here reads the clock or a file. Any bad input raises OncallConfigError whose
message names each wrong field, like
`oncall.schedules.gpu-infra.layers[1].members[0]: unknown person 'zed'`; no input makes it
raise anything else.

"Overlapping", as refused here: two overrides of one schedule covering the same instant
(which one would win is not said), two ranges of one restriction covering the same minute,
two layers of one schedule with the same name. Layers covering the same time are not an
error: the later layer wins there, by design.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time, timedelta
from functools import lru_cache, partial
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, available_timezones

from trainsentry.oncall.schedule import wall_to_instant
from trainsentry.oncall.types import (
    OVERRIDE_LAYER,
    EscalationPolicyConfig,
    HourRange,
    Layer,
    OncallConfig,
    Override,
    Person,
    Restriction,
    Schedule,
)

DEFAULT_MAX_WINDOW = timedelta(hours=168)
MIN_SHIFT = timedelta(hours=1)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SHIFT = re.compile(r"^([1-9][0-9]{0,4})([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_HOURS = re.compile(r"^([0-2][0-9]):([0-5][0-9])-([0-2][0-9]):([0-5][0-9])$")
_PHONE = re.compile(r"^\+[1-9][0-9]{5,14}$")
_T = TypeVar("_T")


class OncallConfigError(ValueError):
    """The on-call configuration or a window request is invalid; the message names the
    fields and says why. `problems`: each problem as (field, why)."""

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class _Bad(Exception):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


class _Problems:
    """Collects the problems of independent parts, so one run reports them all."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def add(self, field: str, reason: str) -> None:
        self.found.append((field, reason))

    def check(self, fn: Callable[[], _T]) -> _T | None:
        try:
            return fn()
        except _Bad as exc:
            self.add(exc.field, exc.reason)
            return None

    def raise_any(self) -> None:
        if self.found:
            text = "; ".join(f"{field}: {reason}" for field, reason in self.found)
            raise OncallConfigError(text, self.found)


def _mapping(
    value: Any, field: str, keys: set[str], required: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise _Bad(field, "must be a mapping")
    for key in value:
        if not isinstance(key, str) or key not in keys:
            raise _Bad(f"{field}.{key}", f"unknown field (known: {', '.join(sorted(keys))})")
    for key in sorted(required - set(value)):
        raise _Bad(f"{field}.{key}", "is required")
    return dict(value)


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad(field, "must be a non-empty string")
    return value.strip()


def _name(value: Any, field: str) -> str:
    text = value if isinstance(value, str) else ""
    if not _NAME.match(text):
        raise _Bad(field, "must be 1-63 letters, digits, '.', '_' or '-', starting alphanumeric")
    return text


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    # The scan of the system's zone files also finds names that are not IANA zones.
    return frozenset(
        name
        for name in available_timezones()
        if name not in ("localtime", "posixrules", "Factory")
        and not name.startswith(("posix/", "right/"))
    )


def parse_timezone(value: Any, field: str) -> ZoneInfo:
    """An IANA time zone name (`Europe/Berlin`, `UTC`)."""
    name = _text(value, field)
    if name not in _zones():
        raise _Bad(field, f"unknown time zone {name!r} (an IANA name like Europe/Berlin)")
    return ZoneInfo(name)


def _datetime(value: Any, field: str) -> datetime:
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime.combine(value, time(0))
    else:
        text = _text(value, field)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise _Bad(field, f"not an ISO 8601 date-time: {text[:40]!r}") from None
    if not 1900 <= moment.year <= 8999:  # the math looks ahead; dates end at 9999
        raise _Bad(field, "must lie between the years 1900 and 8999")
    return moment


def _wall(value: Any, field: str, tz: ZoneInfo) -> datetime:
    """A local wall time; one with an offset is converted to `tz`'s wall time."""
    moment = _datetime(value, field)
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(tz).replace(tzinfo=None)


def _instant(value: Any, field: str, tz: ZoneInfo | None) -> datetime:
    """An instant; without an offset it is `tz`'s local wall time (refused when no `tz`)."""
    moment = _datetime(value, field)
    if moment.tzinfo is not None:
        return moment
    if tz is None:
        raise _Bad(field, "needs a UTC offset (like 2026-10-27T12:00+01:00) or a timezone")
    return wall_to_instant(moment, tz)


def _shift(value: Any, field: str) -> timedelta:
    match = _SHIFT.match(value) if isinstance(value, str) else None
    if match is None:
        raise _Bad(field, "must be a number and a unit m, h, d or w, like 1w, 1d or 12h")
    shift = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if shift < MIN_SHIFT:
        raise _Bad(field, "must be at least 1h")
    return shift


def _clock(hour: str, minute: str, field: str, end: bool) -> time | None:
    if hour == "24" and minute == "00" and end:
        return None
    if int(hour) > 23:
        raise _Bad(field, "hours run 00-23 (24:00 only as an end)")
    return time(int(hour), int(minute))


def _hour_range(value: Any, field: str) -> HourRange:
    match = _HOURS.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise _Bad(field, "must be 'HH:MM-HH:MM' in quotes, like \"20:00-08:00\"")
    start = _clock(match.group(1), match.group(2), field, end=False)
    end = _clock(match.group(3), match.group(4), field, end=True)
    assert start is not None
    if end == start:
        raise _Bad(field, "is empty (start equals end); leave out restrict for all day")
    return HourRange(start, end)


def _minutes(hours: HourRange) -> list[tuple[int, int]]:
    """The range as [from, to) minutes of the day, split at midnight."""
    start = hours.start.hour * 60 + hours.start.minute
    end = 1440 if hours.end is None else hours.end.hour * 60 + hours.end.minute
    return [(start, 1440), (0, end)] if hours.over_midnight else [(start, end)]


def _restriction(value: Any, field: str) -> Restriction:
    raw = _mapping(value, field, {"hours"}, {"hours"})
    items = raw["hours"] if isinstance(raw["hours"], list) else [raw["hours"]]
    if not items:
        raise _Bad(f"{field}.hours", "must name at least one range")
    ranges = tuple(_hour_range(item, f"{field}.hours[{i}]") for i, item in enumerate(items))
    for i, one in enumerate(ranges):
        for j in range(i):
            if any(a < d and c < b for a, b in _minutes(one) for c, d in _minutes(ranges[j])):
                raise _Bad(f"{field}.hours[{i}]", f"overlaps hours[{j}] ({ranges[j]})")
    return Restriction(ranges)


def _person(key: Any, value: Any, field: str) -> Person:
    name = _name(key, field)
    raw = _mapping(value, field, {"phone", "feishu_open_id", "email"})
    for key in raw:
        raw[key] = _text(raw[key], f"{field}.{key}") if raw[key] is not None else None
    if raw.get("phone") and not _PHONE.match(raw["phone"]):
        raise _Bad(f"{field}.phone", "must be in international form, like +4915100000001")
    if raw.get("email") and "@" not in raw["email"]:
        raise _Bad(f"{field}.email", "is not an e-mail address")
    return Person(name=name, **raw)


def _layer(value: Any, field: str, tz: ZoneInfo, people: Mapping[str, Person]) -> Layer:
    keys = {"name", "start", "shift", "members", "restrict", "end"}
    raw = _mapping(value, field, keys, {"name", "start", "shift", "members"})
    name = _name(raw["name"], f"{field}.name")
    if name == OVERRIDE_LAYER:
        raise _Bad(f"{field}.name", f"{OVERRIDE_LAYER!r} is reserved for overrides")
    start = _wall(raw["start"], f"{field}.start", tz)
    end = _wall(raw["end"], f"{field}.end", tz) if raw.get("end") is not None else None
    if end is not None and end <= start:
        raise _Bad(f"{field}.end", f"is not after start ({start.isoformat()})")
    members = raw["members"]
    if not isinstance(members, list) or not members:
        raise _Bad(f"{field}.members", "must be a non-empty list of people")
    for i, member in enumerate(members):
        if not isinstance(member, str) or member not in people:
            raise _Bad(f"{field}.members[{i}]", f"unknown person {str(member)[:64]!r}")
    restrict = raw.get("restrict")
    return Layer(
        name=name,
        start_wall=start,
        shift=_shift(raw["shift"], f"{field}.shift"),
        members=tuple(members),
        restrict=None if restrict is None else _restriction(restrict, f"{field}.restrict"),
        end_wall=end,
    )


def _override(value: Any, field: str, tz: ZoneInfo, people: Mapping[str, Person]) -> Override:
    raw = _mapping(value, field, {"who", "start", "end"}, {"who", "start", "end"})
    if not isinstance(raw["who"], str) or raw["who"] not in people:
        raise _Bad(f"{field}.who", f"unknown person {str(raw['who'])[:64]!r}")
    start = _instant(raw["start"], f"{field}.start", tz)
    end = _instant(raw["end"], f"{field}.end", tz)
    if end <= start:
        raise _Bad(f"{field}.end", f"is not after start ({start.isoformat()})")
    return Override(who=raw["who"], start=start, end=end)


def _schedule(key: Any, value: Any, field: str, people: Mapping[str, Person]) -> Schedule:
    name = _name(key, field)
    raw = _mapping(value, field, {"timezone", "layers", "overrides"}, {"timezone", "layers"})
    tz = parse_timezone(raw["timezone"], f"{field}.timezone")
    layers_raw, overrides_raw = raw["layers"], raw.get("overrides") or []
    if not isinstance(layers_raw, list) or not layers_raw:
        raise _Bad(f"{field}.layers", "must be a non-empty list")
    if not isinstance(overrides_raw, list):
        raise _Bad(f"{field}.overrides", "must be a list")
    layers = [_layer(item, f"{field}.layers[{i}]", tz, people) for i, item in enumerate(layers_raw)]
    for i, layer in enumerate(layers):
        if layer.name in (other.name for other in layers[:i]):
            raise _Bad(f"{field}.layers[{i}].name", f"{layer.name!r} is used twice")
    overrides = [
        _override(item, f"{field}.overrides[{i}]", tz, people)
        for i, item in enumerate(overrides_raw)
    ]
    for i, one in enumerate(overrides):
        for j in range(i):
            if one.start < overrides[j].end and overrides[j].start < one.end:
                raise _Bad(f"{field}.overrides[{i}]", f"overlaps overrides[{j}]")
    return Schedule(name=name, tz=tz, layers=tuple(layers), overrides=tuple(overrides))


def parse_oncall(value: Any, field: str = "oncall") -> OncallConfig:
    """The `oncall:` section: people, schedules and escalation policies. (The cap on
    maintenance windows is the gateway's top-level `maintenance.max_window_hours`; the
    section's `escalation`, the default layers, is a settings model checked with the rest of
    the settings, config/escalation.py: it is left alone here.)"""
    problems = _Problems()
    keys = {"people", "schedules", "escalation_policies", "escalation"}
    raw = problems.check(lambda: _mapping(value, field, keys))
    problems.raise_any()
    assert raw is not None
    people: dict[str, Person] = {}
    people_raw = raw.get("people") or {}
    if not isinstance(people_raw, Mapping):
        problems.add(f"{field}.people", "must map names to contact details")
        people_raw = {}
    for key, item in people_raw.items():
        where = f"{field}.people.{key}"
        person = problems.check(partial(_person, key, item, where))
        if person is not None:
            people[person.name] = person
    schedules: dict[str, Schedule] = {}
    schedules_raw = raw.get("schedules")
    if not isinstance(schedules_raw, Mapping) or not schedules_raw:
        problems.add(f"{field}.schedules", "must map schedule names to schedules")
        schedules_raw = {}
    for key, item in schedules_raw.items():
        where = f"{field}.schedules.{key}"
        schedule = problems.check(partial(_schedule, key, item, where, people))
        if schedule is not None:
            schedules[schedule.name] = schedule
    policies = _policies(raw.get("escalation_policies"), field, people, schedules, problems)
    problems.raise_any()
    return OncallConfig(
        people=people,
        schedules=schedules,
        escalation_policies=policies,
    )


def _policies(
    value: Any,
    field: str,
    people: Mapping[str, Person],
    schedules: Mapping[str, Schedule],
    problems: _Problems,
) -> dict[str, EscalationPolicyConfig]:
    from trainsentry.oncall.policies import parse_policy  # it builds on this module's helpers

    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.add(f"{field}.escalation_policies", "must map names to policies")
        return {}
    found: dict[str, EscalationPolicyConfig] = {}
    for key, item in value.items():
        where = f"{field}.escalation_policies.{key}"
        policy = problems.check(partial(parse_policy, key, item, where, people, schedules))
        if policy is not None:
            found[policy.name] = policy
    return found
