"""The escalation roster and policy built from the `channels.escalation` settings.

Pure: settings in, the escalation timeline's types (`escalation.Roster`,
`escalation.EscalationPolicy`) out. The settings models stay with the channels' settings
(notifiers/settings.py), which import nothing from the gateway.
"""

from __future__ import annotations

from datetime import UTC, timedelta

from trainsentry.alerts import Person
from trainsentry.gateway.policy.escalation import EscalationPolicy, Layer, Roster
from trainsentry.notifiers.settings import EscalationSettings, LayerSettings, PersonSettings


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
