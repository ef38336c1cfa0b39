"""The console's HTTP handlers (aiohttp): thin. Each reads the viewer (auth.py), reads the
store through store/console.py, builds a view (views.py, pure) and renders a template; the
actions go through actions.py (the incident pages and the bulk acks: incident_pages.py). A
bad query parameter is a 400 naming it, the store down a 503; the pages carry a strict
Content-Security-Policy (no inline script, nothing from another origin)."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web
from markupsafe import Markup

from trainsentry.gateway.absent import Off
from trainsentry.gateway.acting import alert_target, window_target
from trainsentry.gateway.api.auth import read_token
from trainsentry.gateway.api.path_ids import id_problem, parse_id
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.stages.planning.plan import FINGERPRINT_SCOPE, STORM_SCOPE
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.acting import acting, action_form
from trainsentry.gateway.ui.actions import ACTIONS, NOTICES, SILENCE_CHOICES, ActionRefused
from trainsentry.gateway.ui.feed import ChangeFeed, Marker
from trainsentry.gateway.ui.incident_views import with_incidents
from trainsentry.gateway.ui.model import Filters, NowView
from trainsentry.gateway.ui.ops_views import history
from trainsentry.gateway.ui.pages import CSRF_KEY, TEMPLATES_KEY, BadForm, headers
from trainsentry.gateway.ui.pages import now_of as _now
from trainsentry.gateway.ui.pages import render as _render
from trainsentry.gateway.ui.render_cache import RenderCache
from trainsentry.gateway.ui.signin import sign_out, viewer_of
from trainsentry.gateway.ui.views import (
    BadQuery,
    alert_view,
    job_view,
    now_view,
    on_call,
    parse_filters,
    schedules_on_call,
    text_param,
    windows,
)
from trainsentry.store import console as store
from trainsentry.store.console_incidents import (
    first_alerts,
    incident_summaries,
    incidents_of,
    resolved_incidents,
)
from trainsentry.store.errors import STORE_FAILURES
from trainsentry.store.maintenance_windows import mutes_of
from trainsentry.store.policy_state import load_states

log = logging.getLogger("trainsentry.ui")

FEED_KEY = web.AppKey("ui_feed", ChangeFeed)
WINDOW_ID = re.compile(r"^mw-[0-9a-f]{1,32}$")  # as `DELETE /api/v1/maintenance/{id}` checks
MAX_CARDS = 500  # open alerts drawn on the Now page, the most urgent (more: "and N more")
HISTORY_DAYS = (7, 14, 28, 56)
MAX_HISTORY = 200  # resolved incidents History lists, the newest
HISTORY_ALERTS = 10  # alerts drawn inside each (the most urgent, the newest)
KEEPALIVE_S = 15.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# The store failing, or a page's reads running out of time: the console answers 503.
_UNAVAILABLE: tuple[type[Exception], ...] = (*STORE_FAILURES, TimeoutError)


def page(*, fragment: bool = False) -> Callable[[Any], Handler]:
    """Wraps a console handler: the viewer (a sign-in page when one is needed), the CSRF
    nonce cookie, 400 for a bad parameter, 503 for the store, the security headers."""

    def wrap(
        handler: Callable[[web.Request, auth.Viewer], Awaitable[web.StreamResponse]],
    ) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            token = read_token(request.app[GATEWAY_KEY].settings)
            try:
                who = await viewer_of(request)
            except _UNAVAILABLE as exc:  # the session's check
                return _render(
                    request, auth.ANONYMOUS, "error.html.j2", status=503,
                    message=f"store unavailable, retry: {type(exc).__name__}",
                )  # fmt: skip
            if who.via == "none":
                if fragment:
                    return web.Response(status=401, text="sign in again")
                back = request.path_qs[:1000] if request.method == "GET" else "/ui/"
                target = "/ui/login?" + urlencode({"next": back})
                raise web.HTTPSeeOther(target)
            nonce = auth.cookie(request, auth.CSRF_COOKIE)
            fresh = token is not None and not nonce
            if fresh:
                nonce = auth.new_nonce()
            request[CSRF_KEY] = (
                auth.csrf_token(auth.signing_key(token), nonce) if token and nonce else ""
            )
            try:
                response = await handler(request, who)
            except (BadQuery, BadForm, auth.BadOrigin) as exc:
                response = _render(request, who, "error.html.j2", status=400, message=str(exc))
            except web.HTTPRequestEntityTooLarge:
                response = _render(
                    request, who, "error.html.j2", status=413, message="form too large"
                )
            except _UNAVAILABLE as exc:
                response = _render(
                    request, who, "error.html.j2", status=503,
                    message=f"store unavailable, retry: {type(exc).__name__}",
                )  # fmt: skip
            if fresh and nonce and not response.prepared:
                auth.set_cookie(response, request, auth.CSRF_COOKIE, nonce, None)
            return response

        return guarded

    return wrap


async def _marker(gateway: Gateway) -> Marker:
    async with gateway.engine.connect() as conn:
        return await store.change_marker(conn)


def marker_text(marker: Marker) -> str:
    return ".".join(str(part) for part in marker)


# Stands in the shared Now list for the viewer's CSRF token (its forms: the bulk acks),
# which each response puts in; random per process, so no label can spell it.
CSRF_SLOT = f"csrf-{secrets.token_hex(16)}"


@dataclass(frozen=True, slots=True)
class NowPart:
    """The Now page's alert list, drawn once and shared by every viewer of its filters
    (render_cache.py): the view (the filters' choices come from it) and its HTML."""

    view: NowView
    marker: str
    html: str  # _groups.html.j2 rendered (autoescaped) from `view`, CSRF_SLOT for the token

    def for_viewer(self, request: web.Request) -> str:
        """The HTML with the viewer's CSRF token in its forms."""
        return self.html.replace(CSRF_SLOT, request.get(CSRF_KEY, ""))


NOW_CACHE_KEY: web.AppKey[RenderCache[NowPart]] = web.AppKey("ui_now_cache")


async def now_part(request: web.Request, who: auth.Viewer) -> NowPart:
    """The alert list for the request's filters: the most urgent MAX_CARDS open alerts with
    the counts of all, built at most once a second per filter (the store read on the loop,
    the view and its HTML in a thread) and reused while the store's marker stands."""
    gateway = request.app[GATEWAY_KEY]
    filters = parse_filters(request.query)
    cache = request.app[NOW_CACHE_KEY]
    asked_at = cache.now()
    async with gateway.engine.connect() as conn:
        marker = await store.change_marker(conn)
    env = request.app[TEMPLATES_KEY]
    can_act = who.can_act and read_token(gateway.settings) is not None
    key = (*filters.query().items(), ("can_act", str(can_act)))
    return await cache.get(
        key, marker, lambda: _build_now(gateway, env, filters, can_act), asked_at
    )


async def _build_now(
    gateway: Gateway, env: jinja2.Environment, filters: Filters, can_act: bool
) -> NowPart:
    chosen = filters.priority, filters.namespace, filters.job, filters.component
    priority, namespace, job, component = (value or None for value in chosen)
    async with gateway.engine.connect() as conn:
        marker = marker_text(await store.change_marker(conn))
        rows = await store.open_alerts(
            conn, priority=priority, namespace=namespace, job=job, component=component,
            limit=MAX_CARDS,
        )  # fmt: skip
        counts = await store.open_counts(
            conn, priority=priority, namespace=namespace, job=job, component=component,
            jobs=[row.job for row in rows],
        )  # fmt: skip
        storms = await store.states_in_scope(conn, STORM_SCOPE)
        mutes = await mutes_of(conn, [row.id for row in rows])
        members = await incidents_of(conn, [row.id for row in rows])
        incidents = await incident_summaries(conn, members.values())
    now = _now(gateway)

    def draw() -> NowPart:
        view = now_view(rows, storms, filters, now, truncated=False, mutes=mutes, counts=counts)
        view = with_incidents(view, members, incidents, now)
        html = env.get_template("_groups.html.j2").render(
            view=view, marker=marker, csrf=CSRF_SLOT, can_act=can_act
        )
        return NowPart(view, marker, html)

    return await asyncio.to_thread(draw)


async def _on_call(gateway: Gateway) -> Any:
    """The `oncall:` schedules' answer (as GET /api/v1/oncall) where the gateway has any,
    else the inline escalation roster's layers."""
    oncall = gateway.oncall
    if not isinstance(oncall, Off) and oncall.schedule_names():
        return schedules_on_call(await oncall.who(None, None))
    return on_call(gateway.escalator, _now(gateway))


@page()
async def now_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    part = await now_part(request, who)
    gateway = request.app[GATEWAY_KEY]
    maintenance = gateway.maintenance
    found = None if isinstance(maintenance, Off) else windows(await maintenance.windows())
    view = replace(part.view, oncall=await _on_call(gateway), windows=found)
    return _render(
        request, who, "now.html.j2", view=view, marker=part.marker,
        groups=Markup(part.for_viewer(request)),  # the autoescaped _groups template's output
        notice=NOTICES.get(request.query.get("done", "")), can_end=_can_end(gateway),
    )  # fmt: skip


def _can_end(gateway: Gateway) -> bool:
    return not isinstance(gateway.maintenance, Off) and gateway.settings.api_token is not None


@page(fragment=True)
async def now_fragment(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    part = await now_part(request, who)
    response = web.Response(
        text=part.for_viewer(request), content_type="text/html", charset="utf-8"
    )
    headers(response)
    return response


def _alert_id(request: web.Request) -> int:
    alert_id = parse_id(request.match_info["alert_id"])
    if alert_id is None:
        raise BadQuery(id_problem("alert"))
    return alert_id


async def _alert(request: web.Request) -> tuple[Any, Marker] | None:
    gateway = request.app[GATEWAY_KEY]
    alert_id = _alert_id(request)
    async with gateway.engine.connect() as conn:
        marker = await store.change_marker(conn)
        found = await store.alert_detail(conn, alert_id)
        if found is None:
            return None
        fingerprint = found.alert.fingerprint
        states = await load_states(conn, FINGERPRINT_SCOPE, [fingerprint])
        mutes = await mutes_of(conn, [alert_id])
        incident = (await incidents_of(conn, [alert_id])).get(alert_id)
    view = alert_view(found, _now(gateway), states.get(fingerprint), mutes.get(alert_id))
    return replace(view, incident_id=incident), marker


def actions_of(gateway: Gateway) -> list[Any]:
    return [action for action in ACTIONS.values() if action.available(gateway)]


@page()
async def alert_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    found = await _alert(request)
    if found is None:
        return _render(request, who, "error.html.j2", status=404, message="no such alert")
    view, marker = found
    return _render(
        request, who, "alert.html.j2", view=view, marker=marker_text(marker),
        actions=actions_of(request.app[GATEWAY_KEY]), silence_choices=SILENCE_CHOICES,
        notice=NOTICES.get(request.query.get("done", "")),
    )  # fmt: skip


@page(fragment=True)
async def alert_fragment(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    found = await _alert(request)
    if found is None:
        return web.Response(status=404, text="no such alert")
    view, marker = found
    return _render(
        request, who, "_alert.html.j2", view=view, marker=marker_text(marker),
        actions=actions_of(request.app[GATEWAY_KEY]), silence_choices=SILENCE_CHOICES,
    )  # fmt: skip


@page()
async def post_action(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/alerts/{id}/{action}: an action of `ACTIONS` (actions.py) through the alert
    (it acts on the alert's incident, so the viewer must be allowed to act on that)."""
    gateway = request.app[GATEWAY_KEY]
    alert_id = _alert_id(request)
    done = await acting(request, who, lambda _form: alert_target(gateway, alert_id))
    if isinstance(done, web.Response):
        return done
    action = ACTIONS.get(request.match_info["action"])
    if action is None or not action.available(gateway):
        return _render(request, who, "error.html.j2", status=404, message="no such action")
    try:
        outcome = await action.run(gateway, alert_id, done.actor, done.fields)
    except ActionRefused as exc:
        return _render(request, who, "error.html.j2", status=exc.status, message=str(exc))
    if outcome is None:
        return _render(request, who, "error.html.j2", status=404, message="no such alert")
    log.info(
        "console action=%s alert_id=%d by=%s via=%s",
        action.name, alert_id, done.actor.name, done.actor.via,
    )  # fmt: skip
    query = urlencode({"done": outcome.notice})
    raise web.HTTPSeeOther(f"/ui/alerts/{alert_id}?{query}")


@page()
async def post_end_window(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/maintenance/{window_id}/end: ends a window through the service behind
    `DELETE /api/v1/maintenance/{id}` (who, how they signed in, and when kept), which needs
    the API token; the viewer must be allowed to act on the window's namespace."""
    gateway = request.app[GATEWAY_KEY]
    window_id = request.match_info["window_id"]
    service = gateway.maintenance

    async def target(_form: object) -> Any:
        if not WINDOW_ID.match(window_id):
            raise BadQuery("window id must look like mw-0123abcd")
        window = None if isinstance(service, Off) else await service.window(window_id)
        return None if window is None else window_target(window, window_id)

    if isinstance(service, Off) or gateway.settings.api_token is None:
        fields = await action_form(request, who)
        if isinstance(fields, web.Response):
            return fields
        return _render(
            request, who, "error.html.j2", status=403,
            message="ending a window needs maintenance windows and TRAINSENTRY_API_TOKEN",
        )  # fmt: skip
    done = await acting(request, who, target)
    if isinstance(done, web.Response):
        return done
    ended = await service.end(window_id, done.actor.audit_name)
    if ended is None:
        return _render(request, who, "error.html.j2", status=404, message="no such window")
    log.info(
        "console ended maintenance window=%s by=%s via=%s",
        window_id, done.actor.name, done.actor.via,
    )  # fmt: skip
    back = "/ui/silences?" if done.fields.get("from") == "silences" else "/ui/?"
    raise web.HTTPSeeOther(back + urlencode({"done": "window-ended"}))


@page()
async def history_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    search = text_param(request.query.get("q"), "q")
    days = _days(request)
    since = _now(gateway) - timedelta(days=days)
    async with gateway.engine.connect() as conn:
        found = await resolved_incidents(
            conn, since=since, search=search or None, limit=MAX_HISTORY
        )
        inside = await first_alerts(conn, [incident.id for incident in found], HISTORY_ALERTS)
    return _render(
        request, who, "history.html.j2", incidents=history(found, inside, _now(gateway)),
        q=search, days=days, choices=HISTORY_DAYS, limit=MAX_HISTORY,
    )  # fmt: skip


def _days(request: web.Request) -> int:
    raw = request.query.get("days") or "14"
    if not raw.isdigit() or int(raw) not in HISTORY_DAYS:
        raise BadQuery(f"days must be one of {', '.join(map(str, HISTORY_DAYS))}")
    return int(raw)


@page()
async def job_page(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    namespace = text_param(request.query.get("namespace"), "namespace")
    name = text_param(request.query.get("name"), "name")
    if not name:
        raise BadQuery("name (the training job) is required")
    days = _days(request)
    since = _now(gateway) - timedelta(days=days)
    async with gateway.engine.connect() as conn:
        rows = await store.job_alerts(conn, namespace, name, since=since, limit=5000)
    # the hardware and the counts from up to 5,000 alerts, in a thread; the newest drawn
    view = await asyncio.to_thread(job_view, namespace, name, rows, _now(gateway), days)
    return _render(
        request, who, "job.html.j2", view=replace(view, cards=view.cards[:MAX_CARDS]),
        total=len(view.cards), days=days, choices=HISTORY_DAYS,
    )  # fmt: skip


@page(fragment=True)
async def events(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """GET /ui/events?since=A.B.C: server-sent events, `change` whenever the store's change
    marker differs from the one the page was drawn at; a comment every 15 s keeps proxies
    from closing the stream."""
    feed = request.app[FEED_KEY]
    if feed.watchers >= feed.max_watchers:
        return web.Response(status=503, text="too many live views", headers={"Retry-After": "30"})
    seen = _parse_marker(request.query.get("since", ""))
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    async with feed.watch():
        try:
            await response.write(b"retry: 2000\n\n")
            while not feed.closed:
                marker = await feed.wait(seen, KEEPALIVE_S)
                if marker != seen and marker is not None:
                    seen = marker
                    await response.write(f"event: change\ndata: {marker_text(marker)}\n\n".encode())
                else:
                    await response.write(b": keepalive\n\n")
        except ConnectionError:  # the browser went away
            pass
    return response


def _parse_marker(raw: str) -> Marker | None:
    parts = raw.split(".")
    if len(raw) > 80 or len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


@page()
async def logout_post(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/logout: a form like the others (CSRF token, this site's origin); the session
    ends on the server (signin.py)."""
    fields = await action_form(request, who)
    if isinstance(fields, web.Response):
        return fields
    return await sign_out(request, who)
