"""The on-call HTTP API (thin handlers over stages/services/oncall.py):

- `GET /api/v1/oncall[?schedule=NAME][&at=ISO8601]`: who is on call, shaped like
  `trainsentry oncall now --json` (one schedule), or `{"schedules": [...]}` (all);
- `GET /api/v1/oncall/{schedule}.ics[?days=60][&past_days=7][&key=KEY]`: the iCalendar feed;
- `GET /api/v1/oncall/feeds`: each schedule's subscription URL, with its key;
- `GET /api/v1/oncall/overrides[?schedule=NAME][&removed=true]`: run-time overrides and swaps;
- `POST /api/v1/oncall/overrides`: add one; `DELETE /api/v1/oncall/overrides/{id}`: remove one.

(`POST /api/v1/alerts/{id}/escalate`, "call the next step now", is ack.py's.)

Reads take the read token (as the read API, gateway/api/read.py); changes take it too (or a
person signed in through the trusted proxy: gateway/acting.py), are refused (403) when no
token is set, as acks are, and (403, with the reason) when the caller may not change the
schedule (gateway/access.py: a team's `schedules`); who changed it is kept with how they
signed in. The feed also opens with its schedule's
subscription key (`?key=`, oncall/ical.py `feed_key`: an HMAC of the schedule's name under
the read token, compared in constant time) for calendar apps, which cannot send a bearer
token; only an authenticated caller is shown a key (`/api/v1/oncall/feeds`), and no key is
ever logged (the gateway keeps no access log). Bad input is a 400 whose reason names the
field; a store that cannot be reached is a 503.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from trainsentry.credentials import secrets_equal
from trainsentry.gateway.absent import Off
from trainsentry.gateway.access import Actor
from trainsentry.gateway.acting import api_actor, authorize, named, schedule_target
from trainsentry.gateway.api.auth import authorized, error_response, read_token, unauthorized
from trainsentry.gateway.api.path_ids import id_problem, parse_id
from trainsentry.gateway.api.request_body import BodyRejected, read_json_object
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.gateway.stages.services.oncall import OncallService, UnknownSchedule
from trainsentry.oncall.config import OncallConfigError
from trainsentry.oncall.ical import feed_key
from trainsentry.oncall.schedule import wall_to_instant
from trainsentry.store.errors import STORE_FAILURES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_TEXT = 200
MAX_REASON = 1000
ACTOR = web.RequestKey("trainsentry_actor", Actor)  # a change's caller (set by `_guard`)


class _Bad(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _feed_name(request: web.Request) -> str:
    return request.match_info["schedule"].removesuffix(".ics")


def _key_opens(request: web.Request, token: SecretStr) -> bool:
    """The `key` given is the subscription key of the feed's schedule (constant time)."""
    expected = feed_key(token.get_secret_value(), _feed_name(request))
    return secrets_equal(request.query.get("key", ""), expected)


def _guard(*, change: bool, feed: bool = False) -> Callable[[Handler], Handler]:
    """The read token (a change is refused without one set), or for a `feed` the schedule's
    subscription key instead; 400/404 from `_Bad`, 503 when the store is unavailable."""

    def wrap(handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            gateway = request.app[GATEWAY_KEY]
            token = read_token(gateway.settings)
            if change:
                actor = api_actor(request, gateway, token)
                if isinstance(actor, web.Response):
                    return actor
                request[ACTOR] = actor
            elif feed and token is not None and "key" in request.query:
                if not _key_opens(request, token):
                    return error_response(
                        401, "wrong feed key (GET /api/v1/oncall/feeds gives the current one)"
                    )
            elif not authorized(request, token):
                return unauthorized()
            try:
                return await handler(request)
            except _Bad as exc:
                return error_response(exc.status, exc.reason)
            except UnknownSchedule as exc:
                return error_response(404 if "schedule" in request.match_info else 400, str(exc))
            except OncallConfigError as exc:
                return error_response(400, str(exc))
            except STORE_FAILURES as exc:
                return error_response(503, f"store unavailable, retry: {type(exc).__name__}")

        return guarded

    return wrap


def _service(request: web.Request) -> OncallService:
    oncall = request.app[GATEWAY_KEY].oncall
    if isinstance(oncall, Off):
        raise _Bad(404, "no on-call schedules: the gateway's configuration has no oncall: section")
    return oncall


def _text(value: Any, field: str, limit: int, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        raise _Bad(400, f"'{field}' must be a string of up to {limit} characters")
    if (problem := text_problem(value)) is not None:
        raise _Bad(400, f"'{field}': {problem}")
    return value.strip()


def _number(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name) or ""
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and low <= int(raw) <= high):
        raise _Bad(400, f"{name} must be a whole number from {low} to {high}")
    return int(raw)


async def _json_object(request: web.Request) -> dict[str, Any]:
    try:
        return await read_json_object(request)
    except BodyRejected as exc:
        raise _Bad(exc.status, exc.reason) from None


def _at(request: web.Request, oncall: OncallService, schedule: str | None) -> datetime | None:
    raw = request.query.get("at") or ""
    if not raw:
        return None
    try:
        at = datetime.fromisoformat(raw[:64])
    except ValueError:
        raise _Bad(400, "at must be an ISO 8601 date-time") from None
    if not 1900 <= at.year <= 8999:
        raise _Bad(400, "at must lie between the years 1900 and 8999")
    if at.tzinfo is not None:
        return at
    if schedule is None:
        raise _Bad(400, "at needs a UTC offset unless a schedule is given")
    return wall_to_instant(at, oncall.config.schedules[schedule].tz)


@_guard(change=False)
async def get_oncall(request: web.Request) -> web.StreamResponse:
    oncall = _service(request)
    name = request.query.get("schedule") or None
    if name is not None and name not in oncall.config.schedules:
        raise UnknownSchedule(f"schedule: no schedule {name[:64]!r}")
    answers = await oncall.who(name, _at(request, oncall, name))
    return web.json_response(answers[0] if name is not None else {"schedules": answers})


@_guard(change=False, feed=True)
async def get_feed(request: web.Request) -> web.StreamResponse:
    oncall = _service(request)
    if not request.match_info["schedule"].endswith(".ics"):
        raise _Bad(404, "not found: the feed is /api/v1/oncall/{schedule}.ics")
    name = _feed_name(request)
    ahead = timedelta(days=_number(request, "days", 60, 1, 366))
    past = timedelta(days=_number(request, "past_days", 7, 0, 366))
    body = await oncall.feed(name, past, ahead)
    return web.Response(
        body=body,
        content_type="text/calendar",
        charset="utf-8",
        headers={"Content-Disposition": f'inline; filename="{name}.ics"'},
    )


@_guard(change=False)
async def get_feeds(request: web.Request) -> web.StreamResponse:
    """Each schedule's subscription URL, for a calendar app: `path` (with `?key=` when the
    gateway has a read token) and `url` (the same on the host this request named)."""
    oncall = _service(request)
    token = read_token(request.app[GATEWAY_KEY].settings)
    origin = str(request.url.origin())
    feeds = []
    for name in sorted(oncall.config.schedules):
        path = f"/api/v1/oncall/{name}.ics"  # schedule names are URL-safe (config.py)
        if token is not None:
            path += f"?key={feed_key(token.get_secret_value(), name)}"
        feeds.append({"schedule": name, "path": path, "url": origin + path})
    return web.json_response({"feeds": feeds}, headers={"Cache-Control": "no-store"})


@_guard(change=False)
async def get_overrides(request: web.Request) -> web.StreamResponse:
    oncall = _service(request)
    removed = (request.query.get("removed") or "false").lower()
    if removed not in ("true", "false"):
        raise _Bad(400, "removed must be true or false")
    name = request.query.get("schedule") or None
    changes = await oncall.listed(name, removed == "true")
    return web.json_response({"items": [change.to_json() for change in changes]})


def _acting(request: web.Request, by: Any, schedule: str) -> Actor:
    """Who changes `schedule` (the guard's caller, named by `by` for the API token), when
    they may (gateway/acting.py); else _Bad(403) with the reason."""
    actor = request[ACTOR]
    if actor.via == "api-token":
        actor = named(actor, _text(by, "by", MAX_TEXT))
    decision = authorize(request.app[GATEWAY_KEY], actor, schedule_target(schedule))
    if not decision.allowed:
        raise _Bad(403, decision.reason)
    return actor


@_guard(change=True)
async def post_override(request: web.Request) -> web.StreamResponse:
    """{"schedule", "kind": "override"|"swap", "who", "replaces", "start", "end", "by",
    "reason"}: stored with who (and how they signed in) and when (201)."""
    oncall = _service(request)
    body = await _json_object(request)
    schedule = _text(body.pop("schedule", None), "schedule", 64)
    actor = _acting(request, body.pop("by", None), schedule)
    reason = _text(body.pop("reason", None), "reason", MAX_REASON, required=False)
    stored = await oncall.add(schedule, body, actor.audit_name, reason)
    return web.json_response(stored.to_json(), status=201)


@_guard(change=True)
async def delete_override(request: web.Request) -> web.StreamResponse:
    """Removes a stored override or swap: `by` in the body or the query (kept as the audit)."""
    oncall = _service(request)
    raw = request.match_info["change_id"]
    if (change_id := parse_id(raw)) is None:
        raise _Bad(400, id_problem("override"))
    body = await _json_object(request)
    schedule = await oncall.schedule_of(change_id)
    if schedule is None:
        raise _Bad(404, f"no override {raw} in force (never added, or removed already)")
    actor = _acting(request, body.get("by") or request.query.get("by"), schedule)
    removed = await oncall.remove(change_id, actor.audit_name)
    if removed is None:
        raise _Bad(404, f"no override {raw} in force (never added, or removed already)")
    return web.json_response(removed.to_json())


def add_oncall_routes(app: web.Application) -> None:
    app.router.add_get("/api/v1/oncall", get_oncall)
    app.router.add_get("/api/v1/oncall/overrides", get_overrides)
    app.router.add_get("/api/v1/oncall/feeds", get_feeds)
    app.router.add_post("/api/v1/oncall/overrides", post_override)
    app.router.add_delete("/api/v1/oncall/overrides/{change_id}", delete_override)
    app.router.add_get("/api/v1/oncall/{schedule}", get_feed)
