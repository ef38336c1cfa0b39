"""The hang page at the scale it exists for: 1,024 to 16,384 simulated ranks, the real gateway.

Each run: simulated probes (tests/support/megatron_probes.py) serving exactly what
`probe/server.py` serves (`/status`; `/dump` in torch's `_dump_nccl_trace_json` format,
2,000 entries, answered after 3 ms + 50 ms; `/stack`), each rank on its own address (pod
IPs 127.x.y.z, port 29401 + LOCAL_RANK); a Megatron layout (TP 8 within a node, PP 16,
DP = N / 128); one rank never issues its DP all_reduce and the rest block behind it. Every
waiting rank posts its stall as `probe/trigger.py` does (20 s threshold, 2 s polls with a
random phase, the probe's jitter (`trigger.spread_s`: 1 s, or 1 s per 1,000 ranks), 4
tries, stopping once told the hang is known). The real
gateway runs as a subprocess with the shipped defaults (SQLite, hold 6 s, deadline 4 s,
concurrency 32, `static_endpoints` for every rank) and a webhook channel.

Measured: from the first rank's threshold crossing to the card naming the culprit (its
pod and node), every diagnosis's time (from its start to its verdict stored: the gateway's
`diagnosis stored ... took_s` lines), the
gateway's peak RSS (VmHWM), the triggers posted and how they were answered, and what was
asked of the probes (`/status`, dumps, stacks). `--runs 3` prints each run and the
medians.

`--flood N`: the trigger endpoint alone under N posts within `--within` seconds (the
issue's 25,000 in 5 s: a 16,384-rank job's ranks all post within one poll interval), from
the job's ranks' addresses, each retried as the probe retries (4 tries, 1 s doubling; no
stop on "known", so the rate holds), posted by `--posters` processes; meanwhile another
team's P0 webhook is posted and its answer timed. Measured: every try's status, the time
until the last post was accepted, the answers' latency, the CPU per post of the gateway
and of its child processes (its trigger port's), its peak RSS, and the kernel's
listen-queue overflows during the run (system-wide).
`--pool N`: the posts go over N kept-alive connections instead (a pod's ranks on their
pod's connection, from its address), so the gateway's work per trigger is measured rather
than the TCP handshake's; the other team's card is timed too (a webhook channel), and the
triggers answered while its webhook waited counted. The gateway runs with its trigger port
(`gateway.trigger_listen`: a child process, api/trigger_listener.py) and the posts go there (`--to
triggers`, the default), or to the gateway's own port (`--to main`: the baseline, as a
probe pointed at the gateway's port posts), or to a bare handler in a process of its own
beside the gateway (`--to beside`: the floor of a listener process, evidence hand-over
aside). `--bare`: a bare aiohttp handler instead of the gateway (the floor). `--profile
FILE`: the gateway runs under cProfile.

    .venv/bin/python -m bench.bench_hang_scale [--ranks 1024 4096 16384] [--runs 3]
    .venv/bin/python -m bench.bench_hang_scale --flood 25000 --within 5 --ranks 16384
    .venv/bin/python -m bench.bench_hang_scale --flood 25000 --within 5 --ranks 16384 --pool 256
    .venv/bin/python -m bench.bench_hang_scale --flood 25000 --within 5 --ranks 16384 --pool 256 \
        --to main

16,384 ranks need 16,384 listening sockets and as many trigger connections: the bench
raises its file limit (and the gateway's, which inherits it) to 65,536 where it may, else
to the hard limit, and above 1,024 ranks serves the probes from `--probe-processes`
processes (default 4), each a slice of the pods posting its own ranks' triggers (as a
pod's probes do): none holds more than its slice's sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.process_stats import children_cpu_seconds, cpu_seconds
from tests.support.megatron_probes import (
    HangRun,
    HungJob,
    Layout,
    Probes,
    peak_rss,
    pod_ip,
    post_trigger,
    run_hang,
    trigger_body,
)

FILES = 65_536
BASE_PORT = 29401  # not the e2e test's (19401): both may run at once on a shared machine
TOKEN = "bench-probe-token"


def raise_file_limit(wanted: int = FILES) -> int:
    """The soft (and, where allowed, hard) RLIMIT_NOFILE raised to `wanted`; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), max(hard, wanted)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def culprit_of(layout: Layout) -> int:
    """A rank in the middle of the job (not rank 0, not a stage's first)."""
    return layout.rank(5, layout.dp // 2, layout.pp // 2)


def report(run: HangRun) -> dict[str, object]:
    asked = {
        kind: sum(1 for k, _ in run.asked if k == kind) for kind in ("status", "dump", "stack")
    }
    return {
        "ranks": run.world,
        "culprit": run.culprit,
        "card_s": round(run.card_s, 1),
        "named": run.card.get("culprit_ranks"),
        "diagnosis": run.card.get("diagnosis"),
        "diagnoses_s": [round(x, 2) for x in run.diagnoses_s],
        "gateway_peak_rss_mb": round(run.peak_rss / 2**20),
        "triggers_posted": run.triggers.posted,
        "trigger_answers": run.triggers.answers,
        "trigger_errors": run.triggers.errors,
        "triggers_suppressed": run.triggers.suppressed,
        # the triggers' answers, from the first threshold crossing
        "triggers_answered_s": [
            round(run.triggers.first_answer - run.triggers.first_crossing, 1),
            round(run.triggers.last_answer - run.triggers.first_crossing, 1),
        ],
        "asked": asked,
        "cards": run.cards,
        "located": run.located[:3],
    }


async def one(
    world: int, entries: int, processes: int, keep: Path | None = None
) -> dict[str, object]:
    """One run's report; a run whose card never named the culprit says so (and why).
    `keep`: the run's folder (the gateway's log and database) is made there and kept."""
    if keep is not None:
        folder = Path(tempfile.mkdtemp(prefix=f"run-{world}-", dir=keep))
        return await _one_in(folder, world, entries, processes)
    with tempfile.TemporaryDirectory(prefix="bench-hang-scale-") as scratch:
        return await _one_in(Path(scratch), world, entries, processes)


async def _one_in(folder: Path, world: int, entries: int, processes: int) -> dict[str, object]:
    layout = Layout(world, tp=8, pp=16)
    try:
        run = await run_hang(
            folder,
            layout,
            culprit=culprit_of(layout),
            lead_s=3.0,
            entries=entries,
            probe_processes=processes,
            base_port=BASE_PORT,
        )
    except AssertionError as exc:
        print(str(exc)[-6000:], file=sys.stderr)
        said = [
            line[:600] for line in str(exc).splitlines() if "diagnos" in line or "asked" in line
        ]
        return {"ranks": world, "culprit": culprit_of(layout), "named": None, "why": said}
    return report(run)


def medians(runs: list[dict[str, Any]]) -> dict[str, object]:
    """The medians of the card time, slowest diagnosis and peak RSS of the runs that named
    the culprit, and how many did."""
    named = [r for r in runs if r["named"] == [r["culprit"]]]
    if not named:
        return {"ranks": runs[0]["ranks"], "runs": len(runs), "named_in": 0}
    return {
        "ranks": runs[0]["ranks"],
        "runs": len(runs),
        "named_in": len(named),
        "card_s_median": statistics.median(r["card_s"] for r in named),
        "card_s": [r["card_s"] for r in named],
        "diagnosis_s_median": statistics.median(max(r["diagnoses_s"] or [0.0]) for r in named),
        "rss_mb_median": statistics.median(r["gateway_peak_rss_mb"] for r in named),
        "rss_mb": [r["gateway_peak_rss_mb"] for r in named],
    }


# ------------------------------------------------------------------ the trigger flood


def _posts(layout: Layout, count: int, start: float, within_s: float) -> list[tuple[Any, ...]]:
    """`count` triggers of the job's waiting ranks, each (when, source, body), in time
    order: rank i % N's stall, a later collective of its group for each round past the
    first (a new key)."""
    job = HungJob(layout, culprit_of(layout), t0=start - 20.0)
    waiting = [r for r in range(layout.world) if job.waits(r)]
    rng = random.Random(7)
    posts = []
    for i in range(count):
        rank = waiting[i % len(waiting)]
        wait = job.waits(rank)[0]
        wait = dataclasses.replace(wait, seq=wait.seq + i // len(waiting))
        port = BASE_PORT + rank % layout.tp
        body = trigger_body(job, rank, wait, port, 21.0, 20.0)
        posts.append((start + rng.uniform(0, within_s), pod_ip(layout.pod(rank)), body))
    return sorted(posts, key=lambda post: post[0])


def _poster(gateway: tuple[str, int], posts: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """One poster process: each post at its time, retried as the probe retries; per post
    (its time, when its last try was answered, final status, tries, every try's status)."""

    async def post(at: float, source: str, body: bytes) -> tuple[Any, ...]:
        await asyncio.sleep(max(0.0, at - time.time()))
        statuses, delay = [], 1.0
        for attempt in range(4):
            try:
                status, _ = await post_trigger(*gateway, source, TOKEN, body, 5.0)
            except TimeoutError:
                status = -1
            except OSError:
                status = 0
            statuses.append(status)
            if 200 <= status < 300 or (400 <= status < 500 and status != 429):
                break
            if attempt < 3:
                await asyncio.sleep(delay)
                delay *= 2
        return at, time.time(), statuses[-1], statuses

    async def main() -> list[tuple[Any, ...]]:
        return list(await asyncio.gather(*(post(*p) for p in posts)))

    raise_file_limit()
    return asyncio.run(main())


async def _keepalive_post(
    streams: list[Any], gateway: tuple[str, int], source: str, body: bytes, timeout_s: float
) -> int:
    """One POST of a trigger on the connection held in `streams` (opened from `source` when
    there is none, dropped when the gateway closes it): its status (-1: timed out, 0: the
    connection failed)."""
    host, port = gateway
    try:
        if not streams:
            streams[:] = await asyncio.wait_for(
                asyncio.open_connection(host, port, local_addr=(source, 0)), timeout_s
            )
        reader, writer = streams
        head = (
            f"POST /api/v1/hang-triggers HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        headers = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        fields = dict(
            line.split(": ", 1) for line in headers.decode().split("\r\n")[1:] if ": " in line
        )
        fields = {name.lower(): value for name, value in fields.items()}
        await asyncio.wait_for(reader.readexactly(int(fields.get("content-length", 0))), timeout_s)
        if fields.get("connection", "").lower() == "close":
            writer.close()
            streams.clear()
        return int(headers.split(b" ", 2)[1])
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        status = 0
    except TimeoutError:
        status = -1
    if streams:
        streams[1].close()
        streams.clear()
    return status


def _pooled_poster(
    gateway: tuple[str, int], connections: list[list[tuple[Any, ...]]]
) -> list[tuple[Any, ...]]:
    """One poster process holding one kept-alive connection per item of `connections` (the
    posts it carries, in time order, from the first post's source address): each post at
    its time (or as soon as the connection is free), retried on it as the probe retries;
    per post as `_poster`."""

    async def connection(posts: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        streams: list[Any] = []
        source = posts[0][1]
        done = []
        for at, _, body in posts:
            await asyncio.sleep(max(0.0, at - time.time()))
            statuses, delay = [], 1.0
            for attempt in range(4):
                statuses.append(await _keepalive_post(streams, gateway, source, body, 5.0))
                status = statuses[-1]
                if 200 <= status < 300 or (400 <= status < 500 and status != 429):
                    break
                if attempt < 3:
                    await asyncio.sleep(delay)
                    delay *= 2
            done.append((at, time.time(), statuses[-1], statuses))
        if streams:
            streams[1].close()
        return done

    async def main() -> list[tuple[Any, ...]]:
        answered = await asyncio.gather(*(connection(posts) for posts in connections if posts))
        return [post for one in answered for post in one]

    raise_file_limit()
    return asyncio.run(main())


def _shares(
    posts: list[tuple[Any, ...]], posters: int, pool: int
) -> list[list[list[tuple[Any, ...]]]] | list[list[tuple[Any, ...]]]:
    """Pure: the posts each poster process sends: every `posters`-th post (pool 0: one new
    connection per post), or `pool` connections dealt round robin over the posters, each
    carrying the posts of its sources (a pod's ranks post on their pod's connection)."""
    if pool <= 0:
        return [posts[i::posters] for i in range(posters)]
    sources = sorted({source for _, source, _ in posts})
    lane = {source: i % pool for i, source in enumerate(sources)}
    connections: list[list[tuple[Any, ...]]] = [[] for _ in range(pool)]
    for post in posts:
        connections[lane[post[1]]].append(post)
    return [connections[i::posters] for i in range(posters)]


def _listen_overflows() -> int:
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        row = dict(zip(names.split(), values.split(), strict=True))
        if "ListenOverflows" in row:
            return int(row["ListenOverflows"])
    return 0


async def flood(
    world: int,
    count: int,
    within_s: float,
    posters: int,
    pool: int = 0,
    profile: Path | None = None,
    bare: bool = False,
    to: str = "triggers",
    posters_nice: int = 0,
) -> dict[str, object]:
    """The trigger endpoint under `count` posts within `within_s` (module docstring);
    `pool` > 0: over that many kept-alive connections; `profile`: the gateway runs under
    cProfile, its stats written there when it stops; `bare`: a bare aiohttp handler
    instead of the gateway (the floor: HTTP alone), without the other team's webhook;
    `to`: "triggers" posts to the gateway's trigger port, "main" to its own port, "beside"
    to a bare handler in a process of its own next to the gateway (the floor of a trigger
    listener in its own process: the gateway then sees none of the flood)."""
    import yaml

    from tests.support.gateway_process import start_gateway
    from tests.support.receiver import Receiver
    from tests.support.webhook_factory import encode, make_alert, make_body

    layout = Layout(world, tp=8, pp=16)
    endpoints = Probes(HungJob(layout, 0, 0.0), "", BASE_PORT).endpoints()  # nothing listens
    receiver = Receiver()
    await receiver.start()
    with tempfile.TemporaryDirectory(prefix="bench-hang-flood-") as folder:
        tmp = Path(folder)
        config = tmp / "gateway.yaml"
        trigger_port = free_port()
        config.write_text(
            yaml.safe_dump(
                {
                    "gateway": {"trigger_listen": f"127.0.0.1:{trigger_port}"},
                    "webhooks": {"feishu": {"url": receiver.url}},
                    "diagnosis": {"static_endpoints": {"team-a/gpt": endpoints}},
                }
            )
        )
        if bare:
            gw = await asyncio.to_thread(start_bare, tmp)
        else:
            gw = await asyncio.to_thread(
                start_gateway,
                tmp,
                f"sqlite:///{tmp / 'gw.db'}",
                token="bench-api",
                config=config,
                env={"TRAINSENTRY_PROBE_TOKEN": TOKEN},
                python_args=("-m", "cProfile", "-o", str(profile)) if profile else (),
            )
        beside = None
        if to == "beside" and not bare:
            (tmp / "beside").mkdir()
            beside = await asyncio.to_thread(start_bare, tmp / "beside")
        try:
            await asyncio.sleep(3.0)  # the analyzer's import (warm_up) is over
            host, port = gw.address.rsplit(":", 1)
            if to == "triggers" and not bare:
                port = str(trigger_port)
            if beside is not None:
                host, port = beside.address.rsplit(":", 1)
            start = time.time() + 3.0
            posts = _posts(layout, count, start, within_s)
            shares = _shares(posts, posters, pool)
            poster = _pooled_poster if pool > 0 else _poster
            cpu, overflows = cpu_seconds(gw.process.pid), _listen_overflows()
            child_cpu = children_cpu_seconds(gw.process.pid)  # the trigger port's process
            context = multiprocessing.get_context("fork")
            # `posters_nice`: the posters stand for remote probes; niced, they take only the
            # CPU the gateway (and its trigger port's process) leave on this shared machine
            with context.Pool(posters, initializer=os.nice, initargs=(posters_nice,)) as workers:
                waiting = workers.starmap_async(poster, [((host, int(port)), s) for s in shares])
                await asyncio.sleep(max(0.0, start + within_s / 2 - time.time()))
                other = encode(make_body([make_alert(1, name="GPUFellOffBus", labels=TEAM_B)]))
                webhook, card_ms = (
                    await asyncio.gather(
                        asyncio.to_thread(_post_webhook, gw.url, other), _card_ms(receiver)
                    )
                    if not bare
                    else (None, None)
                )
                results = [r for share in await asyncio.to_thread(waiting.get) for r in share]
            cpu, overflows = cpu_seconds(gw.process.pid) - cpu, _listen_overflows() - overflows
            child_cpu = {
                pid: used - child_cpu.get(pid, 0.0)
                for pid, used in children_cpu_seconds(gw.process.pid).items()
            }
            children_cpu = sum(child_cpu.values())
            peak = peak_rss(gw.process.pid)
        finally:
            await asyncio.to_thread(gw.stop)
            if beside is not None:
                await asyncio.to_thread(beside.stop)
            await receiver.stop()
    tries = Counter(status for *_, statuses in results for status in statuses)
    final = Counter(status for _, _, status, _ in results)
    accepted = sorted(done - at for at, done, status, _ in results if 200 <= status < 300)
    last = max((done for _, done, status, _ in results if 200 <= status < 300), default=start)
    answered = max((done for _, done, status, _ in results if status > 0), default=start)
    if webhook is not None:  # the triggers answered while the webhook waited for its answer
        began, ended = webhook.pop("between")
        webhook["triggers_answered_meanwhile"] = sum(began <= r[1] <= ended for r in results)
    return {
        "ranks": world,
        "server": "bare aiohttp" if bare else "gateway",
        "to": "bare" if bare else to,
        "posts": count,
        "within_s": within_s,
        "posters": posters,
        "posters_nice": posters_nice,
        "pool": pool,
        "final": dict(final),
        "every_try": dict(tries),
        "tries": sum(tries.values()),
        "last_answered_s": round(answered - start, 1),
        "last_accepted_s": round(last - start, 1),
        "accepted_latency_p50_s": round(accepted[len(accepted) // 2], 3) if accepted else None,
        "accepted_latency_p99_s": round(accepted[int(len(accepted) * 0.99)], 3)
        if accepted
        else None,
        "gateway_cpu_s": round(cpu, 2),
        "gateway_cpu_us_per_try": round(cpu / max(1, sum(tries.values())) * 1e6),
        # the gateway's child processes (its trigger port's), live at the end of the run
        "children_cpu_s": round(children_cpu, 2),
        "total_cpu_us_per_try": round((cpu + children_cpu) / max(1, sum(tries.values())) * 1e6),
        "gateway_peak_rss_mb": round(peak / 2**20),
        "listen_overflows": overflows,
        "other_teams_webhook_ms": webhook,
        "other_teams_card_ms": card_ms,
        "load_average": os.getloadavg()[0],
    }


async def _card_ms(receiver: Any, within_s: float = 60.0) -> int | None:
    """Milliseconds until the other team's card reached the webhook channel (None: not
    within `within_s`)."""
    started = time.perf_counter()
    while time.perf_counter() - started < within_s:
        if any(
            (x.get("payload") or {}).get("alertname") == "GPUFellOffBus" for x in receiver.bodies
        ):
            return round((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.01)
    return None


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def start_bare(tmp: Path) -> Any:
    """A bare aiohttp server (`serve_bare`) on a free port, as the gateway is started."""
    from tests.support.realservers import start_server

    def argv(port: int, _workdir: Path) -> list[str]:
        return [sys.executable, "-m", "bench.bench_hang_scale", "--serve-bare", str(port)]

    return start_server(tmp, "bare", argv, ready_path="/readyz")


def serve_bare(port: int) -> None:
    """The floor: answers each trigger post as the gateway answers a known one, having read
    its body, with the gateway's server settings (no access log, listen queue 1,024)."""
    from aiohttp import web

    known = json.dumps({"status": "known", "hang": "known", "first": False, "new": 0})

    async def trigger(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(text=known)

    async def ready(_: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_post("/api/v1/hang-triggers", trigger)
    app.router.add_get("/readyz", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


TEAM_B = {"alertname": "GPUFellOffBus", "priority": "P0", "namespace": "team-b", "node": "gpu-9"}


def _post_webhook(url: str, body: bytes) -> dict[str, Any]:
    """Another team's webhook during the flood, retried every 0.5 s as long as it is
    refused: every answer's status, the milliseconds until it was stored (200), and the
    wall-clock times it was posted and stored (`between`)."""
    import urllib.error
    import urllib.request

    started, statuses, wall = time.perf_counter(), [], time.time()
    while time.perf_counter() - started < 60:
        request = urllib.request.Request(f"{url}/api/v1/alertmanager", data=body, method="POST")
        request.add_header("Authorization", "Bearer bench-api")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                statuses.append(answer.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
        except OSError:
            statuses.append(0)
        if statuses[-1] == 200:
            break
        time.sleep(0.5)
    return {
        "statuses": statuses,
        "stored_ms": round((time.perf_counter() - started) * 1000),
        "between": [wall, time.time()],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--probe-processes", type=int, default=None)
    parser.add_argument("--flood", type=int, default=0, help="posts: the trigger flood alone")
    parser.add_argument("--within", type=float, default=5.0)
    parser.add_argument("--posters", type=int, default=2)
    parser.add_argument(
        "--posters-nice",
        type=int,
        default=0,
        help="flood: the posters' niceness (they stand for remote probes; 0: as the gateway)",
    )
    parser.add_argument("--pool", type=int, default=0, help="flood: kept-alive connections")
    parser.add_argument("--profile", type=Path, help="flood: the gateway's cProfile stats")
    parser.add_argument("--bare", action="store_true", help="flood: a bare aiohttp handler")
    parser.add_argument(
        "--to",
        choices=("triggers", "main", "beside"),
        default="triggers",
        help="flood: the gateway's trigger port (default) or its own port (the baseline)",
    )
    parser.add_argument("--serve-bare", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path, help="keep each run's gateway log under this folder")
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(args.serve_bare)
        return
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    raise_file_limit()
    for world in args.ranks:
        if args.flood:
            flooded = flood(
                world,
                args.flood,
                args.within,
                args.posters,
                args.pool,
                args.profile,
                args.bare,
                args.to,
                args.posters_nice,
            )
            print(json.dumps(asyncio.run(flooded)), flush=True)
            continue
        processes = args.probe_processes
        if processes is None:
            processes = 0 if world <= 1024 else 4
        runs = []
        for _ in range(args.runs):
            runs.append(asyncio.run(one(world, args.entries, processes, args.keep)))
            print(json.dumps(runs[-1]), flush=True)
        if args.runs > 1:
            print(json.dumps(medians(runs)), flush=True)


if __name__ == "__main__":
    main()
