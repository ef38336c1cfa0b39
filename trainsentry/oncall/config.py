"""The `oncall:` configuration section: people, schedules and escalation policies, parsed,
validated and turned into the frozen types of oncall/types.py.

Pure: nothing here reads the clock or a file. Any bad input raises OncallConfigError whose
message names each wrong field, like
`oncall.schedules.gpu-infra.layers[1].members[0]: unknown person 'zed'`; no input makes it
raise anything else.

The field readers (`as_mapping`, `as_text`, `as_name`, `as_datetime`, `as_instant`: each
raises `FieldError(field, reason)`; `Problems` collects them so one run reports them all)
are shared by the other on-call parsers: run-time overrides and swaps (oncall/changes.py)
and maintenance-window requests (maintenance/windows.py).

An escalation policy (`oncall.escalation_policies`, `parse_policy`): who each step calls,
and when.

    escalation_policies:
      gpu-p0:
        steps:
          - {schedule: gpu-infra, wait_minutes: 10}              # who the schedule pages first
          - {schedule: gpu-infra, position: 2, wait_minutes: 10} # the next on its list
          - {people: [alice], name: lead}                        # a lead
        repeat: 2               # the steps, twice over
        call_every_minutes: 5   # then the last step every 5 minutes until acknowledged
        stop_after_hours: 24    # ... but not longer than this after the first call

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
    EscalationStep,
    HourRange,
    Layer,
    OncallConfig,
    Override,
    Person,
    Restriction,
    Schedule,
)

MIN_SHIFT = timedelta(hours=1)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SHIFT = re.compile(r"^([1-9][0-9]{0,4})([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_HOURS = re.compile(r"^([0-2][0-9]):([0-5][0-9])-([0-2][0-9]):([0-5][0-9])$")
_PHONE = re.compile(r"^\+[1-9][0-9]{5,14}$")
_T = TypeVar("_T")
DEFAULT_STEP_WAIT = timedelta(minutes=5)
MAX_STEPS = 20
MAX_REPEAT = 10
MAX_POSITION = 10
_STEP_KEYS = {"name", "schedule", "position", "people", "wait_minutes"}
_POLICY_KEYS = {"steps", "repeat", "call_every_minutes", "stop_after_hours"}


class OncallConfigError(ValueError):
    """The on-call configuration or a window request is invalid; the message names the
    fields and says why. `problems`: each problem as (field, why)."""

    def __init__(self, message: str, problems: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class FieldError(Exception):
    """One wrong field: `field` is its path (`oncall.people.ann.phone`), `reason` says why.
    Raised by the field readers; a parser's caller sees OncallConfigError."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


class Problems:
    """Collects the problems of independent parts, so one run reports them all."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []

    def add(self, field: str, reason: str) -> None:
        self.found.append((field, reason))

    def check(self, fn: Callable[[], _T]) -> _T | None:
        try:
            return fn()
        except FieldError as exc:
            self.add(exc.field, exc.reason)
            return None

    def raise_any(self) -> None:
        if self.found:
            text = "; ".join(f"{field}: {reason}" for field, reason in self.found)
            raise OncallConfigError(text, self.found)


def as_mapping(
    value: Any, field: str, keys: set[str], required: frozenset[str] | set[str] = frozenset()
) -> dict[str, Any]:
    """A mapping (None is empty) with only `keys`, holding every `required` one."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise FieldError(field, "must be a mapping")
    for key in value:
        if not isinstance(key, str) or key not in keys:
            raise FieldError(f"{field}.{key}", f"unknown field (known: {', '.join(sorted(keys))})")
    for key in sorted(required - set(value)):
        raise FieldError(f"{field}.{key}", "is required")
    return dict(value)


def as_text(value: Any, field: str) -> str:
    """A non-empty string, stripped."""
    if not isinstance(value, str) or not value.strip():
        raise FieldError(field, "must be a non-empty string")
    return value.strip()


def as_name(value: Any, field: str) -> str:
    """A name of a person, schedule, layer or policy: 1-63 of [A-Za-z0-9._-]."""
    text = value if isinstance(value, str) else ""
    if not _NAME.match(text):
        raise FieldError(
            field, "must be 1-63 letters, digits, '.', '_' or '-', starting alphanumeric"
        )
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
    name = as_text(value, field)
    if name not in _zones():
        raise FieldError(field, f"unknown time zone {name!r} (an IANA name like Europe/Berlin)")
    return ZoneInfo(name)


def as_datetime(value: Any, field: str) -> datetime:
    """An ISO 8601 date-time or a date (its midnight), with or without an offset, in the
    years 1900-8999."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime.combine(value, time(0))
    else:
        text = as_text(value, field)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise FieldError(field, f"not an ISO 8601 date-time: {text[:40]!r}") from None
    if not 1900 <= moment.year <= 8999:  # the math looks ahead; dates end at 9999
        raise FieldError(field, "must lie between the years 1900 and 8999")
    return moment


def _wall(value: Any, field: str, tz: ZoneInfo) -> datetime:
    """A local wall time; one with an offset is converted to `tz`'s wall time."""
    moment = as_datetime(value, field)
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(tz).replace(tzinfo=None)


def as_instant(value: Any, field: str, tz: ZoneInfo | None) -> datetime:
    """An instant; without an offset it is `tz`'s local wall time (refused when no `tz`)."""
    moment = as_datetime(value, field)
    if moment.tzinfo is not None:
        return moment
    if tz is None:
        raise FieldError(field, "needs a UTC offset (like 2026-10-27T12:00+01:00) or a timezone")
    return wall_to_instant(moment, tz)


def _shift(value: Any, field: str) -> timedelta:
    match = _SHIFT.match(value) if isinstance(value, str) else None
    if match is None:
        raise FieldError(field, "must be a number and a unit m, h, d or w, like 1w, 1d or 12h")
    shift = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if shift < MIN_SHIFT:
        raise FieldError(field, "must be at least 1h")
    return shift


def _clock(hour: str, minute: str, field: str, end: bool) -> time | None:
    if hour == "24" and minute == "00" and end:
        return None
    if int(hour) > 23:
        raise FieldError(field, "hours run 00-23 (24:00 only as an end)")
    return time(int(hour), int(minute))


def _hour_range(value: Any, field: str) -> HourRange:
    match = _HOURS.match(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise FieldError(field, "must be 'HH:MM-HH:MM' in quotes, like \"20:00-08:00\"")
    start = _clock(match.group(1), match.group(2), field, end=False)
    end = _clock(match.group(3), match.group(4), field, end=True)
    assert start is not None
    if end == start:
        raise FieldError(field, "is empty (start equals end); leave out restrict for all day")
    return HourRange(start, end)


def _minutes(hours: HourRange) -> list[tuple[int, int]]:
    """The range as [from, to) minutes of the day, split at midnight."""
    start = hours.start.hour * 60 + hours.start.minute
    end = 1440 if hours.end is None else hours.end.hour * 60 + hours.end.minute
    return [(start, 1440), (0, end)] if hours.over_midnight else [(start, end)]


def _restriction(value: Any, field: str) -> Restriction:
    raw = as_mapping(value, field, {"hours"}, {"hours"})
    items = raw["hours"] if isinstance(raw["hours"], list) else [raw["hours"]]
    if not items:
        raise FieldError(f"{field}.hours", "must name at least one range")
    ranges = tuple(_hour_range(item, f"{field}.hours[{i}]") for i, item in enumerate(items))
    for i, one in enumerate(ranges):
        for j in range(i):
            if any(a < d and c < b for a, b in _minutes(one) for c, d in _minutes(ranges[j])):
                raise FieldError(f"{field}.hours[{i}]", f"overlaps hours[{j}] ({ranges[j]})")
    return Restriction(ranges)


def _person(key: Any, value: Any, field: str) -> Person:
    name = as_name(key, field)
    raw = as_mapping(value, field, {"phone", "feishu_open_id", "email"})
    for key in raw:
        raw[key] = as_text(raw[key], f"{field}.{key}") if raw[key] is not None else None
    if raw.get("phone") and not _PHONE.match(raw["phone"]):
        raise FieldError(f"{field}.phone", "must be in international form, like +4915100000001")
    if raw.get("email") and "@" not in raw["email"]:
        raise FieldError(f"{field}.email", "is not an e-mail address")
    return Person(name=name, **raw)


def _layer(value: Any, field: str, tz: ZoneInfo, people: Mapping[str, Person]) -> Layer:
    keys = {"name", "start", "shift", "members", "restrict", "end"}
    raw = as_mapping(value, field, keys, {"name", "start", "shift", "members"})
    name = as_name(raw["name"], f"{field}.name")
    if name == OVERRIDE_LAYER:
        raise FieldError(f"{field}.name", f"{OVERRIDE_LAYER!r} is reserved for overrides")
    start = _wall(raw["start"], f"{field}.start", tz)
    end = _wall(raw["end"], f"{field}.end", tz) if raw.get("end") is not None else None
    if end is not None and end <= start:
        raise FieldError(f"{field}.end", f"is not after start ({start.isoformat()})")
    members = raw["members"]
    if not isinstance(members, list) or not members:
        raise FieldError(f"{field}.members", "must be a non-empty list of people")
    for i, member in enumerate(members):
        if not isinstance(member, str) or member not in people:
            raise FieldError(f"{field}.members[{i}]", f"unknown person {str(member)[:64]!r}")
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
    raw = as_mapping(value, field, {"who", "start", "end"}, {"who", "start", "end"})
    if not isinstance(raw["who"], str) or raw["who"] not in people:
        raise FieldError(f"{field}.who", f"unknown person {str(raw['who'])[:64]!r}")
    start = as_instant(raw["start"], f"{field}.start", tz)
    end = as_instant(raw["end"], f"{field}.end", tz)
    if end <= start:
        raise FieldError(f"{field}.end", f"is not after start ({start.isoformat()})")
    return Override(who=raw["who"], start=start, end=end)


def _schedule(key: Any, value: Any, field: str, people: Mapping[str, Person]) -> Schedule:
    name = as_name(key, field)
    raw = as_mapping(value, field, {"timezone", "layers", "overrides"}, {"timezone", "layers"})
    tz = parse_timezone(raw["timezone"], f"{field}.timezone")
    layers_raw, overrides_raw = raw["layers"], raw.get("overrides") or []
    if not isinstance(layers_raw, list) or not layers_raw:
        raise FieldError(f"{field}.layers", "must be a non-empty list")
    if not isinstance(overrides_raw, list):
        raise FieldError(f"{field}.overrides", "must be a list")
    layers = [_layer(item, f"{field}.layers[{i}]", tz, people) for i, item in enumerate(layers_raw)]
    for i, layer in enumerate(layers):
        if layer.name in (other.name for other in layers[:i]):
            raise FieldError(f"{field}.layers[{i}].name", f"{layer.name!r} is used twice")
    overrides = [
        _override(item, f"{field}.overrides[{i}]", tz, people)
        for i, item in enumerate(overrides_raw)
    ]
    for i, one in enumerate(overrides):
        for j in range(i):
            if one.start < overrides[j].end and overrides[j].start < one.end:
                raise FieldError(f"{field}.overrides[{i}]", f"overlaps overrides[{j}]")
    return Schedule(name=name, tz=tz, layers=tuple(layers), overrides=tuple(overrides))


def parse_oncall(value: Any, field: str = "oncall") -> OncallConfig:
    """The `oncall:` section: people, schedules and escalation policies. (The cap on
    maintenance windows is the gateway's top-level `maintenance.max_window_hours`; the
    section's `escalation`, the default layers, is a settings model checked with the rest of
    the settings, config/escalation.py: it is left alone here.)"""
    problems = Problems()
    keys = {"people", "schedules", "escalation_policies", "escalation"}
    raw = problems.check(lambda: as_mapping(value, field, keys))
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
    problems: Problems,
) -> dict[str, EscalationPolicyConfig]:
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


def _number(value: Any, field: str, low: float, high: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise FieldError(field, f"must be {what} from {low:g} to {high:g}")
    return float(value)


def _step(
    value: Any,
    field: str,
    index: int,
    people: Mapping[str, Person],
    schedules: Mapping[str, Schedule],
) -> EscalationStep:
    raw = as_mapping(value, field, _STEP_KEYS)
    schedule, names = raw.get("schedule"), raw.get("people")
    if (schedule is None) == (names is None):
        raise FieldError(field, "needs exactly one of schedule or people")
    wait = DEFAULT_STEP_WAIT
    if raw.get("wait_minutes") is not None:
        minutes = _number(raw["wait_minutes"], f"{field}.wait_minutes", 1, 1440, "minutes")
        wait = timedelta(minutes=minutes)
    name = as_name(raw["name"], f"{field}.name") if raw.get("name") is not None else ""
    if schedule is not None:
        if not isinstance(schedule, str) or schedule not in schedules:
            raise FieldError(f"{field}.schedule", f"unknown schedule {str(schedule)[:64]!r}")
        position = 1
        if raw.get("position") is not None:
            given = raw["position"]
            if isinstance(given, bool) or not isinstance(given, int):
                raise FieldError(f"{field}.position", f"must be a whole number 1-{MAX_POSITION}")
            position = int(_number(given, f"{field}.position", 1, MAX_POSITION, "a number"))
        default = schedule if position == 1 else f"{schedule}#{position}"
        return EscalationStep(name=name or default, wait=wait, schedule=schedule, position=position)
    if raw.get("position") is not None:
        raise FieldError(f"{field}.position", "applies to a schedule step only")
    if not isinstance(names, list) or not names:
        raise FieldError(f"{field}.people", "must be a non-empty list of people")
    for i, person in enumerate(names):
        if not isinstance(person, str) or person not in people:
            raise FieldError(f"{field}.people[{i}]", f"unknown person {str(person)[:64]!r}")
    return EscalationStep(name=name or f"step{index + 1}", wait=wait, people=tuple(names))


def parse_policy(
    key: Any,
    value: Any,
    field: str,
    people: Mapping[str, Person],
    schedules: Mapping[str, Schedule],
) -> EscalationPolicyConfig:
    """One escalation policy of `oncall.escalation_policies` (the module doc shows one)."""
    name = as_name(key, field)
    raw = as_mapping(value, field, _POLICY_KEYS, {"steps"})
    steps_raw = raw["steps"]
    if not isinstance(steps_raw, list) or not 1 <= len(steps_raw) <= MAX_STEPS:
        raise FieldError(f"{field}.steps", f"must be a list of 1-{MAX_STEPS} steps")
    steps = tuple(
        _step(item, f"{field}.steps[{i}]", i, people, schedules) for i, item in enumerate(steps_raw)
    )
    repeat = 1
    if raw.get("repeat") is not None:
        if isinstance(raw["repeat"], bool) or not isinstance(raw["repeat"], int):
            raise FieldError(f"{field}.repeat", f"must be a whole number 1-{MAX_REPEAT}")
        repeat = int(_number(raw["repeat"], f"{field}.repeat", 1, MAX_REPEAT, "a number"))
    every = None
    if raw.get("call_every_minutes") is not None:
        minutes = _number(
            raw["call_every_minutes"], f"{field}.call_every_minutes", 1, 1440, "minutes"
        )
        every = timedelta(minutes=minutes)
    stop_after = timedelta(hours=24)
    if raw.get("stop_after_hours") is not None:
        hours = _number(raw["stop_after_hours"], f"{field}.stop_after_hours", 1, 168, "hours")
        stop_after = timedelta(hours=hours)
    return EscalationPolicyConfig(name, steps, repeat, every, stop_after)
