"""Builders for alerts and changes used by the policy tests."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from trainsentry.alerts import Alert, AlertChange, AlertStatus, ChangeKind, Person
from trainsentry.gateway.policy.escalation import Layer, Roster

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """T0 plus `seconds`: every test's clock is compressed through this."""
    return T0 + timedelta(seconds=seconds)


def make_alert(
    labels: Mapping[str, str] | None = None,
    *,
    fingerprint: str = "fp-1",
    status: AlertStatus = AlertStatus.FIRING,
    starts_at: datetime = T0,
    ends_at: datetime | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Alert:
    merged = {"alertname": "GPUHot", "namespace": "team-a", "trainingjob": "llm"}
    merged.update(labels or {})
    return Alert(
        fingerprint=fingerprint,
        status=status,
        labels=merged,
        annotations=dict(annotations or {"summary": "something happened"}),
        starts_at=starts_at,
        ends_at=ends_at,
    )


def occurrence_id(fingerprint: str, occurrence: float) -> int:
    """The store's id of an occurrence (one per fingerprint and start, as the store keys
    them): the first occurrence of "fp-1" at 0 is 1, others are stable large numbers."""
    if (fingerprint, occurrence) == ("fp-1", 0.0):
        return 1
    return 2 + zlib.crc32(f"{fingerprint}@{occurrence}".encode()) % 1_000_000_000


def change(
    kind: ChangeKind,
    when: float,
    *,
    occurrence: float = 0.0,
    fingerprint: str = "fp-1",
    labels: Mapping[str, str] | None = None,
    alert_id: int | None = None,
) -> AlertChange:
    """A change recorded at `at(when)` of the occurrence that started at `at(occurrence)`
    (of the alert id the store gives that occurrence, unless `alert_id` says)."""
    if alert_id is None:
        alert_id = occurrence_id(fingerprint, occurrence)
    status = AlertStatus.FIRING if kind is ChangeKind.FIRING else AlertStatus.RESOLVED
    alert = make_alert(
        labels,
        fingerprint=fingerprint,
        status=status,
        starts_at=at(occurrence),
        ends_at=None if status is AlertStatus.FIRING else at(when),
    )
    return AlertChange(alert_id=alert_id, kind=kind, alert=alert, at=at(when))


def fire(
    when: float,
    occurrence: float | None = None,
    *,
    fingerprint: str = "fp-1",
    labels: Mapping[str, str] | None = None,
    alert_id: int | None = None,
) -> AlertChange:
    """Fires at `when`; a new occurrence starting then unless `occurrence` says otherwise."""
    start = when if occurrence is None else occurrence
    return change(
        ChangeKind.FIRING,
        when,
        occurrence=start,
        fingerprint=fingerprint,
        labels=labels,
        alert_id=alert_id,
    )


def resolve(
    when: float,
    occurrence: float,
    *,
    fingerprint: str = "fp-1",
    alert_id: int | None = None,
    labels: Mapping[str, str] | None = None,
) -> AlertChange:
    return change(
        ChangeKind.RESOLVED,
        when,
        occurrence=occurrence,
        fingerprint=fingerprint,
        labels=labels,
        alert_id=alert_id,
    )


def expire(when: float, occurrence: float, *, fingerprint: str = "fp-1") -> AlertChange:
    return change(ChangeKind.EXPIRED, when, occurrence=occurrence, fingerprint=fingerprint)


def layers_from(names_and_members: Sequence[tuple[str, Sequence[Person]]]) -> Roster:
    """A roster where every layer calls all its members."""
    return Roster(tuple(Layer(name, tuple(members)) for name, members in names_and_members))
