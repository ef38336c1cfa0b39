"""Intake throughput: persisted alerts/s through the real gateway vs a bare aiohttp server.

Both servers run as separate processes on loopback and get the same client: N concurrent
connections posting pre-encoded 50-alert webhook bodies (every alert new). The bare server only
reads the body and answers 200, so the ratio says how much of the HTTP ceiling the durable
intake keeps. Rounds alternate (bare, gateway, bare, ...) and medians are reported.

The gateway answers once alerts and events are committed; its alert policy works off the
stored changes right after (the policy inbox). "planned" is the rate from the first post until
the inbox is empty again (read from /metrics): what a storm costs end to end.

    .venv/bin/python -m bench.bench_intake [--db postgresql://...] [--posts 600] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

from bench.sqlite_floor import engine_seconds
from tests.support.ports import free_port

ALERTS_PER_POST = 50


def bodies(count: int, offset: int) -> list[bytes]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    out = []
    for b in range(count):
        alerts = []
        for i in range(ALERTS_PER_POST):
            n = offset + b * ALERTS_PER_POST + i
            alerts.append(
                {
                    "status": "firing",
                    "labels": {
                        "alertname": "DCGMXidError",
                        "trainingjob": "bench",
                        "namespace": "ml",
                        "node": f"gpu-{n % 1000:04d}",
                        "gpu": str(n % 8),
                        "priority": "P2",
                    },
                    "annotations": {"summary": "XID 13 on a GPU", "description": "bench"},
                    "startsAt": (start + timedelta(seconds=n)).isoformat(),
                    "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": "http://prometheus/graph",
                    "fingerprint": f"{n:016x}",
                }
            )
        body = {
            "version": "4",
            "groupKey": "bench",
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "trainsentry",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://am",
            "alerts": alerts,
        }
        out.append(json.dumps(body).encode())
    return out


def serve_bare(port: int) -> None:
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "ok"})

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/api/v1/alertmanager", handle)
    app.router.add_get("/readyz", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server not ready")


async def load(
    url: str, payloads: list[bytes], concurrency: int, headers: dict[str, str] | None = None
) -> tuple[float, list[float]]:
    """Posts `payloads` over `concurrency` connections; the seconds until the last answer,
    and each post's latency."""
    latencies: list[float] = []
    queue = list(reversed(payloads))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def worker() -> None:
            while queue:
                payload = queue.pop()
                started = time.perf_counter()
                async with session.post(url, data=payload) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"status {response.status}")
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return elapsed, latencies


def inbox_depth_in(metrics: str) -> float:
    """trainsentry_policy_inbox_depth from the text of the gateway's /metrics."""
    for line in metrics.splitlines():
        if line.startswith("trainsentry_policy_inbox_depth "):
            return float(line.split()[1])
    raise RuntimeError("no trainsentry_policy_inbox_depth in /metrics")


def journal_depth_in(metrics: str) -> float:
    """trainsentry_intake_journal_depth (alerts answered, not yet recorded); 0 for a gateway
    without the journal (an older one, for pairs against it)."""
    for line in metrics.splitlines():
        if line.startswith("trainsentry_intake_journal_depth "):
            return float(line.split()[1])
    return 0.0


def inbox_depth(url: str) -> float:
    """What still waits for the policy: changes in the inbox and alerts in the journal."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return inbox_depth_in(text) + journal_depth_in(text)


def wait_planned(url: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while inbox_depth(url) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the policy did not work off the inbox in time")
        time.sleep(0.05)


def start(kind: str, db: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if kind == "bare":
        argv = [sys.executable, __file__, "--serve-bare", str(port)]
    else:
        argv = [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"127.0.0.1:{port}"]
        argv += ["--db", db, "--log-level", "WARNING"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve-bare", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", help="database URL (default: a fresh SQLite file per round)")
    parser.add_argument("--posts", type=int, default=600, help="posts per round (50 alerts each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.serve_bare:
        serve_bare(args.serve_bare)
        return 0

    results: dict[str, list[tuple[float, float, float]]] = {"bare": [], "gateway": []}
    planned: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.rounds):
            for kind in ("bare", "gateway"):
                db = args.db or f"sqlite:///{Path(tmp) / f'bench-{round_no}.db'}"
                payloads = bodies(args.posts, offset=round_no * args.posts * ALERTS_PER_POST)
                proc, url = start(kind, db)
                try:
                    asyncio.run(load(url + "/api/v1/alertmanager", payloads[:20], 4))  # warm-up
                    if kind == "gateway":
                        wait_planned(url)
                    started = time.perf_counter()
                    elapsed, lat = asyncio.run(
                        load(url + "/api/v1/alertmanager", payloads[20:], args.concurrency)
                    )
                    if kind == "gateway":
                        wait_planned(url)
                        planned.append(
                            (len(payloads) - 20) * ALERTS_PER_POST / (time.perf_counter() - started)
                        )
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=20)
                rate = (len(payloads) - 20) * ALERTS_PER_POST / elapsed
                results[kind].append((rate, percentile(lat, 0.5), percentile(lat, 0.99)))
                p50, p99 = percentile(lat, 0.5) * 1000, percentile(lat, 0.99) * 1000
                done = f"  planned {planned[-1]:7.0f} alerts/s" if kind == "gateway" else ""
                print(
                    f"round {round_no} {kind:8s} {rate:10.0f} alerts/s "
                    f"p50 {p50:6.1f} ms p99 {p99:6.1f} ms{done}",
                    flush=True,
                )
    med = {
        kind: tuple(statistics.median(r[i] for r in rows) for i in range(3))
        for kind, rows in results.items()
    }
    ratio = med["gateway"][0] / med["bare"][0]
    backend = (args.db or "sqlite").split(":", 1)[0]
    print(
        f"\nmedian of {args.rounds} rounds, {args.concurrency} concurrent clients, "
        f"backend {backend}"
    )
    for kind in ("bare", "gateway"):
        rate, p50, p99 = med[kind]
        print(
            f"  {kind:8s} {rate:10.0f} alerts/s  p50 {p50 * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms"
        )
    print(f"  planned  {statistics.median(planned):10.0f} alerts/s  (policy done, from first post)")
    print(f"  ratio gateway/bare = {ratio:.2f}  (cpu count {os.cpu_count()})")
    if args.db is None:
        # The same bodies stored by SQLite alone (sqlite_floor.py): what no gateway on this
        # store can beat here, whatever it does in Python.
        with tempfile.TemporaryDirectory() as tmp:
            floors = [
                engine_seconds(Path(tmp) / f"floor-{n}.db", bodies(args.posts, offset=0))
                for n in range(args.rounds)
            ]
        ceiling = args.posts * ALERTS_PER_POST / statistics.median(floors)
        print(
            f"  SQLite alone {ceiling:10.0f} alerts/s  (same rows, built beforehand): "
            f"ratio ceiling {ceiling / med['bare'][0]:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
