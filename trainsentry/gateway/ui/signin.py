"""Signing in to and out of the console, and who a request is from (auth.py) with the
store's say on sessions signed out.

- `GET /ui/login`: the form, with its own short-lived nonce cookie (login CSRF);
- `POST /ui/login`: the token and a name → a session cookie with a new session id;
- `POST /ui/logout`: the CSRF token and this site's origin, as every other form; the
  session's id is recorded as revoked in the store (store/console_sessions.py) until its
  cookie would have expired, so every copy of the cookie stops signing in, on every replica;
- `viewer_of`: the request's viewer, anonymous when its session was signed out.

A form that cannot be read or an Origin that is not a URL is a 400; a form over its size a
413.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from aiohttp import web

from trainsentry.credentials import secrets_equal
from trainsentry.gateway.api.auth import read_token
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.pages import CSRF_KEY, BadForm, now_of, read_form, render
from trainsentry.store.console_sessions import revoke_session, session_revoked

log = logging.getLogger("trainsentry.ui")

LOGIN_COOKIE = "ts_login"
MAX_LOGIN_FORM = 8192


async def viewer_of(request: web.Request) -> auth.Viewer:
    """Who the request is from; a signed-out session is nobody. The store is asked once per
    request that carries a session (one primary-key lookup)."""
    gateway = request.app[GATEWAY_KEY]
    who = auth.viewer(
        request, read_token(gateway.settings), gateway.settings.console, now_of(gateway)
    )
    if who.session is not None:
        async with gateway.engine.connect() as conn:
            if await session_revoked(conn, who.session.session_id):
                return auth.ANONYMOUS
    return who


def next_path(raw: str | None) -> str:
    """Only a path of the console (no other site, no `//host`)."""
    if raw and raw.startswith("/ui/") and not raw.startswith("//") and len(raw) <= 1000:
        return raw
    return "/ui/"


async def login_page(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    if read_token(gateway.settings) is None:
        raise web.HTTPSeeOther("/ui/")
    nonce = auth.new_nonce()
    request[CSRF_KEY] = nonce
    response = render(
        request, auth.ANONYMOUS, "login.html.j2", next=next_path(request.query.get("next")),
        failed=False,
    )  # fmt: skip
    auth.set_cookie(response, request, LOGIN_COOKIE, nonce, 600)
    return response


async def login_post(request: web.Request) -> web.StreamResponse:
    """The token and a name → the session cookie. The form carries the nonce of its own
    short-lived cookie (login CSRF), and its Origin must be this site."""
    gateway = request.app[GATEWAY_KEY]
    token = read_token(gateway.settings)
    if token is None:
        raise web.HTTPSeeOther("/ui/")
    who = auth.ANONYMOUS
    try:
        form = await read_form(request, MAX_LOGIN_FORM)
        same_origin = auth.same_origin(request)
    except web.HTTPRequestEntityTooLarge:
        return render(request, who, "error.html.j2", status=413, message="form too large")
    except (BadForm, auth.BadOrigin) as exc:
        return render(request, who, "error.html.j2", status=400, message=str(exc))
    nonce = auth.cookie(request, LOGIN_COOKIE)
    name = auth.clean_name(form.get("name", ""))
    presented = form.get("token", "").strip()
    target = next_path(form.get("next", ""))
    if not same_origin or not nonce or not secrets_equal(form.get("csrf", ""), nonce):
        return render(request, who, "error.html.j2", status=403,
                      message="the sign-in form expired: load it again")  # fmt: skip
    if name is None or not secrets_equal(presented, token.get_secret_value()):
        log.info("console sign-in refused from %s", request.remote)
        request[CSRF_KEY] = nonce
        return render(request, who, "login.html.j2", status=401, next=target, failed=True)
    hours = gateway.settings.console.session_hours
    expires = now_of(gateway) + timedelta(hours=hours)
    response = web.HTTPSeeOther(target)
    value = auth.sign_session(auth.signing_key(token), name, expires, auth.new_session_id())
    auth.set_cookie(response, request, auth.SESSION_COOKIE, value, int(hours * 3600))
    auth.set_cookie(response, request, auth.CSRF_COOKIE, auth.new_nonce(), None)
    response.del_cookie(LOGIN_COOKIE, path=auth.COOKIE_PATH)
    log.info("console sign-in name=%s from %s", name, request.remote)
    raise response


async def sign_out(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """After the form's checks (handlers.py): the session is revoked, the cookie dropped."""
    gateway = request.app[GATEWAY_KEY]
    if who.session is not None:
        async with gateway.engine.begin() as conn:
            await revoke_session(conn, who.session.session_id, who.session.expires, now_of(gateway))
        log.info("console sign-out name=%s from %s", who.name, request.remote)
    response = web.HTTPSeeOther("/ui/login")
    response.del_cookie(auth.SESSION_COOKIE, path=auth.COOKIE_PATH)
    raise response
