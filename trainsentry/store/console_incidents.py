"""Reading incidents for the console (`/ui/`) and the incidents API (`/api/v1/incidents`):
which incident each listed alert is in, incidents' summaries, one incident's alerts, events
and notifications, and what a job's bulk ack acknowledges.

Read only; every listing is bounded by a `limit` the caller passes (History's resolved
incidents with their first alerts, the open incidents on a list of nodes, too). An
incident's row holds the policy's counts (store/incidents.py); its alerts are the
`incident_alerts` rows. Labels and annotations come back as stored: attacker-controlled
text that the templates escape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.console import LIST_COLUMNS, AlertRow, alert_row, alert_search
from trainsentry.store.schema import alert_events, alerts, incident_alerts, incidents, notifications

_CHUNK = 2000


@dataclass(frozen=True, slots=True)
class IncidentSummary:
    """One incident as the lists show it: its row's columns and counts from its state."""

    id: int
    status: str  # firing | resolved
    priority: str
    job: str  # as its cards name it ("ml/llama-70b")
    cause: str  # alertname/component of its cause alert
    cause_alert_id: int | None
    alerts_total: int
    alerts_firing: int
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    acked_at: datetime | None
    acked_by: str | None
    nodes: int  # nodes its firing alerts are on (counted by name up to grouping.max_tracked)
    gpus: int
    page_alert_id: int | None  # the alert its phone escalation is keyed by, when it paged
    # why it pages on its own during a storm, or why it resolved (spent) while jobs' alerts
    # of it fired on ("" when neither)
    note: str
    alertname: str  # its cause alert's (`cause` cannot say: an alertname may hold a "/")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "priority": self.priority,
            "job": self.job,
            "alertname": self.alertname,
            "cause": self.cause,
            "cause_alert_id": self.cause_alert_id,
            "alerts_total": self.alerts_total,
            "alerts_firing": self.alerts_firing,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "opened_at": self.opened_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
            "acked_at": self.acked_at.isoformat() if self.acked_at else None,
            "acked_by": self.acked_by,
            "page_alert_id": self.page_alert_id,
            "note": self.note,
        }


_COLUMNS = (
    incidents.c.id,
    incidents.c.status,
    incidents.c.priority,
    incidents.c.job,
    incidents.c.cause,
    incidents.c.cause_alert_id,
    incidents.c.alerts_total,
    incidents.c.alerts_firing,
    incidents.c.opened_at,
    incidents.c.updated_at,
    incidents.c.resolved_at,
    incidents.c.acked_at,
    incidents.c.acked_by,
    incidents.c.state,
)


def _summary(row: Any) -> IncidentSummary:
    state = row.state if isinstance(row.state, dict) else {}
    page = state.get("page_alert_id") if state.get("paged") else None
    lead = ((state.get("lead") or {}).get("alert") or {}).get("labels") or {}
    return IncidentSummary(
        id=int(row.id),
        status=row.status,
        priority=row.priority,
        job=row.job or "",
        cause=row.cause or "",
        cause_alert_id=row.cause_alert_id,
        alerts_total=int(row.alerts_total),
        alerts_firing=int(row.alerts_firing),
        opened_at=row.opened_at,
        updated_at=row.updated_at,
        resolved_at=row.resolved_at,
        acked_at=row.acked_at,
        acked_by=row.acked_by,
        nodes=len(state.get("nodes") or {}),
        gpus=len(state.get("gpus") or {}),
        page_alert_id=int(page) if isinstance(page, int) else None,
        # why it pages on its own (a storm), or why it resolved while jobs' alerts fired on
        note=str(state.get("storm_note") or state.get("spent") or ""),
        alertname=str(lead.get("alertname") or (row.cause or "").rsplit("/", 1)[0]),
    )


async def incidents_of(conn: AsyncConnection, alert_ids: Iterable[int]) -> dict[int, int]:
    """alert id -> the incident it is in, for those of `alert_ids` in one."""
    found: dict[int, int] = {}
    wanted = sorted(set(alert_ids))
    for start in range(0, len(wanted), _CHUNK):
        query = select(incident_alerts.c.alert_id, incident_alerts.c.incident_id).where(
            incident_alerts.c.alert_id.in_(wanted[start : start + _CHUNK])
        )
        found.update((int(a), int(i)) for a, i in await conn.execute(query))
    return found


async def incident_summaries(
    conn: AsyncConnection, ids: Iterable[int]
) -> dict[int, IncidentSummary]:
    found: dict[int, IncidentSummary] = {}
    wanted = sorted(set(ids))
    for start in range(0, len(wanted), _CHUNK):
        query = select(*_COLUMNS).where(incidents.c.id.in_(wanted[start : start + _CHUNK]))
        found.update((int(row.id), _summary(row)) for row in await conn.execute(query))
    return found


async def list_incidents(
    conn: AsyncConnection,
    *,
    status: str | None = None,
    priority: str | None = None,
    job: str | None = None,
    limit: int = 100,
    before: int | None = None,
) -> tuple[list[IncidentSummary], int | None]:
    """Incidents, newest first, and the `before` of the next (older) page (None: no more).
    `job` is the job as cards name it (`namespace/name`), or its name alone."""
    query = select(*_COLUMNS).order_by(incidents.c.id.desc()).limit(limit + 1)
    if status:
        query = query.where(incidents.c.status == status)
    if priority:
        query = query.where(incidents.c.priority == priority)
    if job:
        named = incidents.c.job == job
        if "/" not in job:
            named = named | incidents.c.job.endswith(f"/{job}", autoescape=True)
        query = query.where(named)
    if before is not None:
        query = query.where(incidents.c.id < before)
    rows = (await conn.execute(query)).all()
    items = [_summary(row) for row in rows[:limit]]
    return items, (items[-1].id if len(rows) > limit else None)


async def incident_summary(conn: AsyncConnection, incident_id: int) -> IncidentSummary | None:
    return (await incident_summaries(conn, [incident_id])).get(incident_id)


def _members(incident_id: int) -> Any:
    return select(incident_alerts.c.alert_id).where(incident_alerts.c.incident_id == incident_id)


async def incident_alerts_of(
    conn: AsyncConnection, incident_id: int, *, limit: int = 500, before: int | None = None
) -> list[AlertRow]:
    """The incident's alerts: firing first, then the most urgent, newest first; at most
    `limit` (`before`: only ids below it, for the API's pages, newest first)."""
    firing_first = case((alerts.c.status == "firing", 0), else_=1)
    query = select(*LIST_COLUMNS).where(alerts.c.id.in_(_members(incident_id)))
    if before is not None:
        query = query.where(alerts.c.id < before).order_by(alerts.c.id.desc())
    else:
        query = query.order_by(
            firing_first, func.coalesce(alerts.c.priority, "P3"), alerts.c.id.desc()
        )
    return [alert_row(row) for row in await conn.execute(query.limit(limit))]


async def incident_events(
    conn: AsyncConnection, incident_id: int, limit: int = 500
) -> list[dict[str, Any]]:
    """The newest `limit` events of the incident's alerts (oldest first), each with its
    alert's id, name and node."""
    query = (
        select(
            alert_events.c.alert_id,
            alert_events.c.kind,
            alert_events.c.at,
            alert_events.c.detail,
            alerts.c.alertname,
            alerts.c.node,
        )
        .join(alerts, alerts.c.id == alert_events.c.alert_id)
        .where(alert_events.c.alert_id.in_(_members(incident_id)))
        .order_by(alert_events.c.id.desc())
        .limit(limit)
    )
    return [dict(row._mapping) for row in reversed((await conn.execute(query)).all())]


async def incident_notifications(
    conn: AsyncConnection, incident_id: int, limit: int = 500
) -> list[dict[str, Any]]:
    """The notifications and calls made for the incident's alerts (its cards, redraws,
    follow-ups, acks and pages name one of them), oldest first, at most `limit`."""
    query = (
        select(
            notifications.c.id,
            notifications.c.alert_id,
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
        .where(notifications.c.alert_id.in_(_members(incident_id)))
        .order_by(notifications.c.id)
        .limit(limit)
    )
    return [dict(row._mapping) for row in await conn.execute(query)]


async def incident_alert(conn: AsyncConnection, incident_id: int) -> int | None:
    """An alert of the incident to act through (its cause, else its oldest): an ack of any
    of its alerts acknowledges the incident (gateway/stages/services/ack.py)."""
    row = (
        await conn.execute(select(incidents.c.cause_alert_id).where(incidents.c.id == incident_id))
    ).first()
    if row is None:
        return None
    if row.cause_alert_id is not None:
        return int(row.cause_alert_id)
    first = (await conn.execute(_members(incident_id).order_by("alert_id").limit(1))).scalar()
    return int(first) if first is not None else None


async def job_unacked(
    conn: AsyncConnection, namespace: str, job: str, limit: int = 500
) -> tuple[list[int], list[int]]:
    """What acknowledging a job acknowledges: its open incidents not acknowledged yet (at
    most `limit`), and its firing alerts in no incident and not acknowledged (at most
    `limit`: alerts the policy has not placed yet, or stored before incidents)."""
    in_namespace = (
        alerts.c.job_namespace == namespace
        if namespace
        else alerts.c.job_namespace.is_(None) | (alerts.c.job_namespace == "")
    )
    open_alerts = (
        alerts.c.status == "firing",
        alerts.c.acked_at.is_(None),
        alerts.c.job_name == job,
        in_namespace,
    )
    query = (
        select(incident_alerts.c.incident_id)
        .join(alerts, alerts.c.id == incident_alerts.c.alert_id)
        .join(incidents, incidents.c.id == incident_alerts.c.incident_id)
        .where(*open_alerts, incidents.c.acked_at.is_(None))
        .distinct()
        .order_by(incident_alerts.c.incident_id)
        .limit(limit)
    )
    found = [int(i) for i in (await conn.execute(query)).scalars()]
    loose = (
        select(alerts.c.id)
        .where(*open_alerts, alerts.c.id.not_in(select(incident_alerts.c.alert_id)))
        .order_by(alerts.c.id)
        .limit(limit)
    )
    return found, [int(i) for i in (await conn.execute(loose)).scalars()]


async def resolved_incidents(
    conn: AsyncConnection, *, since: datetime, search: str | None = None, limit: int = 200
) -> list[IncidentSummary]:
    """Resolved incidents opened since `since`, newest first, at most `limit`. `search`
    (case blind, as a substring) matches the incident's cause or job, or any of its alerts
    as History's alert search does (store/console.py `alert_search`)."""
    query = (
        select(*_COLUMNS)
        .where(incidents.c.status == "resolved", incidents.c.opened_at >= since)
        .order_by(incidents.c.id.desc())
        .limit(limit)
    )
    if search:
        needle = search.lower()
        holding = (
            select(incident_alerts.c.incident_id)
            .join(alerts, alerts.c.id == incident_alerts.c.alert_id)
            .where(alert_search(search))
        )
        query = query.where(
            or_(
                func.lower(incidents.c.cause).contains(needle, autoescape=True),
                func.lower(incidents.c.job).contains(needle, autoescape=True),
                incidents.c.id.in_(holding),
            )
        )
    return [_summary(row) for row in await conn.execute(query)]


async def first_alerts(
    conn: AsyncConnection, incident_ids: Iterable[int], per_incident: int = 10
) -> dict[int, list[AlertRow]]:
    """incident id -> its first `per_incident` alerts (the most urgent, then the newest),
    one query per chunk of ids (a window function: a large incident never crowds out the
    others)."""
    wanted = sorted(set(incident_ids))
    found: dict[int, list[AlertRow]] = {incident: [] for incident in wanted}
    for start in range(0, len(wanted), _CHUNK):
        rank = (
            func.row_number()
            .over(
                partition_by=incident_alerts.c.incident_id,
                order_by=(func.coalesce(alerts.c.priority, "P3"), alerts.c.id.desc()),
            )
            .label("rank")
        )
        ranked = (
            select(incident_alerts.c.incident_id, *LIST_COLUMNS, rank)
            .join(alerts, alerts.c.id == incident_alerts.c.alert_id)
            .where(incident_alerts.c.incident_id.in_(wanted[start : start + _CHUNK]))
            .subquery()
        )
        query = (
            select(ranked)
            .where(ranked.c.rank <= per_incident)
            .order_by(ranked.c.incident_id, ranked.c.rank)
        )
        for row in await conn.execute(query):
            found[int(row.incident_id)].append(alert_row(row))
    return found


async def open_incidents_on(
    conn: AsyncConnection, nodes: Iterable[str], limit: int = 2000
) -> dict[str, list[int]]:
    """node -> the open incidents with an alert firing on it (newest first), for `nodes`;
    at most `limit` (node, incident) pairs in all."""
    wanted = sorted(set(nodes))
    found: dict[str, list[int]] = {}
    left = limit
    for start in range(0, len(wanted), _CHUNK):
        if left <= 0:
            break
        query = (
            select(alerts.c.node, incident_alerts.c.incident_id)
            .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
            .join(incidents, incidents.c.id == incident_alerts.c.incident_id)
            .where(
                alerts.c.status == "firing",
                incidents.c.status == "firing",
                alerts.c.node.in_(wanted[start : start + _CHUNK]),
            )
            .distinct()
            .order_by(alerts.c.node, incident_alerts.c.incident_id.desc())
            .limit(left)
        )
        rows = (await conn.execute(query)).all()
        left -= len(rows)
        for node, incident in rows:
            found.setdefault(str(node), []).append(int(incident))
    return found
