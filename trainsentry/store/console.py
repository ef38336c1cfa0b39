"""Reading the store for the incident console (`/ui/`, gateway/ui/): open incidents, one
incident with its events and notifications, resolved history, a job's alerts, and the
change marker the console's live feed polls.

Read only; every listing is bounded by a `limit` the caller passes (the console's handlers
bound it again). Labels and annotations come back as stored: attacker-controlled text that
the templates escape.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import alert_events, alerts, notifications, policy_state

#: The columns of an alert row the console's lists show (the verdict only as a flag).
_LIST_COLUMNS = (
    alerts.c.id,
    alerts.c.alertname,
    alerts.c.status,
    alerts.c.priority,
    alerts.c.labels,
    alerts.c.annotations,
    alerts.c.starts_at,
    alerts.c.resolved_at,
    alerts.c.job_namespace,
    alerts.c.job_name,
    alerts.c.node,
    alerts.c.acked_at,
    alerts.c.acked_by,
    alerts.c.fingerprint,
)


@dataclass(frozen=True, slots=True)
class AlertRow:
    """One alert occurrence as the console lists it."""

    id: int
    alertname: str
    status: str
    priority: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    resolved_at: datetime | None
    namespace: str
    job: str
    node: str
    acked_at: datetime | None
    acked_by: str | None
    fingerprint: str


def _alert_row(row: Any) -> AlertRow:
    return AlertRow(
        id=int(row.id),
        alertname=row.alertname or "",
        status=row.status,
        priority=row.priority,
        labels={str(k): str(v) for k, v in (row.labels or {}).items()},
        annotations={str(k): str(v) for k, v in (row.annotations or {}).items()},
        starts_at=row.starts_at,
        resolved_at=row.resolved_at,
        namespace=row.job_namespace or "",
        job=row.job_name or "",
        node=row.node or "",
        acked_at=row.acked_at,
        acked_by=row.acked_by,
        fingerprint=row.fingerprint,
    )


async def change_marker(conn: AsyncConnection) -> tuple[int, int, int]:
    """What the live feed compares to see that something changed: the newest event (fired,
    resolved, acked, silenced, ...), the newest notification, and how many notifications are
    not final yet (a send or a cancelled call changes it). Three index lookups."""
    last_event = (await conn.execute(select(func.max(alert_events.c.id)))).scalar()
    last_note = (await conn.execute(select(func.max(notifications.c.id)))).scalar()
    in_flight = (
        await conn.execute(
            select(func.count())
            .select_from(notifications)
            .where(notifications.c.status.in_(("pending", "sending")))
        )
    ).scalar()
    return int(last_event or 0), int(last_note or 0), int(in_flight or 0)


async def open_alerts(
    conn: AsyncConnection,
    *,
    priority: str | None = None,
    namespace: str | None = None,
    job: str | None = None,
    limit: int = 2000,
) -> list[AlertRow]:
    """Firing occurrences, newest first, at most `limit`."""
    query = (
        select(*_LIST_COLUMNS)
        .where(alerts.c.status == "firing")
        .order_by(alerts.c.id.desc())
        .limit(limit)
    )
    if priority:
        query = query.where(alerts.c.priority == priority)
    if namespace:
        query = query.where(alerts.c.job_namespace == namespace)
    if job:
        query = query.where(alerts.c.job_name == job)
    return [_alert_row(row) for row in await conn.execute(query)]


async def states_in_scope(conn: AsyncConnection, scope: str, limit: int = 1000) -> dict[str, Any]:
    """The policy's states of one scope (key → state), at most `limit` (newest first)."""
    rows = await conn.execute(
        select(policy_state.c.key, policy_state.c.state)
        .where(policy_state.c.scope == scope)
        .order_by(policy_state.c.updated_at.desc())
        .limit(limit)
    )
    return {row.key: row.state for row in rows}


@dataclass(frozen=True, slots=True)
class Incident:
    """One occurrence in full: the row, its events and its notifications (oldest first)."""

    alert: AlertRow
    generator_url: str
    priority_reason: str
    verdict: dict[str, Any] | None
    events: list[dict[str, Any]]
    notifications: list[dict[str, Any]]


async def incident(conn: AsyncConnection, alert_id: int, max_rows: int = 500) -> Incident | None:
    row = (await conn.execute(select(alerts).where(alerts.c.id == alert_id))).first()
    if row is None:
        return None
    events = await conn.execute(
        select(alert_events.c.kind, alert_events.c.at, alert_events.c.detail)
        .where(alert_events.c.alert_id == alert_id)
        .order_by(alert_events.c.id)
        .limit(max_rows)
    )
    sent = await conn.execute(
        select(
            notifications.c.id,
            notifications.c.channel,
            notifications.c.kind,
            notifications.c.status,
            notifications.c.created_at,
            notifications.c.sent_at,
            notifications.c.attempts,
            notifications.c.last_error,
            notifications.c.reason,
            notifications.c.payload,
        )
        .where(notifications.c.alert_id == alert_id)
        .order_by(notifications.c.id)
        .limit(max_rows)
    )
    return Incident(
        alert=_alert_row(row),
        generator_url=row.generator_url or "",
        priority_reason=row.priority_reason or "",
        verdict=row.verdict if isinstance(row.verdict, dict) else None,
        events=[dict(event._mapping) for event in events],
        notifications=[dict(note._mapping) for note in sent],
    )


async def resolved_alerts(
    conn: AsyncConnection,
    *,
    since: datetime,
    search: str | None = None,
    limit: int = 200,
    before: int | None = None,
) -> list[AlertRow]:
    """Resolved occurrences that began since `since`, newest first; `search` matches (case
    blind, as a substring) the alert name, job, namespace, node or any label text."""
    query = (
        select(*_LIST_COLUMNS)
        .where(alerts.c.status == "resolved", alerts.c.starts_at >= since)
        .order_by(alerts.c.id.desc())
        .limit(limit)
    )
    if before is not None:
        query = query.where(alerts.c.id < before)
    if search:
        needle = search.lower()
        query = query.where(
            or_(
                *(
                    func.lower(column).contains(needle, autoescape=True)
                    for column in (
                        alerts.c.alertname,
                        alerts.c.job_name,
                        alerts.c.job_namespace,
                        alerts.c.node,
                        cast(alerts.c.labels, Text),
                    )
                )
            )
        )
    return [_alert_row(row) for row in await conn.execute(query)]


async def job_alerts(
    conn: AsyncConnection,
    namespace: str,
    job: str,
    *,
    since: datetime,
    limit: int = 2000,
) -> list[AlertRow]:
    """The job's occurrences (firing and resolved) that began since `since`, newest first."""
    query = (
        select(*_LIST_COLUMNS)
        .where(alerts.c.job_name == job, alerts.c.starts_at >= since)
        .order_by(alerts.c.id.desc())
        .limit(limit)
    )
    if namespace:
        query = query.where(alerts.c.job_namespace == namespace)
    return [_alert_row(row) for row in await conn.execute(query)]
