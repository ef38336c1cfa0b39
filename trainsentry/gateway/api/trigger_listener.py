"""The probes' hang triggers on a port of their own (`gateway.trigger_listen`), served by a
child process of the gateway (api/trigger_process.py; issue 42: "other jobs' intake
unaffected").

On the gateway's port a 16,384-rank job's 25,000 triggers in 5 s share the one event loop
(and the one GIL) that stores, plans and sends every other team's alerts; a thread of the
gateway's own did not free that loop either (docs/benchmarks.md). The child answers a known
hang's triggers from its own memory, and the gateway sees only what needs the store or the
cluster API, plus the evidence in batches.

Invariants:
- The gateway keeps the truth: a trigger the child does not answer from memory is handed
  over the control socket (api/trigger_wire.py) and answered by `answer_trigger`, exactly
  as the gateway's port answers it; the answer carries what the child may answer from
  memory next: for how long the job's hang is known (`JobHangs.known_for`: the rest of the
  gateway's own window before it asks the store again) and, when asked, the job's rank
  hosts with their freshness (`TriggerSources.remembered`).
- A hang the gateway forgets (`JobHangs.on_forget`: the stall ended, the store has it no
  longer, evicted) is pushed to the child at once (`forget`), so it is not answered "known"
  after the gateway stopped knowing it; pushed rather than left to a short TTL because a
  TTL would make the child hand a flooding job's triggers over every TTL (the load this
  port exists to keep off the gateway), and the window (`known_s`) already bounds a push
  that is lost with a dying child.
- The triggers the child answered "known" arrive every ~50 ms (`noted`) and are noted as
  the hang's evidence (`JobHangs.noted`); the refusals it counted go to the receipts metric.
- The master probe token reaches the child over the control socket only (not argv, not the
  environment); neither side logs it.
- Started after the gateway's stages, stopped before them (assemble.py): `start` binds the
  port in the gateway (an address in use fails the gateway's start, saying which setting),
  starts the child and returns once it accepts; the gateway keeps the bound socket, so a
  restarted child takes the same port and no connection is refused meanwhile (they queue).
- A child that exits on its own is logged and started again after a backoff
  (`RESTART_AFTER_S`, doubling to `MAX_RESTART_AFTER_S`, back to the start after it ran a
  minute). `stop` sends SIGTERM (the child answers what is in flight, within `SHUTDOWN_S`),
  kills it after `KILL_AFTER_S`, and returns once it has exited. A gateway that dies
  closes the control socket: the child ends too (no orphan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from trainsentry.alerts import JobRef
from trainsentry.config import GatewaySettings
from trainsentry.gateway.absent import Off
from trainsentry.gateway.api.app import answer_trigger
from trainsentry.gateway.api.trigger_checks import triggers_off
from trainsentry.gateway.api.trigger_wire import (
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
    WireError,
    read_message,
    write_message,
)
from trainsentry.gateway.pipeline import Gateway, HangTriggers
from trainsentry.gateway.stages.hang.trigger import HangTrigger

log = logging.getLogger("trainsentry.gateway")

CHILD = "trainsentry.gateway.api.trigger_process"
#: How long the child answers the requests in flight once told to stop.
SHUTDOWN_S = 10.0
#: How long `stop` waits for the child before it kills it.
KILL_AFTER_S = SHUTDOWN_S + 5.0
#: How long a starting child may take to accept on the port.
READY_S = 60.0
RESTART_AFTER_S = 0.5
MAX_RESTART_AFTER_S = 30.0
_STEADY_S = 60.0  # a child that ran this long restarts after RESTART_AFTER_S again


class TriggerListener:
    """The trigger port and its child process (module invariants). `gateway`: the assembled
    gateway, read once its stages have started."""

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
        self._config = {
            "op": "config",
            "max_readers": max_readers,
            "body_timeout_s": body_timeout_s,
            "idle_timeout_s": idle_timeout_s,
            "backlog": backlog,
            "shutdown_s": SHUTDOWN_S,
        }
        self._backlog = backlog
        self._sock: socket.socket | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._serving: asyncio.Task[None] | None = None
        self._answering: set[asyncio.Task[None]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._unwatch: Callable[[], None] | None = None
        #: The port it listens on (the one given, or the one the kernel chose for 0).
        self.port: int | None = None
        #: How many times the child was started again after it exited on its own.
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        """The running child's process id."""
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Binds the port, starts the child; returns once it accepts there."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            sock = socket.create_server(
                (self._host, self._wanted_port), family=family, backlog=self._backlog
            )
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot listen on the trigger port {self._host}:{self._wanted_port} "
                f"(gateway.trigger_listen): {exc.strerror}",
            ) from exc
        self._sock = sock
        self.port = sock.getsockname()[1]
        hang = self._gateway().hang
        if isinstance(hang, HangTriggers):
            self._unwatch = hang.hangs.on_forget(self._push_forget)
        try:
            await self._spawn()
        except BaseException:
            await self._close()
            raise
        self._supervisor = asyncio.create_task(self._supervise())
        log.info("trigger listener started listen=%s:%d pid=%s", self._host, self.port, self.pid)

    async def stop(self) -> None:
        """SIGTERM to the child (kill after `KILL_AFTER_S`), then the port closed."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        await self._end_child()
        await self._close()

    async def _spawn(self) -> None:
        """A child on the bound port, its control socket served; returns once it accepts."""
        assert self._sock is not None
        ours, theirs = socket.socketpair()
        try:
            fds = (self._sock.fileno(), theirs.fileno())
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", CHILD, *map(str, fds), pass_fds=fds
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._process = process
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=MAX_MESSAGE_BYTES)
        self._writer = writer
        hang = self._gateway().hang
        master = hang.diagnoser.token if isinstance(hang, HangTriggers) else None
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        write_message(writer, self._config | {"master": master, "log_level": level})
        try:
            ready = await asyncio.wait_for(read_message(reader), READY_S)
        except (TimeoutError, WireError):
            ready = None
        if ready is None or ready.get("op") != "ready":
            await self._end_child()
            raise RuntimeError("the trigger listener's process did not start (see its log)")
        self._serving = asyncio.create_task(self._serve(reader, writer))

    async def _supervise(self) -> None:
        """Starts the child again whenever it exits on its own (module invariants)."""
        wait = RESTART_AFTER_S
        while True:
            assert self._process is not None
            started = time.monotonic()
            code = await self._process.wait()
            await self._end_serving()
            if time.monotonic() - started > _STEADY_S:
                wait = RESTART_AFTER_S
            log.error("trigger listener process exited code=%s, restarting in %.1f s", code, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, MAX_RESTART_AFTER_S)
            try:
                await self._spawn()
            except Exception:
                log.exception("trigger listener process did not start again")
                continue
            self.restarts += 1
            log.info("trigger listener restarted pid=%s", self.pid)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The child's messages, until it closes its socket."""
        try:
            while (message := await read_message(reader)) is not None:
                if message.get("op") == "hand":
                    task = asyncio.create_task(self._answer(message, writer))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                elif message.get("op") == "noted":
                    self._note(message)
        except WireError as exc:
            log.error("trigger listener process sent a bad message, ending it: %s", exc)
            if self._process is not None and self._process.returncode is None:
                self._process.kill()

    async def _answer(self, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        """A handed trigger answered as the gateway's port answers it (module invariants)."""
        gateway = self._gateway()
        hang = gateway.hang
        remote = message.get("remote")
        try:
            trigger = HangTrigger.model_validate(message["trigger"])
        except (KeyError, ValidationError):
            log.error("trigger listener process handed over no trigger")
            return
        job = JobRef(trigger.namespace, trigger.trainingjob)
        answer: dict[str, Any] = {
            "op": "answer",
            "id": message["id"],
            "job": [job.namespace, job.name],
        }
        if isinstance(hang, Off):
            response = triggers_off()
        else:
            response = await answer_trigger(gateway, hang, trigger, remote)
            answer["known_s"] = hang.hangs.known_for(job)
            hosts = hang.sources.remembered(job) if message.get("hosts") else None
            if hosts is not None:
                answer |= {"hosts": sorted(hosts[0]), "hosts_s": hosts[1]}
        assert isinstance(response.body, bytes)
        answer |= {
            "status": response.status,
            "body": response.body.decode(),
            "headers": {
                name: response.headers[name]
                for name in ("Content-Type", "Retry-After")
                if name in response.headers
            },
        }
        if not writer.is_closing():
            try:
                write_message(writer, answer)
            except WireError:  # too many hosts to send: the child hands their triggers over
                write_message(writer, {k: v for k, v in answer.items() if k != "hosts"})

    def _note(self, message: dict[str, Any]) -> None:
        """The child's "known" triggers as their hangs' evidence; its refusals counted."""
        gateway = self._gateway()
        hang = gateway.hang
        for label, count in dict(message.get("refused", {})).items():
            if label in ("unauthorized", "rejected"):
                gateway.metrics.receipts.labels(label).inc(int(count))
        if not isinstance(hang, HangTriggers):
            return
        for fields, remote in list(message.get("triggers", ()))[:MAX_BATCH]:
            # validated by the child; built without validating again (the gateway's CPU)
            hang.hangs.noted(HangTrigger.model_construct(**fields), remote)
        if message.get("dropped"):
            log.debug("trigger listener dropped %s known triggers' evidence", message["dropped"])

    def _push_forget(self, job: JobRef) -> None:
        """The job's hang left the gateway's memory: the child stops answering "known"."""
        writer = self._writer
        if writer is not None and not writer.is_closing():
            write_message(writer, {"op": "forget", "job": [job.namespace, job.name]})

    async def _end_child(self) -> None:
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), KILL_AFTER_S)
            except TimeoutError:
                log.error("trigger listener process did not stop, killing it")
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        await self._end_serving()

    async def _end_serving(self) -> None:
        """The exited child's control socket closed, the answers to it dropped."""
        for task in [*self._answering, *([self._serving] if self._serving else [])]:
            task.cancel()
        for task in [*self._answering, *([self._serving] if self._serving else [])]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._serving = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def _close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        await self._end_serving()
        if self._sock is not None:
            self._sock.close()
            self._sock = None


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


#: The app's trigger listener, where `gateway.trigger_listen` is set (its `port`, `pid`).
TRIGGER_LISTENER_KEY = web.AppKey("trigger_listener", TriggerListener)
