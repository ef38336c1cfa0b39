"""The trigger port's process (`python -m trainsentry.gateway.api.trigger_process LISTEN_FD
CONTROL_FD`), started and watched by the gateway (api/trigger_listener.py, the parent): it
serves `POST /api/v1/hang-triggers` on the listening socket the parent bound and answers a
known hang's triggers from its own memory, so a job's flood of triggers costs the gateway's
process (its event loop, its GIL) next to nothing (issue 42).

Invariants:
- The same checks, answers and status codes as the gateway's port (api/trigger_checks.py:
  bearer token, the job's token derived from the master token, body bounds with its own
  reader pool and deadline, schema); a refusal is the gateway port's byte for byte.
- Answered here, from memory only: a stall trigger of a job whose hang the parent said is
  known, within the seconds it said (`known_s`: what is left of the gateway's own window
  before it asks the store again, `JobHangs.known_for`), from a sender among the job's rank
  hosts the parent sent, within their freshness (`TriggerSources.remembered`); a sender not
  among those fresh hosts is refused (403) here. One job's triggers take at most
  `TRIGGERS_PER_TURN` of each turn of this loop (`LoopTurns`).
- A hang the parent forgets (its stall ended, the store has it no longer, evicted) is
  pushed here (`forget`) and is not answered "known" after that message; the `known_s`
  window bounds what a lost push could cost (the parent's own memory has the same bound).
- Everything else (a job's first trigger, a stale or missing host list, a stall's end, a
  hang past its window) is handed to the parent (`hand`), which answers it as its own port
  does (`answer_trigger`); no answer within `HAND_TIMEOUT_S`, or no parent: 503 (the probe
  retries).
- The triggers answered "known" are sent to the parent every `BATCH_S` (at most `MAX_BATCH`
  a message; beyond, or while the parent does not read, they are dropped and counted), with
  the refusals counted here: the diagnosis reads them from the gateway's `JobHangs`.
- It runs at a lower CPU priority than the gateway (`NICENESS`): a flood of triggers waits
  for the CPU behind every other team's alerts, not the other way round.
- It ends when the parent says so (SIGTERM: the requests in flight are answered within the
  configured shutdown time) or when the parent is gone (the control socket closes): never
  an orphan. SIGINT is the parent's to handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter, OrderedDict
from typing import Any

from aiohttp import web

from trainsentry.alerts import JobRef
from trainsentry.gateway.api.auth import error_response, json_errors
from trainsentry.gateway.api.limits import BodyLimits, ReaderPool, body_limits
from trainsentry.gateway.api.trigger_checks import (
    HANG_TRIGGER_PATH,
    checked_trigger,
    known_answer,
    not_a_rank,
    triggers_off,
)
from trainsentry.gateway.api.trigger_wire import (
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
    job_of,
    read_message,
    write_message,
)
from trainsentry.gateway.stages.hang.trigger import MAX_TRIGGER_BYTES, HangTrigger, LoopTurns

log = logging.getLogger("trainsentry.gateway.triggers")

#: How often the triggers answered "known" go to the parent.
BATCH_S = 0.05
#: How long a handed trigger waits for the parent's answer.
HAND_TIMEOUT_S = 30.0
#: Jobs remembered (their hang, their hosts), least recently used forgotten first.
REMEMBERED = 4096
#: The child's niceness above the gateway's: under a flood the gateway's own work (every
#: other team's alerts) gets the CPU first, the flood's "known" answers what is left.
NICENESS = 5


class Memory:
    """What the child answers from: each job's known hang and rank hosts, each with the
    monotonic time it stops being trusted (module invariants)."""

    def __init__(self) -> None:
        self._known: OrderedDict[JobRef, float] = OrderedDict()
        self._hosts: OrderedDict[JobRef, tuple[float, frozenset[str]]] = OrderedDict()

    def allowed(self, job: JobRef, remote: str | None) -> bool | None:
        """Whether `remote` is one of the job's rank hosts; None: not known fresh here."""
        held = self._hosts.get(job)
        if held is None or time.monotonic() > held[0]:
            return None
        return remote is not None and remote in held[1]

    def known(self, job: JobRef) -> bool:
        until = self._known.get(job)
        return until is not None and time.monotonic() <= until

    def learn(self, job: JobRef, answer: dict[str, Any]) -> None:
        """What a parent's `answer` says of the job now."""
        now = time.monotonic()
        known_s = answer.get("known_s")
        if known_s is None:
            self._known.pop(job, None)
        else:
            _put(self._known, job, now + float(known_s))
        if answer.get("hosts") is not None:
            hosts = frozenset(str(h) for h in answer["hosts"])
            _put(self._hosts, job, (now + float(answer["hosts_s"]), hosts))

    def forget(self, job: JobRef) -> None:
        self._known.pop(job, None)


def _put(memory: OrderedDict[JobRef, Any], job: JobRef, value: Any) -> None:
    memory[job] = value
    memory.move_to_end(job)
    while len(memory) > REMEMBERED:
        memory.popitem(last=False)


class Child:
    """The trigger port's handler and its side of the control socket (module invariants)."""

    def __init__(self, master: str | None, writer: asyncio.StreamWriter) -> None:
        self._master = master
        self._writer = writer
        self._memory = Memory()
        self._turns = LoopTurns()
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._asking: set[JobRef] = set()  # jobs whose hosts a handed trigger asks for
        self._noted: list[tuple[dict[str, Any], str | None]] = []
        self._dropped = 0
        self._refused: Counter[str] = Counter()
        self._parent = True  # the control socket is open

    def count(self, label: str) -> None:
        self._refused[label] += 1

    async def receive(self, request: web.Request) -> web.Response:
        """POST /api/v1/hang-triggers (module invariants)."""
        if self._master is None:
            return triggers_off()
        trigger = await checked_trigger(self._master, request, self.count)
        if isinstance(trigger, web.Response):
            return trigger
        job = JobRef(trigger.namespace, trigger.trainingjob)
        allowed = self._memory.allowed(job, request.remote)
        if allowed is False:
            return not_a_rank(job, request.remote, self.count)
        if allowed and not trigger.resolved:
            await self._turns.turn(job)
            if self._memory.known(job):
                self._note(trigger, request.remote)
                return known_answer()
        return await self._hand(job, trigger, request.remote)

    def _note(self, trigger: HangTrigger, remote: str | None) -> None:
        if len(self._noted) >= MAX_BATCH:
            self._dropped += 1
            return
        self._noted.append((trigger.model_dump(exclude_defaults=True), remote))

    async def _hand(self, job: JobRef, trigger: HangTrigger, remote: str | None) -> web.Response:
        """The parent's answer to `trigger`, and what it says of the job remembered."""
        if not self._parent:
            return error_response(503, "the gateway is stopping, retry")
        ask = self._memory.allowed(job, remote) is None and job not in self._asking
        if ask:
            self._asking.add(job)
        number = next(self._ids)
        answered = self._waiting[number] = asyncio.get_running_loop().create_future()
        try:
            message = {"op": "hand", "id": number, "remote": remote, "hosts": ask}
            write_message(self._writer, message | {"trigger": trigger.model_dump(mode="json")})
            answer = await asyncio.wait_for(answered, HAND_TIMEOUT_S)
        except (TimeoutError, ConnectionError):
            return error_response(503, "the gateway did not answer in time, retry")
        finally:
            self._waiting.pop(number, None)
            if ask:
                self._asking.discard(job)
        if answer.get("op") != "answer":  # the parent went away meanwhile
            return error_response(503, "the gateway is stopping, retry")
        self._memory.learn(job, answer)
        body = str(answer["body"]).encode()
        return web.Response(status=int(answer["status"]), body=body, headers=answer["headers"])

    async def read(self, reader: asyncio.StreamReader) -> None:
        """The parent's messages, until it closes the socket (then every waiting hand-over
        is answered 503)."""
        try:
            while (message := await read_message(reader)) is not None:
                if message["op"] == "answer":
                    waiting = self._waiting.get(int(message["id"]))
                    if waiting is not None and not waiting.done():
                        waiting.set_result(message)
                elif message["op"] == "forget":
                    self._memory.forget(JobRef(*job_of(message)))
        finally:
            self._parent = False
            for waiting in self._waiting.values():
                if not waiting.done():
                    waiting.set_result({"op": "gone"})

    def flush(self) -> None:
        """The triggers answered "known" and the refusals counted since the last flush, to
        the parent; dropped (counted) while the parent does not read them."""
        if not (self._noted or self._dropped or self._refused) or not self._parent:
            return
        noted, self._noted = self._noted, []
        if self._writer.transport.get_write_buffer_size() > MAX_MESSAGE_BYTES:
            self._dropped += len(noted)
            return
        message = {"op": "noted", "triggers": noted, "dropped": self._dropped}
        write_message(self._writer, message | {"refused": dict(self._refused)})
        self._dropped = 0
        self._refused.clear()

    async def flushing(self) -> None:
        while True:
            await asyncio.sleep(BATCH_S)
            self.flush()


async def serve(listen_fd: int, control_fd: int) -> None:
    """Serves the trigger port until SIGTERM or until the parent is gone."""
    control = socket.socket(fileno=control_fd)
    reader, writer = await asyncio.open_unix_connection(sock=control, limit=MAX_MESSAGE_BYTES)
    config = await read_message(reader)
    if config is None or config.get("op") != "config":
        return
    from trainsentry.logs import configure_logging

    configure_logging(str(config["log_level"]))
    child = Child(config["master"], writer)
    limits = BodyLimits(
        read_timeout_s=float(config["body_timeout_s"]),
        max_readers=int(config["max_readers"]),
        max_body_bytes=MAX_TRIGGER_BYTES,
        pools=(ReaderPool(HANG_TRIGGER_PATH, int(config["max_readers"])),),
    )
    app = web.Application(
        client_max_size=MAX_TRIGGER_BYTES, middlewares=[body_limits(limits), json_errors]
    )
    app.router.add_post(HANG_TRIGGER_PATH, child.receive)
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=float(config["idle_timeout_s"]),
        shutdown_timeout=float(config["shutdown_s"]),
    )
    await runner.setup()
    listening = socket.socket(fileno=listen_fd)
    await web.SockSite(runner, listening, backlog=int(config["backlog"])).start()
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    reading = asyncio.create_task(child.read(reader))
    reading.add_done_callback(lambda _: stopping.set())  # the parent is gone: end too
    flushing = asyncio.create_task(child.flushing())
    write_message(writer, {"op": "ready"})
    await writer.drain()
    try:
        await stopping.wait()
    finally:
        await runner.cleanup()  # the requests in flight answered (handed ones: by the parent)
        flushing.cancel()
        child.flush()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.drain(), 2.0)
        reading.cancel()
        writer.close()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the gateway: it stops us
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    listen_fd, control_fd = int(argv[0]), int(argv[1])
    asyncio.run(serve(listen_fd, control_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
