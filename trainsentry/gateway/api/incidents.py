"""The incidents API: `GET /api/v1/incidents`, `GET /api/v1/incidents/{id}` (read token,
bounded query parameters like the read API's) and `POST /api/v1/incidents/{id}/ack` (the
API token, like the alerts' ack: it acknowledges the incident, all its alerts, through
`AckService.acknowledge_incident`; its body and caller are read as the alerts' ack's:
ack.py; a caller who may not act on the incident is refused, 403 with the reason)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from trainsentry.gateway.acting import incident_target, refusal
from trainsentry.gateway.api.ack import ack_request
from trainsentry.gateway.api.auth import error_response
from trainsentry.gateway.api.path_ids import MAX_INCIDENT_ID, id_problem, parse_id
from trainsentry.gateway.api.read import query_choice, query_int, query_text, read_guard
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.store.console import AlertRow
from trainsentry.store.console_incidents import (
    incident_alerts_of,
    incident_notifications,
    incident_summary,
    list_incidents,
)
from trainsentry.store.errors import STORE_FAILURES


def path_incident_id(request: web.Request) -> int:
    """The `{incident_id}` of the path (path_ids.py); 400 for anything else."""
    incident_id = parse_id(request.match_info["incident_id"], MAX_INCIDENT_ID)
    if incident_id is None:
        raise web.HTTPBadRequest(reason=id_problem("incident", MAX_INCIDENT_ID))
    return incident_id


def alert_json(row: AlertRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "alertname": row.alertname,
        "status": row.status,
        "priority": row.priority,
        "node": row.node,
        "namespace": row.namespace,
        "job": row.job,
        "labels": row.labels,
        "starts_at": row.starts_at.isoformat(),
        "resolved_at": row.resolved_at.isoformat() if row.resolved_at else None,
        "acked_at": row.acked_at.isoformat() if row.acked_at else None,
        "acked_by": row.acked_by,
        "fingerprint": row.fingerprint,
    }


def _iso(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


@read_guard
async def get_incidents(request: web.Request) -> web.StreamResponse:
    """GET /api/v1/incidents?status=&priority=&job=&limit=&before=: newest first."""
    gateway = request.app[GATEWAY_KEY]
    status = query_choice(request, "status", ("firing", "resolved"))
    priority = query_choice(request, "priority", ("P0", "P1", "P2", "P3"))
    limit = query_int(request, "limit", 100, 1, 1000) or 100
    before = query_int(request, "before", None, 1, MAX_INCIDENT_ID)
    job = query_text(request, "job")
    async with gateway.engine.connect() as conn:
        items, next_before = await list_incidents(
            conn, status=status, priority=priority, job=job, limit=limit, before=before
        )
    return web.json_response(
        {"items": [item.to_json() for item in items], "next_before": next_before}
    )


@read_guard
async def get_incident(request: web.Request) -> web.StreamResponse:
    """GET /api/v1/incidents/{id}?alerts_limit=&alerts_before=: the incident, its alerts
    (firing first; with `alerts_before`, newest first below it) and its notifications."""
    gateway = request.app[GATEWAY_KEY]
    incident_id = path_incident_id(request)
    limit = query_int(request, "alerts_limit", 500, 1, 1000) or 500
    before = query_int(request, "alerts_before", None, 1, 2**62)
    async with gateway.engine.connect() as conn:
        found = await incident_summary(conn, incident_id)
        if found is None:
            return error_response(404, f"no incident {incident_id}")
        rows = await incident_alerts_of(conn, incident_id, limit=limit + 1, before=before)
        sent = await incident_notifications(conn, incident_id)
    item = found.to_json()
    item["alerts"] = [alert_json(row) for row in rows[:limit]]
    item["alerts_next_before"] = rows[limit - 1].id if len(rows) > limit else None
    item["notifications"] = [
        {k: _iso(v) for k, v in note.items() if k != "payload"} for note in sent
    ]
    return web.json_response(item)


async def post_incident_ack(request: web.Request) -> web.Response:
    """POST /api/v1/incidents/{id}/ack: acknowledges the incident (all its alerts)."""
    gateway = request.app[GATEWAY_KEY]
    asked = await ack_request(request)
    if isinstance(asked, web.Response):
        return asked
    try:
        incident_id = path_incident_id(request)
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    try:
        target = await incident_target(gateway, incident_id)
        if target is None:
            return error_response(404, f"no incident {incident_id}")
        if (refused := refusal(gateway, asked.actor, target)) is not None:
            return refused
        result = await gateway.ack.acknowledge_incident(
            incident_id, asked.actor.name, asked.silence, comment=asked.comment,
            via=asked.actor.via,
        )  # fmt: skip
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    if result is None:
        return error_response(404, f"no incident {incident_id}")
    return web.json_response(result.to_json())


def add_incident_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/incidents", get_incidents)
    app.router.add_get("/api/v1/incidents/{incident_id}", get_incident)
    app.router.add_post("/api/v1/incidents/{incident_id}/ack", post_incident_ack)
