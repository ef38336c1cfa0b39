"""The `oncall.escalation_policies` section: who each step of an escalation calls, and when.

Pure: parsed and validated into `EscalationPolicyConfig` (oncall/types.py); errors name the
field, like `oncall.escalation_policies.gpu-p0.steps[1].people[0]: unknown person 'zed'`.

    escalation_policies:
      gpu-p0:
        steps:
          - {schedule: gpu-infra, wait_minutes: 10}              # who the schedule pages first
          - {schedule: gpu-infra, position: 2, wait_minutes: 10} # the next on its list
          - {people: [alice], name: lead}                        # a lead
        repeat: 2               # the steps, twice over
        call_every_minutes: 5   # then the last step every 5 minutes until acknowledged
        stop_after_hours: 24    # ... but not longer than this after the first call
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from trainsentry.oncall.config import _Bad, _mapping, _name
from trainsentry.oncall.types import EscalationPolicyConfig, EscalationStep, Person, Schedule

DEFAULT_WAIT = timedelta(minutes=5)
MAX_STEPS = 20
MAX_REPEAT = 10
MAX_POSITION = 10
_STEP_KEYS = {"name", "schedule", "position", "people", "wait_minutes"}
_POLICY_KEYS = {"steps", "repeat", "call_every_minutes", "stop_after_hours"}


def _number(value: Any, field: str, low: float, high: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _Bad(field, f"must be {what} from {low:g} to {high:g}")
    return float(value)


def _step(
    value: Any,
    field: str,
    index: int,
    people: Mapping[str, Person],
    schedules: Mapping[str, Schedule],
) -> EscalationStep:
    raw = _mapping(value, field, _STEP_KEYS)
    schedule, names = raw.get("schedule"), raw.get("people")
    if (schedule is None) == (names is None):
        raise _Bad(field, "needs exactly one of schedule or people")
    wait = DEFAULT_WAIT
    if raw.get("wait_minutes") is not None:
        minutes = _number(raw["wait_minutes"], f"{field}.wait_minutes", 1, 1440, "minutes")
        wait = timedelta(minutes=minutes)
    name = _name(raw["name"], f"{field}.name") if raw.get("name") is not None else ""
    if schedule is not None:
        if not isinstance(schedule, str) or schedule not in schedules:
            raise _Bad(f"{field}.schedule", f"unknown schedule {str(schedule)[:64]!r}")
        position = 1
        if raw.get("position") is not None:
            given = raw["position"]
            if isinstance(given, bool) or not isinstance(given, int):
                raise _Bad(f"{field}.position", f"must be a whole number 1-{MAX_POSITION}")
            position = int(_number(given, f"{field}.position", 1, MAX_POSITION, "a number"))
        default = schedule if position == 1 else f"{schedule}#{position}"
        return EscalationStep(name=name or default, wait=wait, schedule=schedule, position=position)
    if raw.get("position") is not None:
        raise _Bad(f"{field}.position", "applies to a schedule step only")
    if not isinstance(names, list) or not names:
        raise _Bad(f"{field}.people", "must be a non-empty list of people")
    for i, person in enumerate(names):
        if not isinstance(person, str) or person not in people:
            raise _Bad(f"{field}.people[{i}]", f"unknown person {str(person)[:64]!r}")
    return EscalationStep(name=name or f"step{index + 1}", wait=wait, people=tuple(names))


def parse_policy(
    key: Any,
    value: Any,
    field: str,
    people: Mapping[str, Person],
    schedules: Mapping[str, Schedule],
) -> EscalationPolicyConfig:
    """One escalation policy (see the module doc)."""
    name = _name(key, field)
    raw = _mapping(value, field, _POLICY_KEYS, {"steps"})
    steps_raw = raw["steps"]
    if not isinstance(steps_raw, list) or not 1 <= len(steps_raw) <= MAX_STEPS:
        raise _Bad(f"{field}.steps", f"must be a list of 1-{MAX_STEPS} steps")
    steps = tuple(
        _step(item, f"{field}.steps[{i}]", i, people, schedules) for i, item in enumerate(steps_raw)
    )
    repeat = 1
    if raw.get("repeat") is not None:
        if isinstance(raw["repeat"], bool) or not isinstance(raw["repeat"], int):
            raise _Bad(f"{field}.repeat", f"must be a whole number 1-{MAX_REPEAT}")
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
