"""An alert's acknowledgement and its "escalate now": thin handlers over `AckService`
(stages/ack.py), which owns both.

- `POST /api/v1/alerts/{id}/ack` `{"by": WHO, "silence_minutes": 60, "comment": "..."}`:
  acknowledge the alert's incident (the phone stops; optionally silence it in Alertmanager;
  its body read by `ack_request`, which the incidents' ack shares: incidents_api.py);
- `POST /api/v1/alerts/{id}/escalate` `{"by": WHO}`: call the next escalation step now.

Both take the read token and are refused (403) when no token is set; bad input is a 400
whose reason names the field, a store that cannot be reached a 503. The Feishu card's
buttons reach the same service through the card callback (app.py, `card_ack`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from aiohttp import web

from trainsentry.gateway.http_auth import authorized, error_response, read_token, unauthorized
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.read_api import path_alert_id
from trainsentry.gateway.request_body import BodyRejected, read_json_object
from trainsentry.gateway.stages.ack import EscalationRefused
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.store.errors import DatabaseError

MAX_BY = 200


@dataclass(frozen=True, slots=True)
class AckRequest:
    who: str
    silence: timedelta | None
    comment: str | None


async def ack_request(request: web.Request) -> AckRequest | web.Response:
    """An ack's body `{"by": "...", "silence_minutes": 60, "comment": "..."}`, or the
    refusal: 403 without an API token, 401, 400 naming what is wrong."""
    token = read_token(request.app[GATEWAY_KEY].settings)
    if token is None:
        return error_response(403, "acks need TRAINSENTRY_API_TOKEN set on the gateway")
    if not authorized(request, token):
        return unauthorized()
    try:
        body = await read_json_object(request)
    except BodyRejected as exc:
        return error_response(exc.status, exc.reason)
    who = body.get("by")
    minutes = body.get("silence_minutes")
    if not isinstance(who, str) or not who.strip() or len(who) > MAX_BY:
        return error_response(400, "'by' (who acknowledges) is required, up to 200 characters")
    if (problem := text_problem(who)) is not None:
        return error_response(400, f"'by': {problem}")
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
    return AckRequest(who.strip(), silence, comment.strip() if comment else None)


async def post_ack(request: web.Request) -> web.Response:
    """POST /api/v1/alerts/{id}/ack {"by": "...", "silence_minutes": 60, "comment": "..."}:
    authenticated; acknowledges the alert's incident (all its alerts)."""
    gateway = request.app[GATEWAY_KEY]
    token = read_token(gateway.settings)
    if token is None:
        return error_response(403, "acks need TRAINSENTRY_API_TOKEN set on the gateway")
    if not authorized(request, token):
        return unauthorized()
    try:
        alert_id = path_alert_id(request)
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    asked = await ack_request(request)
    if isinstance(asked, web.Response):
        return asked
    assert gateway.ack is not None
    try:
        result = await gateway.ack.acknowledge(
            alert_id, asked.who, asked.silence, comment=asked.comment
        )
    except (OSError, DatabaseError) as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    if result is None:
        return error_response(404, f"no alert {alert_id}")
    return web.json_response(result.to_json())


async def post_escalate(request: web.Request) -> web.Response:
    """POST /api/v1/alerts/{id}/escalate {"by": WHO}: the next step is called now."""
    gateway = request.app[GATEWAY_KEY]
    token = read_token(gateway.settings)
    if token is None:
        return error_response(403, "changes need TRAINSENTRY_API_TOKEN set on the gateway")
    if not authorized(request, token):
        return unauthorized()
    try:
        alert_id = path_alert_id(request)
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    try:
        body = await read_json_object(request)
    except BodyRejected as exc:
        return error_response(exc.status, exc.reason)
    by = body.get("by")
    if not isinstance(by, str) or not by.strip() or len(by) > MAX_BY:
        return error_response(400, f"'by' must be a string of up to {MAX_BY} characters")
    if (problem := text_problem(by)) is not None:
        return error_response(400, f"'by': {problem}")
    assert gateway.ack is not None
    try:
        result = await gateway.ack.escalate_now(alert_id, by.strip())
    except EscalationRefused as exc:
        return error_response(exc.status, exc.reason)
    except (OSError, DatabaseError) as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    gateway.outbox.wake()
    return web.json_response(result.to_json())


def add_ack_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/alerts/{alert_id}/ack", post_ack)
    app.router.add_post("/api/v1/alerts/{alert_id}/escalate", post_escalate)
