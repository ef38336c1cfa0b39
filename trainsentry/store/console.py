"""Reading the store for the incident console (`/ui/`, gateway/ui/): open incidents, one
incident with its events and notifications, the alert search History uses, a job's alerts,
the silences the gateway made, and the change marker the console's live feed polls.

Read only; every listing is bounded by a `limit` the caller passes (the console's handlers
bound it again). Labels and annotations come back as stored: attacker-controlled text that
the templates escape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Text, case, cast, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import alert_events, alerts, notifications, policy_state

#: The columns of an alert row the console's lists show (the verdict only as a flag).
LIST_COLUMNS = (
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


def alert_row(row: Any) -> AlertRow:
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
    not final yet (a send or a cancelled call changes it). Three index lookups, one query."""
    in_flight = notifications.c.status.in_(("pending", "sending"))
    row = (
        await conn.execute(
            select(
                select(func.max(alert_events.c.id)).scalar_subquery(),
                select(func.max(notifications.c.id)).scalar_subquery(),
                select(func.count()).select_from(notifications).where(in_flight).scalar_subquery(),
            )
        )
    ).one()
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)


#: The priority an open alert is listed and counted under: the one the policy stored (P3
#: until it has planned the alert).
_PRIORITY = func.coalesce(alerts.c.priority, "P3")
_COMPONENT = alerts.c.labels["component"].as_string()


def _open(
    priority: str | None, namespace: str | None, job: str | None, component: str | None
) -> list[Any]:
    conditions: list[Any] = [alerts.c.status == "firing"]
    if priority:
        conditions.append(priority == _PRIORITY)
    if namespace:
        conditions.append(alerts.c.job_namespace == namespace)
    if job:
        conditions.append(alerts.c.job_name == job)
    if component:
        conditions.append(component == _COMPONENT)
    return conditions


async def open_alerts(
    conn: AsyncConnection,
    *,
    priority: str | None = None,
    namespace: str | None = None,
    job: str | None = None,
    component: str | None = None,
    limit: int = 2000,
) -> list[AlertRow]:
    """Firing occurrences, the most urgent first, newest first within a priority, at most
    `limit`; `component` is the `component` label."""
    query = (
        select(*LIST_COLUMNS)
        .where(*_open(priority, namespace, job, component))
        .order_by(_PRIORITY, alerts.c.id.desc())
        .limit(limit)
    )
    return [alert_row(row) for row in await conn.execute(query)]


@dataclass(frozen=True, slots=True)
class OpenCounts:
    """How many firing occurrences match a filter, wherever a listing of them is cut."""

    by_priority: dict[str, int]
    by_job: dict[tuple[str, str], tuple[int, int]]  # (namespace, job) -> (open, not acked)
    choices: dict[str, list[str]]  # namespace, job, component: values among them, sorted


async def open_counts(
    conn: AsyncConnection,
    *,
    priority: str | None = None,
    namespace: str | None = None,
    job: str | None = None,
    component: str | None = None,
    jobs: Iterable[str] = (),
    max_choices: int = 200,
) -> OpenCounts:
    """The counts behind a cut list of open alerts: per priority, per job of `jobs` (the
    job names listed) with how many are not acknowledged, and the first `max_choices`
    namespaces, jobs and components among them (the component filter not applied to these,
    so that it can be changed)."""
    where = _open(priority, namespace, job, component)
    by_priority = {
        str(row[0]): int(row[1])
        for row in await conn.execute(
            select(_PRIORITY, func.count()).where(*where).group_by(_PRIORITY)
        )
    }
    by_job: dict[tuple[str, str], tuple[int, int]] = {}
    names = sorted(set(jobs))
    if names:
        unacked = func.sum(case((alerts.c.acked_at.is_(None), 1), else_=0))
        found = await conn.execute(
            select(alerts.c.job_namespace, alerts.c.job_name, func.count(), unacked)
            .where(*where, alerts.c.job_name.in_(names))
            .group_by(alerts.c.job_namespace, alerts.c.job_name)
        )
        by_job = {(str(r[0]), str(r[1])): (int(r[2]), int(r[3] or 0)) for r in found}
    choices = {}
    for field, column in (
        ("namespace", alerts.c.job_namespace),
        ("job", alerts.c.job_name),
        ("component", _COMPONENT),
    ):
        values = await conn.execute(
            select(column)
            .where(*_open(priority, namespace, job, None), column.is_not(None), column != "")
            .distinct()
            .order_by(column)
            .limit(max_choices)
        )
        choices[field] = [str(value) for value in values.scalars()]
    return OpenCounts(by_priority, by_job, choices)


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
class AlertDetail:
    """One occurrence in full: the row, its events and its notifications (oldest first)."""

    alert: AlertRow
    generator_url: str
    priority_reason: str
    verdict: dict[str, Any] | None
    events: list[dict[str, Any]]
    notifications: list[dict[str, Any]]


async def alert_detail(
    conn: AsyncConnection, alert_id: int, max_rows: int = 500
) -> AlertDetail | None:
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
    return AlertDetail(
        alert=alert_row(row),
        generator_url=row.generator_url or "",
        priority_reason=row.priority_reason or "",
        verdict=row.verdict if isinstance(row.verdict, dict) else None,
        events=[dict(event._mapping) for event in events],
        notifications=[dict(note._mapping) for note in sent],
    )


def alert_search(search: str) -> Any:
    """The condition of an alert whose name, job, namespace, node or any label text holds
    `search` (case blind, as a substring; `%` and `_` are plain characters)."""
    needle = search.lower()
    return or_(
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
        select(*LIST_COLUMNS)
        .where(alerts.c.job_name == job, alerts.c.starts_at >= since)
        .order_by(alerts.c.id.desc())
        .limit(limit)
    )
    if namespace:
        query = query.where(alerts.c.job_namespace == namespace)
    return [alert_row(row) for row in await conn.execute(query)]


async def silences_made(
    conn: AsyncConnection, *, since: datetime, limit: int = 500
) -> list[dict[str, Any]]:
    """The Alertmanager silences the gateway made since `since` (its `silenced` events: who,
    the silence's id and length), newest first, at most `limit`, each with its alert's id,
    name, node and job."""
    query = (
        select(
            alert_events.c.alert_id,
            alert_events.c.at,
            alert_events.c.detail,
            alerts.c.alertname,
            alerts.c.node,
            alerts.c.job_namespace,
            alerts.c.job_name,
        )
        .join(alerts, alerts.c.id == alert_events.c.alert_id)
        .where(alert_events.c.kind == "silenced", alert_events.c.at >= since)
        .order_by(alert_events.c.at.desc(), alert_events.c.id.desc())
        .limit(limit)
    )
    return [dict(row._mapping) for row in await conn.execute(query)]
