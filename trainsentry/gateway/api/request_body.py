"""Reading a request's body: the one home for the gateway's JSON endpoints (acks, escalate,
overrides, re-sends, maintenance windows, uncordon) and for the bounded read of the bodies
the webhook and the hang triggers parse themselves.

- A body is read up to `max_bytes`: one over it is refused (413) at its Content-Length
  before anything is read, or as soon as the bytes read pass the bound (a chunked body).
  The deadline for the whole body is the body-limits middleware's (limits.py).
- JSON: UTF-8 only, no NaN or Infinity, at most `MAX_DEPTH` levels (handlers, validators
  and the store walk what they get recursively; an API request needs a handful). The
  parser's own recursion bound (the interpreter's, about 1,000 levels) is a refusal too.
  Text is kept as sent, lone surrogates included, so that the handler's own check names the
  field holding one (stages/intake.py `text_problem`).
- An empty body reads as `{}` (every endpoint that reads one has its fields optional or
  given in the query too); `read_json_object` also wants a JSON object.

Every refusal is `BodyRejected` with the status and a reason safe to return to the caller;
bad input raises nothing else.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

MAX_JSON_BYTES = 64 * 1024  # an API request body: a maintenance window, 1,000 ids to re-send
MAX_DEPTH = 32


class BodyRejected(ValueError):
    """The body is refused: answer `status` with `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The whole body, at most `max_bytes` (BodyRejected 413 beyond)."""
    too_large = BodyRejected(413, f"body larger than {max_bytes} bytes")
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(max_bytes + 1 - size):
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _depth_problem(value: object) -> str | None:
    """Pure: why `value` is nested too deeply, or None. Iterative: no recursion to exhaust."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            return f"JSON nested at most {MAX_DEPTH} levels"
        stack.extend((child, depth + 1) for child in children)
    return None


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> object:
    raise _NotJson(f"body must be JSON: {name} is not a JSON value")


def parse_json(raw: bytes) -> object:
    """Pure: the JSON document in `raw` (`{}` for an empty or blank body), or BodyRejected
    (400) saying what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyRejected(
            400, f"body is not UTF-8 JSON: {exc.reason} at byte {exc.start}"
        ) from None
    if not text.strip():
        return {}
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        reason = f"body must be JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise BodyRejected(400, reason) from None
    except _NotJson as exc:
        raise BodyRejected(400, str(exc)) from None
    except RecursionError:  # raised cleanly by the parser at its recursion bound
        raise BodyRejected(400, f"body must be JSON nested at most {MAX_DEPTH} levels") from None
    if (problem := _depth_problem(value)) is not None:
        raise BodyRejected(400, f"body must be {problem}")
    return value


async def read_json(request: web.Request, max_bytes: int = MAX_JSON_BYTES) -> object:
    """The request's JSON body (see the module's docstring)."""
    return parse_json(await read_body(request, max_bytes))


async def read_json_object(request: web.Request, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """The request's JSON body, which must be an object (BodyRejected 400 otherwise)."""
    body = await read_json(request, max_bytes)
    if not isinstance(body, dict):
        raise BodyRejected(400, "body must be a JSON object")
    return body
