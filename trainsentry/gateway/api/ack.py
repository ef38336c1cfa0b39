"""An alert's acknowledgement and its "escalate now": thin handlers over `AckService`
(stages/services/ack.py), which owns both.

- `POST /api/v1/alerts/{id}/ack` `{"by": WHO, "silence_minutes": 60, "comment": "..."}`:
  acknowledge the alert's incident (the phone stops; optionally silence it in Alertmanager;
  its body read by `ack_request`, which the incidents' ack shares: incidents.py);
- `POST /api/v1/alerts/{id}/escalate` `{"by": WHO}`: call the next escalation step now.

Both take the read token (the caller names themself in `by`: audited as the API token's),
or a person signed in through the trusted proxy (gateway/acting.py `api_actor`); both are
refused (403) when no token is set, and (403, with the reason) when the caller may not act
on the alert's incident (gateway/access.py); bad input is a 400 whose reason names the
field, a store that cannot be reached a 503. The Feishu card's
buttons reach the same service through the card callback (app.py, `card_ack`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from aiohttp import web

from trainsentry.gateway.access import Actor
from trainsentry.gateway.acting import alert_target, api_actor, named, refusal
from trainsentry.gateway.api.auth import error_response, read_token
from trainsentry.gateway.api.read import path_alert_id
from trainsentry.gateway.api.request_body import BodyRejected, read_json_object
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.gateway.stages.services.ack import EscalationRefused
from trainsentry.store.errors import STORE_FAILURES

MAX_BY = 200


@dataclass(frozen=True, slots=True)
class AckRequest:
    actor: Actor  # who acknowledges, and how they signed in (gateway/acting.py)
    silence: timedelta | None
    comment: str | None


def by_of(body: dict[str, Any], actor: Actor, what: str) -> Actor | web.Response:
    """Who acts: the API token's caller names themself in `by` (required, bounded text); a
    person signed in through the proxy is the proxy's name (`by`, if given, is ignored)."""
    if actor.via != "api-token":
        return actor
    who = body.get("by")
    if not isinstance(who, str) or not who.strip() or len(who) > MAX_BY:
        return error_response(400, f"'by' ({what}) is required, up to {MAX_BY} characters")
    if (problem := text_problem(who)) is not None:
        return error_response(400, f"'by': {problem}")
    return named(actor, who.strip())


async def ack_request(request: web.Request) -> AckRequest | web.Response:
    """An ack's body `{"by": "...", "silence_minutes": 60, "comment": "..."}` and who sends
    it, or the refusal: 403 without an API token, 401, 400 naming what is wrong."""
    gateway = request.app[GATEWAY_KEY]
    actor = api_actor(request, gateway, read_token(gateway.settings))
    if isinstance(actor, web.Response):
        return actor
    try:
        body = await read_json_object(request)
    except BodyRejected as exc:
        return error_response(exc.status, exc.reason)
    acting = by_of(body, actor, "who acknowledges")
    if isinstance(acting, web.Response):
        return acting
    minutes = body.get("silence_minutes")
    if minutes is not None and (
        isinstance(minutes, bool)
        or not isinstance(minutes, int | float)
        or not 0 < minutes <= 43200
    ):
        return error_response(400, "'silence_minutes' must be a number of minutes, up to 30 days")
    comment = body.get("comment")
    if comment is not None and (
        not isinstance(comment, str) or len(comment) > 1000 or text_problem(comment) is not None
    ):
        return error_response(400, "'comment' must be text of up to 1000 characters")
    silence = timedelta(minutes=minutes) if minutes else None
    return AckRequest(acting, silence, comment.strip() if comment else None)


async def post_ack(request: web.Request) -> web.Response:
    """POST /api/v1/alerts/{id}/ack {"by": "...", "silence_minutes": 60, "comment": "..."}:
    authenticated; acknowledges the alert's incident (all its alerts), by a caller allowed
    to act on it."""
    gateway = request.app[GATEWAY_KEY]
    if read_token(gateway.settings) is None:
        return error_response(403, "acks need TRAINSENTRY_API_TOKEN set on the gateway")
    asked = await ack_request(request)
    if isinstance(asked, web.Response):
        return asked
    try:
        alert_id = path_alert_id(request)
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    try:
        target = await alert_target(gateway, alert_id)
        if target is None:
            return error_response(404, f"no alert {alert_id}")
        if (refused := refusal(gateway, asked.actor, target)) is not None:
            return refused
        result = await gateway.ack.acknowledge(
            alert_id, asked.actor.name, asked.silence, comment=asked.comment,
            via=asked.actor.via,
        )  # fmt: skip
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    if result is None:
        return error_response(404, f"no alert {alert_id}")
    return web.json_response(result.to_json())


async def post_escalate(request: web.Request) -> web.Response:
    """POST /api/v1/alerts/{id}/escalate {"by": WHO}: the next step is called now, by a
    caller allowed to act on the alert's incident."""
    gateway = request.app[GATEWAY_KEY]
    actor = api_actor(request, gateway, read_token(gateway.settings))
    if isinstance(actor, web.Response):
        return actor
    try:
        alert_id = path_alert_id(request)
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    try:
        body = await read_json_object(request)
    except BodyRejected as exc:
        return error_response(exc.status, exc.reason)
    acting = by_of(body, actor, "who escalates")
    if isinstance(acting, web.Response):
        return acting
    try:
        target = await alert_target(gateway, alert_id)
        if target is None:
            return error_response(404, f"no alert {alert_id}")
        if (refused := refusal(gateway, acting, target)) is not None:
            return refused
        result = await gateway.ack.escalate_now(alert_id, acting.name, via=acting.via)
    except EscalationRefused as exc:
        return error_response(exc.status, exc.reason)
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    gateway.outbox.wake()
    return web.json_response(result.to_json())


def add_ack_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/alerts/{alert_id}/ack", post_ack)
    app.router.add_post("/api/v1/alerts/{alert_id}/escalate", post_escalate)
