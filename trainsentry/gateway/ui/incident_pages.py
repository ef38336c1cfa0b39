"""The console's incident pages and bulk acks (aiohttp handlers, thin; handlers.py wraps
them: the viewer, CSRF, 400/503, the security headers).

- `GET /ui/incidents/{id}` (and its live fragment): the incident, its alerts (the first
  MAX_ALERTS drawn), the events of its alerts (the newest MAX_EVENTS), the notifications and
  calls made for it, and its cause alert in full (the diagnosis of a hang among it).
- `POST /ui/incidents/{id}/{action}`: an action of `ACTIONS` on the incident: acknowledge
  and silence go through one of its alerts (an ack of any acknowledges the incident, all its
  alerts: stages/ack.py), escalate through the alert its escalation is keyed by. From the
  Now page (`from=now`) it returns there.
- `POST /ui/jobs/ack`: acknowledges a job's open incidents not acknowledged yet (and its
  firing alerts in no incident), at most MAX_JOB_ACKS of each, one ack each.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.planning.plan import FINGERPRINT_SCOPE
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.actions import ACTIONS, NOTICES, SILENCE_CHOICES, ActionRefused
from trainsentry.gateway.ui.handlers import action_form, actions_of, marker_text, page
from trainsentry.gateway.ui.incident_views import incident_page as incident_view
from trainsentry.gateway.ui.pages import now_of, render
from trainsentry.gateway.ui.views import BadQuery, alert_view, text_param
from trainsentry.store import console as store
from trainsentry.store.console_incidents import (
    incident_alert,
    incident_alerts_of,
    incident_events,
    incident_notifications,
    incident_summary,
    job_unacked,
)
from trainsentry.store.maintenance_windows import mutes_of
from trainsentry.store.policy_state import load_states

log = logging.getLogger("trainsentry.ui")

MAX_ALERTS = 500  # alerts drawn on an incident's page (firing first)
MAX_EVENTS = 500
MAX_JOB_ACKS = 500


def _incident_id(request: web.Request) -> int:
    raw = request.match_info["incident_id"]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        raise BadQuery("incident id must be a positive integer")
    return int(raw)


async def _incident(request: web.Request) -> tuple[Any, str] | None:
    gateway = request.app[GATEWAY_KEY]
    incident_id = _incident_id(request)
    async with gateway.engine.connect() as conn:
        marker = marker_text(await store.change_marker(conn))
        summary = await incident_summary(conn, incident_id)
        if summary is None:
            return None
        rows = await incident_alerts_of(conn, incident_id, limit=MAX_ALERTS)
        events = await incident_events(conn, incident_id, MAX_EVENTS)
        notes = await incident_notifications(conn, incident_id)
        cause = None
        if summary.cause_alert_id is not None:
            detail = await store.alert_detail(conn, summary.cause_alert_id, max_rows=1)
            if detail is not None:
                fingerprint = detail.alert.fingerprint
                states = await load_states(conn, FINGERPRINT_SCOPE, [fingerprint])
                mutes = await mutes_of(conn, [detail.alert.id])
                cause = (detail, states.get(fingerprint), mutes.get(detail.alert.id))
    now = now_of(gateway)
    cause_view = alert_view(cause[0], now, cause[1], cause[2]) if cause else None
    return incident_view(summary, rows, events, notes, now, cause_view), marker


@page()
async def incident_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    found = await _incident(request)
    if found is None:
        return render(request, who, "error.html.j2", status=404, message="no such incident")
    view, marker = found
    return render(
        request, who, "incident.html.j2", view=view, marker=marker,
        actions=actions_of(request.app[GATEWAY_KEY]), silence_choices=SILENCE_CHOICES,
        notice=NOTICES.get(request.query.get("done", "")),
    )  # fmt: skip


@page(fragment=True)
async def incident_fragment(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    found = await _incident(request)
    if found is None:
        return web.Response(status=404, text="no such incident")
    view, marker = found
    return render(request, who, "_incident.html.j2", view=view, marker=marker)


@page()
async def post_incident_action(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/incidents/{id}/{action}: an action of `ACTIONS` on the incident."""
    gateway = request.app[GATEWAY_KEY]
    fields = await action_form(request, who)
    if isinstance(fields, web.Response):
        return fields
    assert who.name is not None
    action = ACTIONS.get(request.match_info["action"])
    if action is None or not action.available(gateway):
        return render(request, who, "error.html.j2", status=404, message="no such action")
    incident_id = _incident_id(request)
    async with gateway.engine.connect() as conn:
        summary = await incident_summary(conn, incident_id)
        alert_id = await incident_alert(conn, incident_id)
    if summary is None or alert_id is None:
        return render(request, who, "error.html.j2", status=404, message="no such incident")
    if action.name == "escalate":
        alert_id = summary.page_alert_id or alert_id
    try:
        outcome = await action.run(gateway, alert_id, who.name, fields)
    except ActionRefused as exc:
        return render(request, who, "error.html.j2", status=exc.status, message=str(exc))
    if outcome is None:
        return render(request, who, "error.html.j2", status=404, message="no such incident")
    log.info("console action=%s incident=%d by=%s", action.name, incident_id, who.name)
    query = urlencode({"done": outcome.notice})
    if fields.get("from") == "now":
        raise web.HTTPSeeOther(f"/ui/?{query}")
    raise web.HTTPSeeOther(f"/ui/incidents/{incident_id}?{query}")


@page()
async def post_job_ack(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/jobs/ack (form fields `namespace`, `name`): acknowledges the job's open
    incidents and loose alerts not acknowledged yet, each through the ack service."""
    gateway = request.app[GATEWAY_KEY]
    fields = await action_form(request, who)
    if isinstance(fields, web.Response):
        return fields
    assert who.name is not None
    if gateway.ack is None:
        return render(request, who, "error.html.j2", status=404, message="no such action")
    namespace = text_param(fields.get("namespace"), "namespace")
    name = text_param(fields.get("name"), "name")
    if not name:
        raise BadQuery("name (the training job) is required")
    async with gateway.engine.connect() as conn:
        incident_ids, alert_ids = await job_unacked(conn, namespace, name, MAX_JOB_ACKS)
    for incident_id in incident_ids:
        await gateway.ack.acknowledge_incident(incident_id, who.name)
    for alert_id in alert_ids:
        await gateway.ack.acknowledge(alert_id, who.name)
    log.info(
        "console job ack job=%s/%s incidents=%d alerts=%d by=%s",
        namespace, name, len(incident_ids), len(alert_ids), who.name,
    )  # fmt: skip
    raise web.HTTPSeeOther("/ui/?" + urlencode({"done": "job-acked"}))
