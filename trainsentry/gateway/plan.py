"""The seam between intake and the alert policy: changes in, outbox rows out, one transaction.

`ConsolePlan` is the minimal policy: every change becomes one notification per configured
channel, with the priority taken from the `priority` label (P3 when absent or invalid).
The full policy (classification, dedup, storms, routes) plugs in through the same PlanHook.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import AlertChange, ChangeKind, NotificationDraft, Priority
from trainsentry.store.queries import set_priorities
from trainsentry.store.writes import insert_notifications


def change_payload(change: AlertChange) -> dict[str, Any]:
    """What every channel needs to render a change of one alert."""
    alert = change.alert
    job = alert.job
    return {
        "alert_id": change.alert_id,
        "alertname": alert.name,
        "status": alert.status.value,
        "change": change.kind.value,
        "fingerprint": alert.fingerprint,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "starts_at": alert.starts_at.isoformat(),
        "ends_at": alert.ends_at.isoformat() if alert.ends_at else None,
        "generator_url": alert.generator_url,
        "job": str(job) if job else None,
        "summary": alert.annotations.get("summary", ""),
    }


def label_priority(change: AlertChange) -> Priority:
    try:
        return Priority(change.alert.labels.get("priority", "P3").upper())
    except ValueError:
        return Priority.P3


class ConsolePlan:
    """One notification per change and channel; the idempotency key makes replays harmless."""

    def __init__(self, channels: Sequence[str] = ("console",)) -> None:
        self.channels = tuple(channels)

    def drafts(self, changes: Sequence[AlertChange]) -> list[NotificationDraft]:
        drafts = []
        for change in changes:
            payload = change_payload(change)
            priority = label_priority(change)
            for channel in self.channels:
                drafts.append(
                    NotificationDraft(
                        channel=channel,
                        kind=change.kind.value,
                        priority=priority,
                        idempotency_key=(
                            f"{channel}:{change.alert_id}:{change.kind.value}:"
                            f"{change.at.isoformat()}"
                        ),
                        payload=payload,
                        alert_id=change.alert_id,
                        group_key=change.alert.fingerprint,
                        reason="priority label" if "priority" in change.alert.labels else "default",
                    )
                )
        return drafts

    async def __call__(
        self, conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime
    ) -> int:
        await set_priorities(
            conn,
            [
                (change.alert_id, label_priority(change).value, "priority label")
                for change in changes
                if change.kind is ChangeKind.FIRING
            ],
        )
        return await insert_notifications(conn, self.drafts(changes), now)
