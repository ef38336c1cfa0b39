"""The read API (`GET /api/v1/alerts`, `/api/v1/alerts/{id}`, `/api/v1/notifications`):
an alert shows `muted_by`, the maintenance window that held its notices back (or null);
bounded query parameters (a value the store could never hold is a 400 naming it, the same
on both backends), the read token, 503 when the store is unavailable. The notifications
also answer a person through the trusted proxy, for an alert of their teams' incidents
(`get_notifications`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from trainsentry.gateway.access import Target
from trainsentry.gateway.acting import alert_target, outbox_target, refusal
from trainsentry.gateway.api.auth import (
    authorized,
    error_response,
    proxy_actor,
    read_token,
    unauthorized,
)
from trainsentry.gateway.api.path_ids import id_problem, parse_id
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.store.errors import STORE_FAILURES
from trainsentry.store.maintenance_windows import mutes_of
from trainsentry.store.queries import get_alert, list_alerts, list_notifications


def query_int(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > 40:  # int() of a long digit string is slow, or refused past 4,300 digits
        raise web.HTTPBadRequest(reason=f"{name} must be between {lo} and {hi}")
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(reason=f"{name} must be an integer") from None
    if not lo <= value <= hi:
        raise web.HTTPBadRequest(reason=f"{name} must be between {lo} and {hi}")
    return value


def query_choice(request: web.Request, name: str, choices: Sequence[str]) -> str | None:
    value = request.query.get(name) or None
    if value is not None and value not in choices:
        raise web.HTTPBadRequest(reason=f"{name} must be one of {', '.join(choices)}")
    return value


def query_text(request: web.Request, name: str) -> str | None:
    """A free-text filter: one the store could never hold (NUL, a lone surrogate) is a 400,
    the same on both backends, not a 503 from PostgreSQL."""
    value = request.query.get(name) or None
    if value is None:
        return None
    if len(value) > 1024:
        raise web.HTTPBadRequest(reason=f"{name} is longer than 1024 characters")
    if (problem := text_problem(value)) is not None:
        raise web.HTTPBadRequest(reason=f"{name}: {problem}")
    return value


def path_alert_id(request: web.Request) -> int:
    """The `{alert_id}` of the path (path_ids.py); 400 for anything else."""
    alert_id = parse_id(request.match_info["alert_id"])
    if alert_id is None:
        raise web.HTTPBadRequest(reason=id_problem("alert"))
    return alert_id


def read_guard(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """The read token, then `answering`."""
    answered = answering(handler)

    async def guarded(request: web.Request) -> web.StreamResponse:
        if not authorized(request, read_token(request.app[GATEWAY_KEY].settings)):
            return unauthorized()
        return await answered(request)

    return guarded


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def answering(handler: Handler) -> Handler:
    """A bad parameter answered 400 with its reason, a store that cannot be reached 503."""

    async def answered(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPBadRequest as exc:
            return error_response(400, exc.reason)
        except STORE_FAILURES as exc:
            return error_response(503, f"store unavailable, retry: {type(exc).__name__}")

    return answered


@read_guard
async def get_alerts(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    status = query_choice(request, "status", ("firing", "resolved"))
    priority = query_choice(request, "priority", ("P0", "P1", "P2", "P3"))
    limit = query_int(request, "limit", 100, 1, 1000)
    before = query_int(request, "before", None, 1, 2**62)
    async with gateway.engine.connect() as conn:
        page = await list_alerts(
            conn,
            status=status,
            priority=priority,
            job=query_text(request, "job"),
            limit=limit or 100,
            before=before,
        )
        mutes = await mutes_of(conn, [item["id"] for item in page.items])
    for item in page.items:
        item["muted_by"] = mutes.get(item["id"])
    return web.json_response({"items": page.items, "next_before": page.next_before})


@read_guard
async def get_alert_detail(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    alert_id = path_alert_id(request)
    async with gateway.engine.connect() as conn:
        item = await get_alert(conn, alert_id)
        if item is not None:  # which maintenance window muted it, if one did
            item["muted_by"] = (await mutes_of(conn, [alert_id])).get(alert_id)
    if item is None:
        return error_response(404, f"no alert {alert_id}")
    return web.json_response(item)


async def get_notifications(request: web.Request) -> web.StreamResponse:
    """The read token lists every notification; a person through the trusted proxy
    (gateway/acting.py) lists those of one alert of their teams' incidents (`alert_id`;
    without it the list spans every team: admins), else 403 with the reason."""
    gateway = request.app[GATEWAY_KEY]
    if authorized(request, read_token(gateway.settings)):
        return await _notifications(request)
    person = proxy_actor(request, gateway.settings.console)
    if person is None:
        return unauthorized()
    try:
        alert_id = query_int(request, "alert_id", None, 1, 2**62)
        if alert_id is None:
            target: Target | None = outbox_target("every team's notifications (give alert_id)")
        else:
            target = await alert_target(gateway, alert_id)
    except web.HTTPBadRequest as exc:
        return error_response(400, exc.reason)
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    if target is None:
        return error_response(404, f"no alert {alert_id}")
    if (refused := refusal(gateway, person, target)) is not None:
        return refused
    return await _notifications(request)


@answering
async def _notifications(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    status = query_choice(request, "status", ("pending", "sending", "sent", "dead", "cancelled"))
    limit = query_int(request, "limit", 100, 1, 1000)
    before = query_int(request, "before", None, 1, 2**62)
    alert_id = query_int(request, "alert_id", None, 1, 2**62)
    async with gateway.engine.connect() as conn:
        page = await list_notifications(
            conn,
            channel=query_text(request, "channel"),
            status=status,
            alert_id=alert_id,
            limit=limit or 100,
            before=before,
        )
    return web.json_response({"items": page.items, "next_before": page.next_before})
