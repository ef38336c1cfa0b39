"""The probes' hang triggers on a port of their own (`gateway.trigger_listen`), served from a
thread with its own event loop (issue 42: "other jobs' intake unaffected").

On the gateway's port a 16,384-rank job's 25,000 triggers in 5 s shared the one event loop
that stores, plans and sends every other team's alerts: aiohttp's HTTP work alone (about
90 µs a post) kept that loop busy, and another team's card took about 2 s instead of 0.1 s
(docs/benchmarks.md). Here the triggers' HTTP runs on the listener's loop; the gateway's
loop sees only what needs the store or the cluster API.

Invariants:
- The same checks, answers and status codes as `POST /api/v1/hang-triggers` on the gateway's
  port (api/app.py `receive_hang_trigger`, which keeps taking triggers for probes that post
  there): the bearer token, the body's bounds (its own reader pool and deadline,
  api/limits.py), the schema, the job's token (`checked_trigger`), the sender's address.
- A trigger of a known hang from a remembered rank address is answered on the listener's
  loop from memory (`TriggerSources.cached`, `JobHangs.known`: thread-safe, the trigger noted
  as the hang's evidence under its lock), never waiting on the gateway's loop; a sender
  remembered as not one of the job's ranks is refused there too (403). One job's triggers
  take at most `TRIGGERS_PER_TURN` of each turn of the listener's loop (its own `LoopTurns`).
- Everything else (a job's first trigger, a sender whose job's ranks are not remembered, the
  end of a stall, a hang not checked against the store within its window) is handed to the
  gateway's loop (`answer_trigger`, exactly as the gateway's port answers it) and its answer
  awaited; a gateway loop that is gone answers 503 (the probe retries).
- Started after the gateway's stages, stopped before them (assemble.py): no trigger is
  handed to a stage that is not running. `start` binds the port in the caller (an address in
  use fails the gateway's start) and returns once the listener accepts; `stop` answers the
  requests in flight (at most `SHUTDOWN_S`) and returns once the thread has ended.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from aiohttp import web

from trainsentry.alerts import JobRef
from trainsentry.config import GatewaySettings
from trainsentry.gateway.absent import Off
from trainsentry.gateway.api.app import (
    HANG_TRIGGER_PATH,
    answer_trigger,
    checked_trigger,
    json_errors,
    known_answer,
    not_a_rank,
    triggers_off,
)
from trainsentry.gateway.api.auth import error_response
from trainsentry.gateway.api.limits import BodyLimits, ReaderPool, body_limits
from trainsentry.gateway.pipeline import Gateway
from trainsentry.gateway.stages.hang.trigger import MAX_TRIGGER_BYTES, LoopTurns

log = logging.getLogger("trainsentry.gateway")

#: How long `stop` lets the requests in flight finish before they are cancelled.
SHUTDOWN_S = 10.0
THREAD_NAME = "trainsentry-triggers"


class TriggerListener:
    """The trigger port (module invariants). `gateway`: the assembled gateway, read when a
    trigger arrives (the app's, once the stages have started)."""

    def __init__(
        self,
        host: str,
        port: int,
        gateway: Callable[[], Gateway],
        *,
        max_readers: int,
        body_timeout_s: float,
        idle_timeout_s: float,
        backlog: int,
    ) -> None:
        self._host = host
        self._wanted_port = port
        self._gateway = gateway
        self._limits = BodyLimits(
            read_timeout_s=body_timeout_s,
            max_readers=max_readers,
            max_body_bytes=MAX_TRIGGER_BYTES,
            pools=(ReaderPool(HANG_TRIGGER_PATH, max_readers),),
        )
        self._idle_timeout_s = idle_timeout_s
        self._backlog = backlog
        self._turns = LoopTurns()  # the listener loop's own: one job's flood, a few a turn
        self._thread: threading.Thread | None = None
        self._main: asyncio.AbstractEventLoop | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        #: The port it listens on (the one given, or the one the kernel chose for 0).
        self.port: int | None = None

    async def start(self) -> None:
        """Binds the port and serves it from the listener's thread; returns once it does."""
        self._main = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.create_server(
            (self._host, self._wanted_port), family=family, backlog=self._backlog
        )
        self.port = sock.getsockname()[1]
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(sock, ready),), name=THREAD_NAME, daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(ready)
        except BaseException:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
            raise
        log.info("trigger listener started listen=%s:%d", self._host, self.port)

    async def stop(self) -> None:
        """Stops accepting, answers what is in flight, and ends the thread."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        await asyncio.to_thread(thread.join)
        self._thread = None

    async def _serve(self, sock: socket.socket, ready: concurrent.futures.Future[None]) -> None:
        """The listener's thread: its event loop serves the trigger route until `stop`."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        app = web.Application(
            client_max_size=MAX_TRIGGER_BYTES, middlewares=[body_limits(self._limits), json_errors]
        )
        app.router.add_post(HANG_TRIGGER_PATH, self._receive)
        runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=self._idle_timeout_s,
            shutdown_timeout=SHUTDOWN_S,
        )
        try:
            await runner.setup()
            await web.SockSite(runner, sock, backlog=self._backlog).start()
        except BaseException as exc:
            sock.close()
            await runner.cleanup()
            ready.set_exception(exc)
            return
        ready.set_result(None)
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    async def _receive(self, request: web.Request) -> web.Response:
        """POST /api/v1/hang-triggers on the trigger port (module invariants)."""
        gateway = self._gateway()
        hang = gateway.hang
        if isinstance(hang, Off):
            return triggers_off()
        trigger = await checked_trigger(gateway, hang, request)
        if isinstance(trigger, web.Response):
            return trigger
        job = JobRef(trigger.namespace, trigger.trainingjob)
        allowed = hang.sources.cached(job, request.remote)
        if allowed is False:
            return not_a_rank(gateway, job, request.remote)
        if allowed:
            await self._turns.turn(job)
            if hang.hangs.known(trigger, request.remote):
                return known_answer()
        return await self._on_gateway_loop(answer_trigger(gateway, hang, trigger, request.remote))

    async def _on_gateway_loop(self, answer: Coroutine[Any, Any, web.Response]) -> web.Response:
        """`answer` run on the gateway's event loop; its response, once it has one."""
        assert self._main is not None  # set by `start`, before the thread runs
        try:
            handed = asyncio.run_coroutine_threadsafe(answer, self._main)
        except RuntimeError:  # the gateway's loop is closed: it is stopping
            answer.close()
            return error_response(503, "the gateway is stopping, retry")
        return await asyncio.wrap_future(handed)


def trigger_listener(
    settings: GatewaySettings, gateway: Callable[[], Gateway]
) -> TriggerListener | None:
    """The listener of `settings.trigger_listen` (None when unset), with the gateway's own
    bounds: the triggers' readers, the body deadline, the idle timeout, the listen queue."""
    address = settings.trigger_address
    if address is None:
        return None
    return TriggerListener(
        *address,
        gateway,
        max_readers=settings.max_trigger_readers,
        body_timeout_s=settings.body_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        backlog=settings.listen_backlog,
    )


@contextlib.asynccontextmanager
async def serving(listener: TriggerListener | None) -> AsyncIterator[None]:
    """`listener` started for the block and stopped after it (nothing without one)."""
    if listener is None:
        yield
        return
    await listener.start()
    try:
        yield
    finally:
        await listener.stop()


#: The app's trigger listener, where `gateway.trigger_listen` is set (its `port`).
TRIGGER_LISTENER_KEY = web.AppKey("trigger_listener", TriggerListener)
