"""Request-body limits of the gateway's HTTP surface, as one aiohttp middleware.

Every request that carries a body is bounded before any handler's own checks (the card
callback reads its body before it can authenticate it):
- a deadline for the whole body (`gateway.body_timeout_s`): a client that trickles its body
  gets 408 and its connection is closed, so slow or hostile clients cannot hold connections;
- at most `gateway.max_body_readers` requests receiving a body at once, and at most
  `gateway.max_body_bytes_in_flight` bytes of bodies (each counted at its Content-Length, a
  chunked one at `max_body_bytes`) held at once: more get 503 with `Retry-After` before
  their body is read (aiohttp then reads and drops it for at most 10 s, holding nothing);
- a path with a reader pool of its own (`ReaderPool`: the probes' hang triggers,
  `gateway.max_trigger_readers`) counts only against that pool: its requests never take
  the shared readers or bytes, nor wait on them (a 16,384-rank job's triggers cannot starve
  Alertmanager's webhooks, nor the webhooks its triggers); more than its `max_readers` at
  once get 503 with `Retry-After`;
- a response given before the body was read (401, 413) closes the connection instead of
  waiting for the rest of the body;
- a client that disconnects mid-body is a DEBUG line, not an ERROR traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

log = logging.getLogger("trainsentry.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ReaderPool:
    """Readers of their own for the requests to `path`. Its handler reads at most a small
    body (it caps its own read), so the pool holds at most `max_readers` of those bodies
    and is kept out of the shared bytes in flight."""

    path: str
    max_readers: int


@dataclass(frozen=True)
class BodyLimits:
    """Invariant: every body-carrying request ends within `read_timeout_s` of its handler
    starting unless its body has fully arrived by then."""

    read_timeout_s: float = 30.0
    max_readers: int = 256
    max_bytes_in_flight: int = 64 * 1024 * 1024
    max_body_bytes: int = 8 * 1024 * 1024  # what a body without Content-Length may reach
    pools: tuple[ReaderPool, ...] = ()


def _refused(status: int, reason: str, **headers: str) -> web.Response:
    response = web.json_response({"error": reason}, status=status, headers=headers)
    response.force_close()
    return response


async def _send_and_close(request: web.Request, response: web.StreamResponse) -> None:
    """Answers now and closes the connection: aiohttp would otherwise keep reading the rest
    of an unread body for its lingering time (10 s), at whatever pace the client sends it."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()


def body_limits(limits: BodyLimits) -> Middleware:
    """The middleware enforcing `limits`; outermost, so it sees every response."""
    readers = 0
    in_flight = 0  # bytes of the bodies being received or handled
    pools = {pool.path: pool for pool in limits.pools}
    pooled = dict.fromkeys(pools, 0)  # readers of each pool

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal readers, in_flight
        if not request.body_exists:
            return await handler(request)
        pool = pools.get(request.path)
        if pool is not None:
            if pooled[pool.path] >= pool.max_readers:
                return _refused(
                    503, "too many requests sending bodies, retry", **{"Retry-After": "1"}
                )
            pooled[pool.path] += 1
            try:
                return await _within_deadline(request, handler, limits.read_timeout_s)
            finally:
                pooled[pool.path] -= 1
        size = request.content_length
        # an oversized body is refused (413) by its handler before it is read: count it as
        # the most it could hold
        size = limits.max_body_bytes if size is None else min(size, limits.max_body_bytes)
        if readers >= limits.max_readers:
            return _refused(503, "too many requests sending bodies, retry", **{"Retry-After": "1"})
        if in_flight + size > limits.max_bytes_in_flight and in_flight > 0:
            log.info(
                "body refused, %d bytes of bodies in memory already: %s %s from %s",
                in_flight, request.method, request.path, request.remote,
            )  # fmt: skip
            return _refused(503, "too many bodies in memory, retry", **{"Retry-After": "1"})
        readers += 1
        in_flight += size
        try:
            return await _within_deadline(request, handler, limits.read_timeout_s)
        finally:
            readers -= 1
            in_flight -= size

    return middleware


async def _within_deadline(
    request: web.Request, handler: Handler, read_timeout_s: float
) -> web.StreamResponse:
    """The handler's response, or 408 (the connection closed) when the body has not fully
    arrived `read_timeout_s` after the handler started; 400 when the client went away. A
    body that has fully arrived when the handler starts (a small one, in the packet of its
    headers: a hang trigger) has no deadline to keep, and gets no timer."""
    if request.content.is_eof():
        try:
            return await handler(request)
        except ConnectionError as exc:
            return _went_away(request, exc)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(None) as scope:

            def expire_if_body_pending() -> None:
                if not request.content.is_eof():
                    scope.reschedule(loop.time())

            timer = loop.call_later(read_timeout_s, expire_if_body_pending)
            try:
                response = await handler(request)
            finally:
                timer.cancel()
    except TimeoutError:
        if not scope.expired():
            raise
        log.info(
            "request body not received within %.0f s, closed: %s %s from %s",
            read_timeout_s, request.method, request.path, request.remote,
        )  # fmt: skip
        response = _refused(408, f"request body not received within {read_timeout_s:g} s")
        await _send_and_close(request, response)
        return response
    except ConnectionError as exc:
        return _went_away(request, exc)
    if not request.content.is_eof() and not response.prepared:
        await _send_and_close(request, response)  # answered before the body was read
    return response


def _went_away(request: web.Request, exc: ConnectionError) -> web.Response:
    log.debug(
        "client went away mid-request: %s %s from %s (%s)",
        request.method, request.path, request.remote, type(exc).__name__,
    )  # fmt: skip
    return _refused(400, "connection lost")
