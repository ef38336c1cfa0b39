"""Where who may act is enforced (the decision is access.py's `may_act_on`, pure):

- `authorize(gateway, actor, target)`: the one check of a request that acts, made once per
  request by the console's actions (gateway/ui/acting.py) and the API's handlers; a refusal
  is logged with who, how they signed in, and the reason, and answered 403 with the reason;
- the targets, read from the store: an incident (the namespaces of its jobs' alerts), an
  alert (its incident's), notifications (their alerts' incidents'; one of no alert, or the
  whole outbox, is the cluster's), a job, a node (the cluster's), a maintenance window (the
  namespace its matchers name), an on-call schedule;
- who calls the API (`api_actor`): the bearer token (`api-token`: the name is the `by` the
  caller gives) or, from a trusted proxy address, the proxy's user and groups, as the
  console reads them. A proxy's person is believed only on a request a page of another site
  cannot send without the gateway's consent (CORS, which the gateway never grants): a
  DELETE, or a body of `Content-Type: application/json`; a form posted across sites
  carries the proxy's cookie but is refused (403).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from aiohttp import web
from pydantic import SecretStr

from trainsentry.gateway.access import (
    CLUSTER,
    Actor,
    Decision,
    Target,
    feishu_actor,
    may_act_on,
    namespaces_of,
    window_namespaces,
)
from trainsentry.gateway.api.auth import authorized, error_response, proxy_actor, unauthorized
from trainsentry.gateway.pipeline import Gateway
from trainsentry.maintenance.types import MaintenanceWindow
from trainsentry.store.access_scopes import (
    Places,
    alert_places,
    incident_places,
    incidents_places,
    notification_places,
)

log = logging.getLogger("trainsentry.access")


def authorize(gateway: Gateway, actor: Actor, target: Target) -> Decision:
    """The check of an action (the module's docstring): `may_act_on` under the gateway's
    `gateway.access`, a refusal logged."""
    decision = may_act_on(actor, target, gateway.settings.access)
    if not decision.allowed:
        log.warning(
            "action refused by=%r via=%s target=%r: %s",
            actor.name, actor.via, target.what, decision.reason,
        )  # fmt: skip
    return decision


async def incident_target(gateway: Gateway, incident_id: int) -> Target | None:
    """The incident as a target (None: no such incident)."""
    async with gateway.engine.connect() as conn:
        places = await incident_places(conn, incident_id)
    if places is None:
        return None
    return Target(f"incident {incident_id}", namespaces_of(places))


async def alert_target(gateway: Gateway, alert_id: int) -> Target | None:
    """The alert's incident as a target (what an action through the alert acts on), or the
    alert alone when it is in none (None: no such alert)."""
    async with gateway.engine.connect() as conn:
        places = await alert_places(conn, alert_id)
    if places is None:
        return None
    return Target(f"alert {alert_id}'s incident", namespaces_of(places))


async def notifications_target(gateway: Gateway, ids: list[int]) -> Target:
    """The notifications `ids` as a target: the namespaces of each one's incident (as
    `alert_target`), the cluster's for one of no alert."""
    async with gateway.engine.connect() as conn:
        found = await notification_places(conn, ids)
    namespaces = frozenset(ns for places in found for ns in namespaces_of(places))
    return Target(f"notifications {_ids_text(ids)}", namespaces)


def outbox_target(what: str) -> Target:
    """Notifications chosen by channel or time, across every team: the cluster's (admins)."""
    return Target(what, frozenset({CLUSTER}))


def _ids_text(ids: list[int]) -> str:
    shown = ", ".join(str(i) for i in ids[:5])
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def feishu_presser(gateway: Gateway, open_id: str) -> Actor:
    """Who pressed a Feishu card's button (access.py `feishu_actor`), named as the
    `oncall.people` person whose `feishu_open_id` it is."""
    return feishu_actor(open_id, gateway.feishu_people)


def job_target(namespace: str, name: str, incident_places: Places = frozenset()) -> Target:
    """A job's bulk ack: the job's namespace, and each incident it acknowledges (the
    namespaces of their jobs' alerts: `incident_places`, as `job_incidents_target` reads)."""
    incidents = {ns for ns, has_job in incident_places if has_job}
    return Target(f"job {namespace}/{name}", frozenset({namespace, *incidents}))


async def job_incidents_target(
    gateway: Gateway, namespace: str, name: str, incident_ids: list[int]
) -> Target:
    """The target of a job's bulk ack of `incident_ids` (its open incidents)."""
    async with gateway.engine.connect() as conn:
        places = await incidents_places(conn, incident_ids)
    return job_target(namespace, name, places)


def node_target(node: str) -> Target:
    """A node is the cluster's: its cordon and uncordon are the admins'."""
    return Target(f"node {node}", frozenset({CLUSTER}))


def schedule_target(schedule: str) -> Target:
    return Target(f"on-call schedule {schedule}", schedules=frozenset({schedule}))


def window_target(window: MaintenanceWindow, window_id: str = "") -> Target:
    what = f"maintenance window {window_id}" if window_id else "a maintenance window"
    return Target(what, window_namespaces(window))


def _not_simple(request: web.Request) -> bool:
    """A request a page of another site cannot send without a CORS preflight."""
    return request.method == "DELETE" or request.content_type == "application/json"


def api_actor(
    request: web.Request, gateway: Gateway, token: SecretStr | None
) -> Actor | web.Response:
    """Who calls an API endpoint that acts, or the refusal: 403 when no token is set (acts
    need one), the bearer token (an `api-token` actor whose name the caller's `by` gives:
    `named`), a trusted proxy's person, else 401."""
    if token is None:
        return error_response(403, "changes need TRAINSENTRY_API_TOKEN set on the gateway")
    if authorized(request, token):
        return Actor("", "api-token")
    person = proxy_actor(request, gateway.settings.console)
    if person is None:
        return unauthorized()
    if not _not_simple(request):
        return error_response(
            403, "a request signed in through the proxy must send JSON"
            " (Content-Type: application/json)",
        )  # fmt: skip
    return person


def named(actor: Actor, by: str) -> Actor:
    """The API token's actor named by the caller's `by`; a proxy's person keeps the name the
    proxy gave (a `by` cannot speak for someone else)."""
    return replace(actor, name=by) if actor.via == "api-token" else actor


def refusal(gateway: Gateway, actor: Actor, target: Target) -> web.Response | None:
    """The API's 403 with the reason when `actor` may not act on `target`, else None."""
    decision = authorize(gateway, actor, target)
    return None if decision.allowed else error_response(403, decision.reason)
