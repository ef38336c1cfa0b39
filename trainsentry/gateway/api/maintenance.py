"""`/api/v1/maintenance`: thin handlers over `MaintenanceService` (stages/services/maintenance.py).

- `POST /api/v1/maintenance`: make a window (API token, or a person through the trusted
  proxy, allowed to act on the namespace it mutes: gateway/acting.py); 201 with the window,
  400 naming the field of a bad request, 403 with the reason;
- `GET /api/v1/maintenance[?all=1]`: the windows not over (all: every window, newest first),
  with the read token;
- `DELETE /api/v1/maintenance/{id}` (`{"by": WHO}` or `?by=WHO`): end it now (as making
  one). Who made or ended a window is kept with how they signed in (gateway/access.py).
"""

from __future__ import annotations

import re

from aiohttp import web

from trainsentry.gateway.absent import Off
from trainsentry.gateway.access import Actor
from trainsentry.gateway.acting import api_actor, named, refusal, window_target
from trainsentry.gateway.api.auth import authorized, error_response, read_token, unauthorized
from trainsentry.gateway.api.request_body import BodyRejected, read_json
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.gateway.stages.services.maintenance import (
    MAX_REQUEST_BYTES,
    MaintenanceService,
    WindowRejected,
)
from trainsentry.store.errors import STORE_FAILURES

MAINTENANCE_PATH = "/api/v1/maintenance"
_WINDOW_ID = re.compile(r"^mw-[0-9a-f]{1,32}$")


def _service(gateway: Gateway) -> MaintenanceService | web.Response:
    """The gateway's maintenance windows, or the 404 that says they are off."""
    service = gateway.maintenance
    if isinstance(service, Off):
        return error_response(404, "maintenance windows need the gateway's policy")
    return service


def _caller(request: web.Request) -> Actor | web.Response:
    """Who makes or ends a window (gateway/acting.py `api_actor`): the API token, or a person
    signed in through the trusted proxy; 403 when no API token is set."""
    gateway = request.app[GATEWAY_KEY]
    if gateway.settings.api_token is None:
        return error_response(403, "maintenance windows need TRAINSENTRY_API_TOKEN on the gateway")
    return api_actor(request, gateway, gateway.settings.api_token)


async def _json_body(request: web.Request) -> object:
    """The body (request_body.py: bounded, JSON, not nested deeply); refusals as HTTP errors."""
    try:
        return await read_json(request, MAX_REQUEST_BYTES)
    except BodyRejected as exc:
        if exc.status == 413:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_REQUEST_BYTES, actual_size=0) from None
        raise web.HTTPBadRequest(reason=exc.reason) from None


async def post_window(request: web.Request) -> web.Response:
    """Makes a window, by a caller allowed to act on the namespace it mutes (a window that
    names no namespace mutes every team's alerts: admins only). `created_by` is kept with
    how the caller signed in; a proxy's person is the proxy's name."""
    actor = _caller(request)
    if isinstance(actor, web.Response):
        return actor
    gateway = request.app[GATEWAY_KEY]
    service = _service(gateway)
    if isinstance(service, web.Response):
        return service
    try:
        body = await _json_body(request)
        if isinstance(body, dict) and actor.via != "api-token":
            body["created_by"] = actor.name
        asked = service.parse_request(body)
        assert isinstance(body, dict)  # parse_request refuses anything else
        actor = named(actor, asked.created_by.strip())
        if (refused := refusal(gateway, actor, window_target(asked))) is not None:
            return refused
        body["created_by"] = actor.audit_name
        window = await service.create(body)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"body larger than {MAX_REQUEST_BYTES} bytes")
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    except WindowRejected as exc:
        return error_response(400, str(exc))
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    return web.json_response(window, status=201)


async def get_windows(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    if not authorized(request, read_token(gateway.settings)):
        return unauthorized()
    service = _service(gateway)
    if isinstance(service, web.Response):
        return service
    include_past = request.query.get("all", "") in ("1", "true", "yes")
    try:
        items = await service.windows(include_past=include_past)
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    return web.json_response({"items": items})


async def delete_window(request: web.Request) -> web.Response:
    """Ends a window now, by a caller allowed to act on the namespace it mutes; `ended_by`
    is kept with how the caller signed in."""
    actor = _caller(request)
    if isinstance(actor, web.Response):
        return actor
    gateway = request.app[GATEWAY_KEY]
    service = _service(gateway)
    if isinstance(service, web.Response):
        return service
    window_id = request.match_info["window_id"]
    if not _WINDOW_ID.match(window_id):
        return error_response(400, "window id must look like mw-0123abcd")
    try:
        body = await _json_body(request)
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"body larger than {MAX_REQUEST_BYTES} bytes")
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    if actor.via == "api-token":
        by = body.get("by") if isinstance(body, dict) else None
        by = by if by is not None else request.query.get("by")
        if not isinstance(by, str) or not by.strip() or len(by) > 200:
            return error_response(
                400, "'by' (who ends the window) is required, up to 200 characters"
            )
        if (problem := text_problem(by)) is not None:
            return error_response(400, f"'by': {problem}")
        actor = named(actor, by.strip())
    try:
        found = await service.window(window_id)
        if found is None:
            return error_response(404, f"no maintenance window {window_id}")
        if (refused := refusal(gateway, actor, window_target(found, window_id))) is not None:
            return refused
        window = await service.end(window_id, actor.audit_name)
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    if window is None:
        return error_response(404, f"no maintenance window {window_id}")
    return web.json_response(window)


def add_maintenance_routes(app: web.Application) -> None:
    app.router.add_post(MAINTENANCE_PATH, post_window)
    app.router.add_get(MAINTENANCE_PATH, get_windows)
    app.router.add_delete(MAINTENANCE_PATH + "/{window_id}", delete_window)
