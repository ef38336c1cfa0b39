"""Simulated probes of a hung Megatron-layout job, serving what `probe/server.py` serves.

The layout: tensor parallel TP (8) within a node (one pod per TP group, LOCAL_RANK = TP
rank), pipeline parallel PP (16), data parallel DP = N / (TP * PP); Megatron's rank order
(tp fastest, then dp, then pp): rank = tp + TP * dp + TP * DP * pp. Process groups as torch
names them (global names "0", "1", ... in creation order: the world, the TP groups, the DP
groups, the PP groups, each with its description).

The hang: rank `culprit` never issues its DP gradient all_reduce. Its DP peers wait in it
(since t0); every TP group holding one of them waits for that member in the next step's TP
all_reduce (since t0 + 0.3 s); every other rank waits in its pipeline recv (since t0 + 0.6 s).

Each rank has its own address: pod p listens on 127.x.y.z (`pod_ip`), its ranks on
base_port + LOCAL_RANK, as the operator's endpoints say. Each answers:
- `/status`: the probe's JSON (`Probe.status`: process groups with last enqueued and
  completed, what is in flight) after `status_delay_s`;
- `/dump` (bearer token): a Flight Recorder dump in torch's `_dump_nccl_trace_json` format
  (version 2.10: pg_config with each group's ranks, pg_status by local pg_id, `entries` of
  the last `entries` collectives and p2p ops) after `dump_delay_s`;
- `/stack` (bearer token): the main thread's stack.
Triggers are posted as `probe/trigger.py` posts them (`post_triggers`).

A large job's probes can be served by several processes (`ProbeProcesses`, each a slice of
the pods): 16,384 listening sockets and their answers are too much for the process that
also posts the triggers (file limits; its answers wait behind the posts).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import multiprocessing
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from aiohttp import web

NS = 1_000_000_000
STEP_S = 0.5


@dataclass(frozen=True)
class Layout:
    world: int
    tp: int = 8
    pp: int = 16

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def rank(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tp * dp + self.tp * self.dp * pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        return rank % self.tp, rank // self.tp % self.dp, rank // (self.tp * self.dp)

    def tp_group(self, rank: int) -> str:
        _, dp, pp = self.coords(rank)
        return str(1 + dp + self.dp * pp)

    def dp_group(self, rank: int) -> str:
        tp, _, pp = self.coords(rank)
        return str(1 + self.dp * self.pp + tp + self.tp * pp)

    def pp_group(self, rank: int) -> str:
        tp, dp, _ = self.coords(rank)
        return str(1 + self.dp * self.pp + self.tp * self.pp + tp + self.tp * dp)

    def members(self, name: str) -> list[int]:
        n = int(name)
        if n == 0:
            return list(range(self.world))
        n -= 1
        if n < self.dp * self.pp:
            dp, pp = n % self.dp, n // self.dp
            return [self.rank(t, dp, pp) for t in range(self.tp)]
        n -= self.dp * self.pp
        if n < self.tp * self.pp:
            tp, pp = n % self.tp, n // self.tp
            return [self.rank(tp, d, pp) for d in range(self.dp)]
        n -= self.tp * self.pp
        tp, dp = n % self.tp, n // self.tp
        return [self.rank(tp, dp, p) for p in range(self.pp)]

    def groups_of(self, rank: int) -> list[tuple[str, str]]:
        return [
            ("0", "default_pg"),
            (self.tp_group(rank), "tp"),
            (self.dp_group(rank), "dp"),
            (self.pp_group(rank), "pp"),
        ]

    def pod(self, rank: int) -> int:
        return rank // self.tp


def pod_ip(pod: int) -> str:
    return f"127.{1 + pod // 65536}.{pod // 256 % 256}.{pod % 256}"


@dataclass(frozen=True)
class Wait:
    pg: str
    desc: str
    op: str
    seq: int
    since: float
    p2p: bool = False


@dataclass
class HungJob:
    """The job's state at the hang (module docstring)."""

    layout: Layout
    culprit: int
    t0: float
    namespace: str = "team-a"
    name: str = "gpt"
    entries: int = 2000
    dp_seq: int = 1000
    tp_seq: int = 4000
    pp_seq: int = 2000
    _stalled_tp: set[str] = field(default_factory=set)
    _dp_peers: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        group = set(self.layout.members(self.layout.dp_group(self.culprit)))
        self._dp_peers = group - {self.culprit}
        # the TP groups of the whole DP group: the culprit's TP peers wait for it as well
        self._stalled_tp = {self.layout.tp_group(m) for m in group}

    def waits(self, rank: int) -> list[Wait]:
        """The collectives `rank` waits in (none for the culprit)."""
        lay = self.layout
        if rank == self.culprit:
            return []
        if rank in self._dp_peers:
            return [Wait(lay.dp_group(rank), "dp", "all_reduce", self.dp_seq, self.t0)]
        if lay.tp_group(rank) in self._stalled_tp:
            return [Wait(lay.tp_group(rank), "tp", "all_reduce", self.tp_seq + 1, self.t0 + 0.3)]
        _, _, pp = lay.coords(rank)
        peer = lay.rank(rank % lay.tp, lay.coords(rank)[1], max(0, pp - 1))
        return [
            Wait(
                lay.pp_group(rank),
                "pp",
                f"recv {rank}<-{peer}",
                self.pp_seq + 1,
                self.t0 + 0.6,
                True,
            )
        ]

    def _seqs(self, rank: int) -> dict[str, tuple[int, int]]:
        """group -> (last enqueued, last completed) collective seq of `rank`."""
        lay = self.layout
        dp_done = self.dp_seq - 1 if rank in self._dp_peers or rank == self.culprit else self.dp_seq
        dp_enq = self.dp_seq if rank in self._dp_peers else dp_done
        tp_stalled = (
            lay.tp_group(rank) in self._stalled_tp
            and rank not in self._dp_peers
            and rank != self.culprit
        )
        tp_enq = self.tp_seq + 1 if tp_stalled else self.tp_seq
        return {
            "0": (10, 10),
            lay.tp_group(rank): (tp_enq, self.tp_seq),
            lay.dp_group(rank): (dp_enq, dp_done),
            lay.pp_group(rank): (-1, -1),
        }

    def status(self, rank: int, now: float) -> dict[str, Any]:
        lay = self.layout
        waits = {w.pg: w for w in self.waits(rank)}
        groups = {}
        for name, desc in lay.groups_of(rank):
            enq, done = self._seqs(rank)[name]
            wait = waits.get(name)
            groups[name] = {
                "pg_desc": desc,
                "backend": "nccl",
                "last_enqueued": enq,
                "last_started": enq,
                "last_completed": done,
                "seconds_since_last_completion": round(now - (wait.since if wait else now), 3),
                "stall_threshold_seconds": 20.0,
                "in_flight": None
                if wait is None
                else {
                    "op": wait.op,
                    "seq": wait.seq,
                    "state": "started",
                    "age_seconds": round(now - wait.since, 3),
                },
            }
        pod = lay.pod(rank)
        return {
            "rank": rank,
            "local_rank": rank % lay.tp,
            "world_size": lay.world,
            "node": f"gpu-{pod:05d}",
            "pod": f"{self.name}-w-{pod}",
            "trainingjob": self.name,
            "namespace": self.namespace,
            "pid": 1000 + rank % lay.tp,
            "host_ips": [pod_ip(pod)],
            "step": 400,
            "healthy": True,
            "error": "",
            "recorders": ["nccl"],
            "captured_at": round(now, 3),
            "process_groups": groups,
            "stalls": [],
            "phase": "",
        }

    def dump(self, rank: int, now: float) -> bytes:
        """torch's `_dump_nccl_trace_json` of `rank` at `now` (module docstring)."""
        lay = self.layout
        groups = lay.groups_of(rank)
        local = {name: i for i, (name, _) in enumerate(groups)}
        seqs = self._seqs(rank)
        waits = {w.pg: w for w in self.waits(rank)}
        records: list[dict[str, Any]] = []
        for entry in self._entries(rank, groups, seqs, waits, now):
            entry["record_id"] = len(records)
            records.append(entry)
        pg_config = {
            name: {"name": name, "desc": desc, "ranks": str(lay.members(name))}
            for name, desc in groups
        }
        pg_status = {
            str(local[name]): {
                "last_enqueued_collective": enq,
                "last_started_collective": enq,
                "last_completed_collective": done,
            }
            for name, (enq, done) in seqs.items()
        }
        doc = {
            "version": "2.10",
            "comm_lib_version": "2.27.5",
            "pg_config": pg_config,
            "pg_status": pg_status,
            "entries": records[-self.entries :],
            "nccl_comm_state": {},
        }
        return json.dumps(doc).encode()

    def _entries(
        self,
        rank: int,
        groups: list[tuple[str, str]],
        seqs: dict[str, tuple[int, int]],
        waits: dict[str, Wait],
        now: float,
    ) -> Iterator[dict[str, Any]]:
        """The last steps' collectives of `rank`, oldest first: per step two TP all_reduces,
        a pipeline recv and send, the DP all_reduce; then what it waits in."""
        lay = self.layout
        local = {name: i for i, (name, _) in enumerate(groups)}
        tp, dp, pp = lay.tp_group(rank), lay.dp_group(rank), lay.pp_group(rank)
        steps = self.entries // 5 + 1
        tp_seq = seqs[tp][1] - 2 * steps
        dp_seq = seqs[dp][1] - steps
        p2p = self.pp_seq - 2 * steps
        for step in range(steps):
            at = self.t0 - (steps - step) * STEP_S
            for pg, op, seq, is_p2p in (
                (tp, "all_reduce", tp_seq + 1, False),
                (pp, "send", p2p + 1, True),
                (tp, "all_reduce", tp_seq + 2, False),
                (pp, "recv", p2p + 2, True),
                (dp, "all_reduce", dp_seq + 1, False),
            ):
                yield _entry(pg, dict(groups)[pg], local[pg], op, seq, is_p2p, at, done=True)
            tp_seq, dp_seq, p2p = tp_seq + 2, dp_seq + 1, p2p + 2
        for wait in waits.values():
            yield _entry(
                wait.pg, wait.desc, local[wait.pg], wait.op, wait.seq, wait.p2p, wait.since, False
            )


def _entry(
    pg: str, desc: str, pg_id: int, op: str, seq: int, p2p: bool, at: float, done: bool
) -> dict[str, Any]:
    created = int(at * NS)
    return {
        "frames": [],
        "pg_id": pg_id,
        "process_group": [pg, desc],
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": created,
        "input_sizes": [[4096]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4096]],
        "output_dtypes": ["Float"],
        "state": "completed" if done else "started",
        "time_discovered_started_ns": created + 1000,
        "time_discovered_completed_ns": created + 2_000_000 if done else None,
        "retired": done,
        "timeout_ms": 600000,
        "is_p2p": p2p,
    }


# ------------------------------------------------------------------ serving


@dataclass
class Probes:
    """The job's simulated probes: one aiohttp runner, a site per rank (of `ranks`, else of
    every rank)."""

    job: HungJob
    token: str
    base_port: int
    status_delay_s: float = 0.003
    dump_delay_s: float = 0.050
    runner: web.AppRunner | None = None
    asked: list[tuple[str, int]] = field(default_factory=list)  # (path, rank), in order
    asked_at: list[float] = field(default_factory=list)  # when each of `asked` was asked
    ranks: Sequence[int] | None = None

    def _ask(self, path: str, rank: int) -> None:
        self.asked.append((path, rank))
        self.asked_at.append(time.time())

    def address(self, rank: int) -> tuple[str, int]:
        lay = self.job.layout
        return pod_ip(lay.pod(rank)), self.base_port + rank % lay.tp

    def endpoints(self) -> list[str]:
        return [f"{h}:{p}" for h, p in map(self.address, range(self.job.layout.world))]

    async def start(self) -> None:
        ranks = range(self.job.layout.world) if self.ranks is None else self.ranks
        by_address = {self.address(r): r for r in ranks}
        job = self.job

        def rank_of(request: web.Request) -> int:
            host, port = request.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
            return by_address[host, port]

        def headers(rank: int) -> dict[str, str]:
            pod = job.layout.pod(rank)
            return {
                "X-Trainsentry-Rank": str(rank),
                "X-Trainsentry-Local-Rank": str(rank % job.layout.tp),
                "X-Trainsentry-Pod": f"{job.name}-w-{pod}",
                "X-Trainsentry-Node": f"gpu-{pod:05d}",
            }

        def authorized(request: web.Request) -> bool:
            return request.headers.get("Authorization") == f"Bearer {self.token}"

        async def status(request: web.Request) -> web.Response:
            rank = rank_of(request)
            self._ask("status", rank)
            await asyncio.sleep(self.status_delay_s)
            return web.json_response(job.status(rank, time.time()), headers=headers(rank))

        async def dump(request: web.Request) -> web.Response:
            rank = rank_of(request)
            if not authorized(request):
                return web.Response(status=401)
            self._ask("dump", rank)
            await asyncio.sleep(self.dump_delay_s)
            captured = time.time_ns()
            body = await asyncio.to_thread(job.dump, rank, captured / NS)
            extra = {
                "X-Trainsentry-Captured-At-Ns": str(captured),
                "X-Trainsentry-Recorders": "nccl",
            }
            return web.Response(
                body=body, content_type="application/json", headers={**headers(rank), **extra}
            )

        async def stack(request: web.Request) -> web.Response:
            rank = rank_of(request)
            if not authorized(request):
                return web.Response(status=401)
            self._ask("stack", rank)
            frame = {
                "file": "pretrain_gpt.py",
                "line": 212,
                "function": "train_step",
                "code": "batch = next(data_iterator)",
            }
            thread = {"thread": "MainThread", "main": True, "frames": [frame]}
            pod = headers(rank)["X-Trainsentry-Pod"]
            body = {"rank": rank, "pod": pod, "phase": "", "threads": [thread]}
            return web.json_response(body, headers=headers(rank))

        app = web.Application()
        app.router.add_get("/status", status)
        app.router.add_get("/dump", dump)
        app.router.add_get("/stack", stack)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        for host, port in by_address:
            await web.TCPSite(self.runner, host, port, backlog=64).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _serve_slice(probes: Probes, conn: Connection) -> None:
    """A probe process (`ProbeProcesses`): serves `probes` until told to stop; takes the
    job's t0 when the parent sets it; posts its ranks' triggers when told the gateway
    ("post"), their log when asked ("triggers"); at the end, sends back what it was
    asked, with when."""

    async def serve() -> None:
        await probes.start()
        conn.send("ready")
        posting: asyncio.Future[TriggerLog] | None = None
        while True:
            message = await asyncio.to_thread(conn.recv)
            if message == "stop":
                break
            if message == "triggers":
                conn.send(await posting if posting is not None else TriggerLog())
            elif isinstance(message, tuple):  # ("post", host, port, token)
                _, host, port, token = message
                posting = asyncio.ensure_future(
                    post_triggers(probes.job, probes, (host, port), token, ranks=probes.ranks)
                )
            else:
                probes.job.t0 = float(message)
        await probes.stop()
        conn.send(list(zip(probes.asked_at, probes.asked, strict=True)))

    asyncio.run(serve())


@dataclass
class ProbeProcesses:
    """The job's probes served by `processes` processes, each the ranks of a slice of the
    pods (forked: the parent's job is theirs); `set_t0` moves the hang in all of them;
    `post` has each post its ranks' triggers (as a pod's probes post their own: no process
    holds more than its slice's connections), `triggers` their merged log once posted."""

    job: HungJob
    token: str
    base_port: int
    processes: int = 2
    asked: list[tuple[str, int]] = field(default_factory=list)  # after `stop`, in time order
    _children: list[tuple[Any, Connection]] = field(default_factory=list)

    def address(self, rank: int) -> tuple[str, int]:
        return Probes(self.job, self.token, self.base_port).address(rank)

    def endpoints(self) -> list[str]:
        return Probes(self.job, self.token, self.base_port).endpoints()

    async def start(self) -> None:
        context = multiprocessing.get_context("fork")
        lay, n = self.job.layout, max(1, self.processes)
        pods = lay.world // lay.tp
        for i in range(n):
            first, last = pods * i // n * lay.tp, pods * (i + 1) // n * lay.tp
            probes = Probes(self.job, self.token, self.base_port, ranks=range(first, last))
            parent, child = context.Pipe()
            process = context.Process(target=_serve_slice, args=(probes, child), daemon=True)
            process.start()
            self._children.append((process, parent))
        for _process, parent in self._children:
            if await asyncio.to_thread(parent.recv) != "ready":
                raise RuntimeError("a probe process did not start")

    def set_t0(self, t0: float) -> None:
        self.job.t0 = t0
        for _process, parent in self._children:
            parent.send(t0)

    def post(self, gateway: tuple[str, int], token: str) -> None:
        for _process, parent in self._children:
            parent.send(("post", *gateway, token))

    async def triggers(self) -> TriggerLog:
        for _process, parent in self._children:
            parent.send("triggers")
        return merged([await asyncio.to_thread(parent.recv) for _p, parent in self._children])

    async def stop(self) -> None:
        logs = []
        for process, parent in self._children:
            parent.send("stop")
            logs.append(await asyncio.to_thread(parent.recv))
            await asyncio.to_thread(process.join, 10)
        self._children.clear()
        self.asked = [asked for _at, asked in heapq.merge(*logs)]


# ------------------------------------------------------------------ triggers


@dataclass
class TriggerLog:
    posted: int = 0
    answers: dict[int, int] = field(default_factory=dict)  # status -> count
    errors: dict[str, int] = field(default_factory=dict)  # what failed a post (status 0)
    suppressed: int = 0
    first_crossing: float = 0.0
    first_answer: float = 0.0  # when the first and the last post were answered (unix s)
    last_answer: float = 0.0


async def post_trigger(
    host: str, port: int, source: str, token: str, body: bytes, timeout_s: float
) -> tuple[int, bytes]:
    """One POST as urllib sends it: a new connection from `source`, HTTP/1.1, closed after."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, local_addr=(source, 0)), timeout_s
    )
    try:
        head = (
            f"POST /api/v1/hang-triggers HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, answer.partition(b"\r\n\r\n")[2]


def trigger_body(
    job: HungJob, rank: int, wait: Wait, port: int, waited_s: float, threshold_s: float
) -> bytes:
    """What rank `rank`'s probe posts for `wait` (`Probe.trigger_body`), its group's member
    list included (the probe sends it with its first trigger of the group)."""
    lay = job.layout
    body: dict[str, Any] = {
        "namespace": job.namespace,
        "trainingjob": job.name,
        "rank": rank,
        "local_rank": rank % lay.tp,
        "port": port,
        "pod": f"{job.name}-w-{lay.pod(rank)}",
        "node": f"gpu-{lay.pod(rank):05d}",
        "world_size": lay.world,
        "since": round(wait.since, 3),
        "pg": wait.pg,
        "pg_desc": wait.desc,
        "seq": wait.seq,
        "op": wait.op,
        "state": "started",
        "waited_s": round(waited_s, 3),
        "threshold_s": threshold_s,
        "group_ranks": compact(lay.members(wait.pg)),
    }
    return json.dumps(body, sort_keys=True).encode()


async def post_triggers(
    job: HungJob,
    probes: Probes | ProbeProcesses,
    gateway: tuple[str, int],
    token: str,
    *,
    threshold_s: float = 20.0,
    poll_s: float = 2.0,
    jitter_s: float | None = None,
    attempts: int = 4,
    seed: int = 7,
    on_first: Callable[[float], None] | None = None,
    ranks: Sequence[int] | None = None,
) -> TriggerLog:
    """Every waiting rank (of `ranks`, else of the job) posts each stall the way
    `probe/trigger.py` does: detected at the first poll (every `poll_s`, a random phase per
    rank) past `threshold_s`, sent after up to `jitter_s` of jitter (None: the probe's,
    `trigger.spread_s` of the world size), up to `attempts` tries
    doubling from 1 s, 4xx other than 429 not retried, and no further stall triggers once
    the gateway said the hang is known. The phases and jitters are the same whichever
    `ranks` post (one draw per rank of the job)."""
    from trainsentry.probe.trigger import spread_s

    lay = job.layout
    log = TriggerLog()
    rng = random.Random(seed)
    jitter_s = spread_s(lay.world) if jitter_s is None else jitter_s
    log.first_crossing = min(
        (w.since + threshold_s for r in range(lay.world) for w in job.waits(r)), default=0.0
    )
    if on_first is not None:
        on_first(log.first_crossing)

    async def rank_posts(rank: int, phase: float, jitters: list[float]) -> None:
        known = False
        host, port = probes.address(rank)
        for wait, jitter in zip(job.waits(rank), jitters, strict=False):
            crossing = wait.since + threshold_s
            detected = crossing + (phase - crossing) % poll_s
            await asyncio.sleep(max(0.0, detected + jitter - time.time()))
            if known:
                log.suppressed += 1
                continue
            waited = time.time() - jitter - wait.since
            data = trigger_body(job, rank, wait, port, waited, threshold_s)
            delay = 1.0
            for attempt in range(attempts):
                try:
                    status, answer = await post_trigger(*gateway, host, token, data, 5.0)
                except (OSError, TimeoutError) as exc:
                    status, answer = 0, b""
                    what = f"{type(exc).__name__} {getattr(exc, 'errno', '') or ''}".strip()
                    log.errors[what] = log.errors.get(what, 0) + 1
                log.posted += 1
                log.answers[status] = log.answers.get(status, 0) + 1
                log.first_answer = log.first_answer or time.time()
                log.last_answer = time.time()
                if 200 <= status < 300:
                    known = b'"known"' in answer
                    break
                if 400 <= status < 500 and status != 429:
                    break
                if attempt + 1 < attempts:
                    await asyncio.sleep(delay)
                    delay *= 2

    tasks = []
    posting = set(range(lay.world) if ranks is None else ranks)
    for rank in range(lay.world):
        waits = job.waits(rank)
        if waits:
            phase = rng.uniform(0, poll_s)
            jitters = [rng.uniform(0, jitter_s) for _ in waits]
            if rank in posting:
                tasks.append(rank_posts(rank, phase, jitters))
    await asyncio.gather(*tasks)
    return log


def merged(logs: Sequence[TriggerLog]) -> TriggerLog:
    """Pure: the trigger logs of several posting processes as one."""
    out = TriggerLog(first_crossing=min((x.first_crossing for x in logs), default=0.0))
    for part in logs:
        out.posted += part.posted
        out.suppressed += part.suppressed
        for status, count in part.answers.items():
            out.answers[status] = out.answers.get(status, 0) + count
        for what, count in part.errors.items():
            out.errors[what] = out.errors.get(what, 0) + count
    answered = [x for x in logs if x.first_answer]
    out.first_answer = min((x.first_answer for x in answered), default=0.0)
    out.last_answer = max((x.last_answer for x in answered), default=0.0)
    return out


def compact(ranks: list[int]) -> str:
    """The probe's compact member list (`probe.trigger.compact_ranks`)."""
    from trainsentry.probe.trigger import compact_ranks

    return compact_ranks(ranks)


# ------------------------------------------------------------------ one run


@dataclass
class HangRun:
    """What one run measured (see `run_hang`)."""

    world: int
    culprit: int
    card_s: float  # first threshold crossing -> the card naming the culprit
    diagnoses_s: list[float]
    peak_rss: int
    triggers: TriggerLog
    asked: list[tuple[str, int]]
    card: dict[str, Any]
    cards: int
    located: list[str]  # the gateway's "diagnosis located" log lines, for failure messages


def peak_rss(pid: int) -> int:
    """A process's peak resident set (VmHWM), bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


async def run_hang(
    tmp: Any,
    layout: Layout,
    *,
    culprit: int,
    lead_s: float = 2.0,
    timeout_s: float = 90.0,
    entries: int = 2000,
    base_port: int = 19401,
    probe_processes: int = 0,
) -> HangRun:
    """A hung job against the real gateway (a subprocess: SQLite, the shipped diagnosis
    defaults, `static_endpoints` for every rank, a webhook channel): the first rank's wait
    crosses the 20 s threshold `lead_s` after the probes are up; returns when a card names
    the culprit (or raises after `timeout_s`). `probe_processes` > 0: the probes are
    served by that many processes (`ProbeProcesses`), else by this one."""
    import re

    import yaml

    from tests.support.gateway_process import start_gateway
    from tests.support.receiver import Receiver

    token = "bench-probe-token"
    job = HungJob(layout, culprit, t0=time.time() + lead_s - 20.0, entries=entries)
    probes: Probes | ProbeProcesses = Probes(job, job_token_of(token, job), base_port)
    if probe_processes > 0:
        probes = ProbeProcesses(job, job_token_of(token, job), base_port, probe_processes)
    receiver = Receiver()
    await receiver.start()
    await probes.start()
    config = tmp / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "webhooks": {"feishu": {"url": receiver.url}},
                "diagnosis": {
                    "static_endpoints": {f"{job.namespace}/{job.name}": probes.endpoints()}
                },
            }
        )
    )
    env = {"TRAINSENTRY_PROBE_TOKEN": token}
    gw = await asyncio.to_thread(
        start_gateway, tmp, f"sqlite:///{tmp / 'gw.db'}", token="bench-api", config=config, env=env
    )
    try:
        host, port = gw.address.rsplit(":", 1)
        t0 = time.time() + lead_s - 20.0  # the gateway took its time to start
        if isinstance(probes, ProbeProcesses):
            probes.set_t0(t0)
        job.t0 = t0
        if isinstance(probes, ProbeProcesses):
            probes.post((host, int(port)), token)
            posting = asyncio.ensure_future(probes.triggers())
        else:
            posting = asyncio.ensure_future(post_triggers(job, probes, (host, int(port)), token))
        pod = f"{job.name}-w-{layout.pod(culprit)}"
        wanted = f"rank {culprit} (pod {pod}"
        deadline = time.time() + timeout_s
        card: dict[str, Any] | None = None
        card_at = 0.0
        while card is None and time.time() < deadline:
            for arrived, body in zip(list(receiver.times), list(receiver.bodies), strict=False):
                payload = body.get("payload") or {}
                if wanted in str(payload.get("diagnosis", "")):
                    # when it reached the receiver, not when this loop (sharing its process
                    # with the triggers being posted) saw it
                    card, card_at = payload, time.time() - (time.monotonic() - arrived)
            await asyncio.sleep(0.02)
        triggers = await posting
        failure = ""
        if card is None:
            wall = time.time() - time.monotonic()
            arrivals = [round(wall + t - t0 - 20.0, 1) for t in receiver.times]
            failure = (
                f"no card naming rank {culprit} within {timeout_s:g} s (cards at {arrivals} s "
                f"after the first crossing; triggers answered {triggers.answers} "
                f"(failed: {triggers.errors}) from "
                f"{triggers.first_answer - t0 - 20:.1f} s to {triggers.last_answer - t0 - 20:.1f} s"
                f"): {receiver.bodies}\n{gw.logs()[-4000:]}"
            )
        peak = peak_rss(gw.process.pid)
        logs = gw.logs()
        elapsed = [
            float(x)
            for x in re.findall(
                r"diagnosis stored .* took_s=([0-9.]+)",
                logs,
            )
        ]
        located = re.findall(r"diagnosis located .*", logs)
    finally:
        await asyncio.to_thread(gw.stop)
        await probes.stop()
        await receiver.stop()
    if failure:  # with what the probes were asked (known once they have stopped)
        raise AssertionError(f"{failure}\nasked the probes: {probes.asked[:40]}")
    assert card is not None
    return HangRun(
        world=layout.world,
        culprit=culprit,
        card_s=card_at - triggers.first_crossing,
        diagnoses_s=elapsed,
        peak_rss=peak,
        triggers=triggers,
        asked=list(probes.asked),
        card=card,
        cards=len(receiver.bodies),
        located=located,
    )


def job_token_of(master: str, job: HungJob) -> str:
    from trainsentry.probe.token import job_token

    return job_token(master, job.namespace, job.name)
