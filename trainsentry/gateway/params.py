"""Query-string and path parameters of the read API: each bad one is a 400 naming it
(`web.HTTPBadRequest`), never a value the store could not take."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from trainsentry.alerts import MAX_ALERT_ID
from trainsentry.gateway.stages.intake import text_problem


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
    """The `{alert_id}` of the path: ids are 64-bit in the store (SQLite refuses more)."""
    raw = request.match_info["alert_id"]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and 0 < int(raw) <= MAX_ALERT_ID):
        raise web.HTTPBadRequest(reason=f"alert id must be an integer from 1 to {MAX_ALERT_ID}")
    return int(raw)
