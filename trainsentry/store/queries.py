"""Reading the store: the read API's listings and the counts the demo and reports show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Alert, AlertStatus
from trainsentry.store.bulk import run_steps, update_steps
from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import (
    alert_events,
    alerts,
    incident_alerts,
    incidents,
    notifications,
    webhook_receipts,
)


@dataclass(frozen=True, slots=True)
class Page:
    items: list[dict[str, Any]]
    next_before: int | None  # pass as `before` to get the next (older) page


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def _row_dict(row: Any, skip: Sequence[str] = ()) -> dict[str, Any]:
    return {key: _iso(value) for key, value in row._mapping.items() if key not in skip}


async def list_alerts(
    conn: AsyncConnection,
    *,
    status: str | None = None,
    priority: str | None = None,
    job: str | None = None,
    limit: int = 100,
    before: int | None = None,
) -> Page:
    """Alert occurrences, newest first. `job` matches `name` or `namespace/name`."""
    query = select(alerts).order_by(alerts.c.id.desc()).limit(limit + 1)
    if status:
        query = query.where(alerts.c.status == status)
    if priority:
        query = query.where(alerts.c.priority == priority)
    if job:
        namespace, _, name = job.rpartition("/")
        query = query.where(alerts.c.job_name == name)
        if namespace:
            query = query.where(alerts.c.job_namespace == namespace)
    if before is not None:
        query = query.where(alerts.c.id < before)
    rows = (await conn.execute(query)).all()
    items = [_row_dict(row) for row in rows[:limit]]
    return Page(items, int(rows[limit - 1].id) if len(rows) > limit else None)


async def list_notifications(
    conn: AsyncConnection,
    *,
    channel: str | None = None,
    status: str | None = None,
    alert_id: int | None = None,
    limit: int = 100,
    before: int | None = None,
) -> Page:
    query = select(notifications).order_by(notifications.c.id.desc()).limit(limit + 1)
    if channel:
        query = query.where(notifications.c.channel == channel)
    if status:
        query = query.where(notifications.c.status == status)
    if alert_id is not None:
        query = query.where(notifications.c.alert_id == alert_id)
    if before is not None:
        query = query.where(notifications.c.id < before)
    rows = (await conn.execute(query)).all()
    items = [_row_dict(row) for row in rows[:limit]]
    return Page(items, int(rows[limit - 1].id) if len(rows) > limit else None)


async def get_alert(conn: AsyncConnection, alert_id: int) -> dict[str, Any] | None:
    row = (await conn.execute(select(alerts).where(alerts.c.id == alert_id))).first()
    if row is None:
        return None
    item = _row_dict(row)
    events = await conn.execute(
        select(alert_events).where(alert_events.c.alert_id == alert_id).order_by(alert_events.c.id)
    )
    item["events"] = [_row_dict(event, skip=("alert_id",)) for event in events]
    return item


async def firing_occurrence(
    conn: AsyncConnection, fingerprint: str
) -> tuple[datetime, dict[str, str]] | None:
    """The latest still-firing occurrence of an alert: when it began and its annotations
    (None: none is firing)."""
    row = (
        await conn.execute(
            select(alerts.c.starts_at, alerts.c.annotations)
            .where(alerts.c.fingerprint == fingerprint, alerts.c.status == AlertStatus.FIRING.value)
            .order_by(alerts.c.starts_at.desc())
            .limit(1)
        )
    ).first()
    if row is None or not isinstance(row.starts_at, datetime):
        return None
    annotations = row.annotations if isinstance(row.annotations, dict) else {}
    return row.starts_at, {str(k): str(v) for k, v in annotations.items()}


async def counts(conn: AsyncConnection) -> dict[str, Any]:
    """Totals for summaries: receipts, occurrences by status, events, notifications by channel."""

    async def scalar(query: Any) -> int:
        return int((await conn.execute(query)).scalar() or 0)

    by_status = {
        row.status: int(row.n)
        for row in await conn.execute(
            select(alerts.c.status, func.count().label("n")).group_by(alerts.c.status)
        )
    }
    by_channel: dict[str, dict[str, int]] = {}
    for row in await conn.execute(
        select(notifications.c.channel, notifications.c.status, func.count().label("n")).group_by(
            notifications.c.channel, notifications.c.status
        )
    ):
        by_channel.setdefault(row.channel, {})[row.status] = int(row.n)
    return {
        "receipts": await scalar(select(func.count()).select_from(webhook_receipts)),
        "webhooks_received": await scalar(select(func.sum(webhook_receipts.c.times_received))),
        "alerts": sum(by_status.values()),
        "alerts_by_status": by_status,
        "events": await scalar(select(func.count()).select_from(alert_events)),
        "notifications": by_channel,
    }


@dataclass(frozen=True, slots=True)
class OutboxGroup:
    """Notifications not yet final, counted per channel, status and priority."""

    channel: str
    status: str
    priority: str
    count: int
    oldest_created_at: datetime


async def outbox_depth(conn: AsyncConnection) -> list[OutboxGroup]:
    """The outbox rows not yet final (pending, sending, dead), grouped."""
    rows = await conn.execute(
        select(
            notifications.c.channel,
            notifications.c.status,
            notifications.c.priority,
            func.count().label("n"),
            func.min(notifications.c.created_at).label("oldest"),
        )
        .where(notifications.c.status.in_(("pending", "sending", "dead")))
        .group_by(notifications.c.channel, notifications.c.status, notifications.c.priority)
    )
    return [
        OutboxGroup(row.channel, row.status, row.priority, int(row.n), row.oldest) for row in rows
    ]


async def set_priorities(conn: AsyncConnection, decided: Sequence[tuple[int, str, str]]) -> None:
    """Records (alert_id, priority, reason) decided by the policy."""
    if not decided:
        return
    # One row per alert, the last decision winning (an alert can fire twice in one batch).
    latest = {alert_id: (priority, reason, alert_id) for alert_id, priority, reason in decided}
    rows = list(latest.values())
    sqlite = is_sqlite(conn)
    steps = update_steps("alerts", ("priority", "priority_reason"), "id", rows, sqlite=sqlite)
    await run_steps(conn, steps)


@dataclass(frozen=True, slots=True)
class StoredOccurrence:
    """One stored alert occurrence as the archive export needs it."""

    alert: Alert
    alert_id: int
    priority: str | None
    reason: str
    acked_by: str
    incident_priority: str | None = None  # the priority of the incident it is in


async def load_occurrences_for_export(
    db_url: str, since: datetime | None = None
) -> list[StoredOccurrence]:
    """Every stored occurrence (optionally those started since a time), oldest id first.
    Read only: StoreMissing when there is no store at `db_url` (never created empty)."""
    from trainsentry.store.engine import check_schema, create_engine

    engine = create_engine(db_url, must_exist=True)
    try:
        await check_schema(engine)
        async with engine.connect() as conn:
            query = (
                select(alerts, incidents.c.priority.label("incident_priority"))
                .select_from(
                    alerts.outerjoin(
                        incident_alerts, incident_alerts.c.alert_id == alerts.c.id
                    ).outerjoin(incidents, incidents.c.id == incident_alerts.c.incident_id)
                )
                .order_by(alerts.c.id)
            )
            if since is not None:
                query = query.where(alerts.c.starts_at >= since)
            found: list[StoredOccurrence] = []
            for row in await conn.execute(query):
                alert = Alert(
                    fingerprint=row.fingerprint,
                    status=AlertStatus(row.status),
                    labels=dict(row.labels),
                    annotations=dict(row.annotations),
                    starts_at=row.starts_at,
                    ends_at=row.resolved_at if row.status == "resolved" else None,
                    generator_url=row.generator_url,
                    resolved_node=row.node,
                )
                found.append(
                    StoredOccurrence(
                        alert,
                        int(row.id),
                        row.priority,
                        row.priority_reason or "",
                        row.acked_by or "",
                        row.incident_priority,
                    )
                )
    finally:
        await engine.dispose()
    return found
