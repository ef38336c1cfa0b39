"""The escalation roster and policy built from the `oncall.escalation` settings (the
inline layers) or from an `oncall.escalation_policies` entry (steps naming schedules or people).

Pure: settings in (config/escalation.py; the on-call part's types), the escalation
timeline's types (`escalation.Roster`, `escalation.EscalationPolicy`) out.

The inline layers map onto an escalation policy: each layer is a step, called
`calls_per_layer` times, each call waiting `ack_timeout_min`; a layer with `rotation_start` +
`shift_hours` is a one-layer UTC schedule (start = rotation_start, shift = shift_hours).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, timedelta

from trainsentry.alerts import Person, Priority
from trainsentry.config.escalation import EscalationSettings, LayerSettings, PersonSettings
from trainsentry.gateway.policy.escalation import (
    EscalationPolicy,
    Escalator,
    Layer,
    Roster,
    SchedulePick,
)
from trainsentry.oncall.types import EscalationPolicyConfig, OncallConfig, Schedule
from trainsentry.oncall.types import Person as OncallPerson


def person_of(settings: PersonSettings) -> Person:
    """Pure: one roster member."""
    return Person(settings.name, settings.phone, settings.feishu_open_id, settings.email)


def layer_of(settings: LayerSettings) -> Layer:
    """Pure: one escalation layer; a rotation start without a zone is read as UTC."""
    start = settings.rotation_start
    if start is not None and start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    shift = timedelta(hours=settings.shift_hours) if settings.shift_hours else None
    return Layer(settings.name, tuple(person_of(m) for m in settings.members), start, shift)


def roster_of(settings: EscalationSettings) -> Roster:
    """Pure: the layers, in order."""
    return Roster(tuple(layer_of(layer) for layer in settings.layers))


def escalation_policy_of(settings: EscalationSettings) -> EscalationPolicy:
    """Pure: threshold, ack timeout and calls per layer."""
    return EscalationPolicy(
        min_priority=settings.min_priority,
        ack_timeout=timedelta(minutes=settings.ack_timeout_min),
        calls_per_layer=settings.calls_per_layer,
    )


def _contact(person: OncallPerson) -> Person:
    return Person(person.name, person.phone or "", person.feishu_open_id or "", person.email or "")


def escalator_of(
    config: EscalationPolicyConfig,
    oncall: OncallConfig,
    schedules: Mapping[str, Schedule] | None = None,
) -> Escalator:
    """Pure: an `oncall.escalation_policies` entry as an escalation timeline. `schedules`
    (default: the configured ones) may hold them with run-time overrides merged in.

    Every page its route sends to this policy is escalated (no priority threshold: the route
    chose); each step is one layer, waiting its `wait_minutes`."""
    schedules = oncall.schedules if schedules is None else schedules
    people = tuple(_contact(p) for p in oncall.people.values())
    layers = []
    for step in config.steps:
        if step.schedule is not None:
            pick = SchedulePick(schedules[step.schedule], step.position, people)
            layers.append(Layer(step.name, (), pick=pick))
        else:
            members = tuple(_contact(oncall.people[name]) for name in step.people)
            layers.append(Layer(step.name, members))
    policy = EscalationPolicy(
        min_priority=Priority.P3,
        ack_timeout=config.steps[-1].wait,
        waits=tuple(step.wait for step in config.steps),
        repeat=config.repeat,
        call_every=config.call_every,
        stop_after=config.stop_after,
    )
    return Escalator(Roster(tuple(layers)), policy)


def escalators_of(
    oncall: OncallConfig, schedules: Mapping[str, Schedule] | None = None
) -> dict[str, Escalator]:
    """Pure: every configured escalation policy, by name."""
    return {
        name: escalator_of(config, oncall, schedules)
        for name, config in oncall.escalation_policies.items()
    }
