"""The console's incident pages and bulk acks (aiohttp handlers, thin; handlers.py wraps
them: the viewer, CSRF, 400/503, the security headers).

- `GET /ui/incidents/{id}` (and its live fragment): the incident, its alerts (the first
  MAX_ALERTS drawn), the events of its alerts (the newest MAX_EVENTS), the notifications and
  calls made for it, and its cause alert in full (the diagnosis of a hang among it).
- `POST /ui/incidents/{id}/{action}`: an action of `ACTIONS` on the incident: acknowledge
  and silence go through one of its alerts (an ack of any acknowledges the incident, all its
  alerts: stages/services/ack.py), escalate through the alert its escalation is keyed by. From the
  Now page (`from=now`) it returns there.
- `POST /ui/jobs/ack`: acknowledges a job's open incidents not acknowledged yet (and its
  firing alerts in no incident), at most MAX_JOB_ACKS of each, one ack each.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from trainsentry.gateway.access import Target
from trainsentry.gateway.acting import incident_target, job_incidents_target
from trainsentry.gateway.api.path_ids import MAX_INCIDENT_ID, id_problem, parse_id
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.planning.plan import FINGERPRINT_SCOPE
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.acting import acting
from trainsentry.gateway.ui.actions import ACTIONS, NOTICES, SILENCE_CHOICES, ActionRefused
from trainsentry.gateway.ui.handlers import actions_of, marker_text, page
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
    incident_id = parse_id(request.match_info["incident_id"], MAX_INCIDENT_ID)
    if incident_id is None:
        raise BadQuery(id_problem("incident", MAX_INCIDENT_ID))
    return incident_id


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
    """POST /ui/incidents/{id}/{action}: an action of `ACTIONS` on the incident, by a viewer
    allowed to act on it (ui/acting.py)."""
    gateway = request.app[GATEWAY_KEY]
    incident_id = _incident_id(request)
    done = await acting(request, who, lambda _form: incident_target(gateway, incident_id))
    if isinstance(done, web.Response):
        return done
    action = ACTIONS.get(request.match_info["action"])
    if action is None or not action.available(gateway):
        return render(request, who, "error.html.j2", status=404, message="no such action")
    async with gateway.engine.connect() as conn:
        summary = await incident_summary(conn, incident_id)
        alert_id = await incident_alert(conn, incident_id)
    if summary is None or alert_id is None:
        return render(request, who, "error.html.j2", status=404, message="no such incident")
    if action.name == "escalate":
        alert_id = summary.page_alert_id or alert_id
    try:
        outcome = await action.run(gateway, alert_id, done.actor, done.fields)
    except ActionRefused as exc:
        return render(request, who, "error.html.j2", status=exc.status, message=str(exc))
    if outcome is None:
        return render(request, who, "error.html.j2", status=404, message="no such incident")
    log.info(
        "console action=%s incident=%d by=%s via=%s",
        action.name, incident_id, done.actor.name, done.actor.via,
    )  # fmt: skip
    query = urlencode({"done": outcome.notice})
    if done.fields.get("from") == "now":
        raise web.HTTPSeeOther(f"/ui/?{query}")
    raise web.HTTPSeeOther(f"/ui/incidents/{incident_id}?{query}")


@page()
async def post_job_ack(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/jobs/ack (form fields `namespace`, `name`): acknowledges the job's open
    incidents and loose alerts not acknowledged yet, each through the ack service, by a
    viewer allowed to act on the job's namespace and on each of those incidents (their
    jobs' namespaces: ui/acting.py)."""
    gateway = request.app[GATEWAY_KEY]

    found: list[tuple[list[int], list[int]]] = []

    async def target(fields: Mapping[str, str]) -> Target:
        """The job's namespace and each incident the ack would acknowledge."""
        namespace = text_param(fields.get("namespace"), "namespace")
        name = text_param(fields.get("name"), "name")
        if not name:
            raise BadQuery("name (the training job) is required")
        async with gateway.engine.connect() as conn:
            found.append(await job_unacked(conn, namespace, name, MAX_JOB_ACKS))
        return await job_incidents_target(gateway, namespace, name, found[0][0])

    done = await acting(request, who, target)
    if isinstance(done, web.Response):
        return done
    namespace = text_param(done.fields.get("namespace"), "namespace")
    name = text_param(done.fields.get("name"), "name")
    incident_ids, alert_ids = found[0]
    actor = done.actor
    for incident_id in incident_ids:
        await gateway.ack.acknowledge_incident(incident_id, actor.acting_name, via=actor.via)
    for alert_id in alert_ids:
        await gateway.ack.acknowledge(alert_id, actor.acting_name, via=actor.via)
    log.info(
        "console job ack job=%s/%s incidents=%d alerts=%d by=%s via=%s",
        namespace, name, len(incident_ids), len(alert_ids), actor.name, actor.via,
    )  # fmt: skip
    raise web.HTTPSeeOther("/ui/?" + urlencode({"done": "job-acked"}))
