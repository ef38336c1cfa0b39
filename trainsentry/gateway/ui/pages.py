"""What every console handler shares: the templates, the security headers every page is
sent with, rendering a page, and reading a posted form (bounded, decoded, or a 400)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import jinja2
from aiohttp import web

from trainsentry.gateway.api.auth import read_token
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.ui import auth

TEMPLATES_KEY = web.AppKey("ui_templates", jinja2.Environment)
CSRF_KEY = web.RequestKey("ui_csrf", str)  # the CSRF token the page's forms carry
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
FORM_TIMEOUT_S = 10.0


class BadForm(ValueError):
    """A posted form that cannot be read (a 400 with this reason)."""


def now_of(gateway: Gateway) -> datetime:
    return gateway.clock()


def headers(response: web.StreamResponse) -> web.StreamResponse:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def render(
    request: web.Request, who: auth.Viewer, template: str, *, status: int = 200, **context: Any
) -> web.Response:
    env = request.app[TEMPLATES_KEY]
    gateway = request.app[GATEWAY_KEY]
    text = env.get_template(template).render(
        viewer=who,
        csrf=request.get(CSRF_KEY, ""),
        token_set=read_token(gateway.settings) is not None,
        now=now_of(gateway),
        **context,
    )
    response = web.Response(text=text, status=status, content_type="text/html", charset="utf-8")
    headers(response)
    return response


async def read_form(request: web.Request, max_bytes: int) -> dict[str, str]:
    """The posted form's fields: at most `max_bytes` (web.HTTPRequestEntityTooLarge), within
    FORM_TIMEOUT_S, `application/x-www-form-urlencoded` (what the console's forms send; no
    multipart parser to reach) decoded by its charset; BadForm when it cannot be read (another
    content type, an unknown charset, bytes that are not of it)."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=request.content_length)
    if request.content_type not in ("", "application/x-www-form-urlencoded"):
        raise BadForm("the form must be sent as application/x-www-form-urlencoded")
    try:
        form = await asyncio.wait_for(request.post(), FORM_TIMEOUT_S)
    except (LookupError, ValueError) as exc:  # an unknown charset, or bytes not of it
        raise BadForm(f"the form cannot be read: {type(exc).__name__}") from None
    return {k: v for k, v in form.items() if isinstance(v, str)}
