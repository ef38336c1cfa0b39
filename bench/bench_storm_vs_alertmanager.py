"""Storm throughput against the system that feeds us: a real Alertmanager vs the real gateway.

A cluster-wide storm (default 20,000 alerts: 20 jobs × 1,000 nodes, hardware alerts, P2) is
posted by the same client (16 concurrent connections, 50 alerts per post) to:

- a real Alertmanager (the Debian package, `POST /api/v2/alerts`, gossip off, a receiver that
  sends nothing): its ingest rate is the time until every post was answered;
- the real gateway as a process (`trainsentry gateway`, SQLite by default, or `--db URL`), with
  a webhook channel pointed at a local receiver: its *intake* rate is the time until every
  post was answered (stored before the answer), its *planned* rate the time from the first
  post until the policy inbox is empty again (read from /metrics).

Right after the storm's last post is answered (or `--p0-delay` seconds later, while the
gateway works off the storm), one P0 alert of another job is posted; its latency is from that
POST to the receiver seeing it (the P0 is recorded before the answer and claimed before the
storm's P2 backlog). "planned" waits for the policy inbox and the intake journal to be empty.
Rounds alternate (Alertmanager, gateway, ...), medians are reported with the ratios
gateway/Alertmanager. The issue's targets: intake ≥ 0.5×, planned ≥ 0.25×, P0 < 500 ms. Each
round also prints the gateway process's CPU per storm alert (all its threads, from /proc:
Linux) and the load average: on a shared machine the rates swing with the load, the CPU
per alert much less.

    .venv/bin/python -m bench.bench_storm_vs_alertmanager [--alerts 20000] [--rounds 3] [--db URL]
        [--p0-delay SECONDS] [--journal-max-alerts N]   (0: the intake without its journal)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from bench.bench_intake import inbox_depth, wait_planned, wait_ready
from bench.bench_intake import load as intake_load
from tests.support.ports import free_port
from tests.support.realservers import start_alertmanager

PER_POST = 50
JOBS = 20
NODES = 1000


async def load(url: str, payloads: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    """bench_intake's client, posting JSON (Alertmanager refuses other content types)."""
    return await intake_load(url, payloads, concurrency, {"Content-Type": "application/json"})


def storm_alerts(count: int, start: datetime) -> list[dict[str, Any]]:
    """Pure: `count` distinct firing alerts spread over JOBS jobs and NODES nodes."""
    alerts = []
    for n in range(count):
        job = f"job-{n % JOBS:02d}"
        alerts.append(
            {
                "labels": {
                    "alertname": "DCGMXidError",
                    "trainingjob": job,
                    "namespace": "ml",
                    "node": f"gpu-{(n // JOBS) % NODES:04d}",
                    "gpu": str(n % 8),
                    "xid": "13",
                    "priority": "P2",
                    "severity": "warning",
                },
                "annotations": {"summary": "XID 13 on a GPU", "description": "storm bench"},
                "startsAt": (start + timedelta(milliseconds=n)).isoformat(),
                "generatorURL": "http://prometheus/graph",
            }
        )
    return alerts


def alertmanager_posts(alerts: list[dict[str, Any]]) -> list[bytes]:
    """Pure: Alertmanager's own API v2 bodies (a list of postable alerts)."""
    return [json.dumps(alerts[i : i + PER_POST]).encode() for i in range(0, len(alerts), PER_POST)]


def webhook(alerts: list[dict[str, Any]], offset: int) -> bytes:
    """Pure: one Alertmanager webhook body (version 4) carrying `alerts`."""
    items = [
        {
            "status": "firing",
            **alert,
            "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": f"{offset + i:016x}",
        }
        for i, alert in enumerate(alerts)
    ]
    return json.dumps(
        {"version": "4", "groupKey": "storm", "truncatedAlerts": 0, "status": "firing",
         "receiver": "trainsentry", "groupLabels": {}, "commonLabels": {},
         "commonAnnotations": {}, "externalURL": "http://am", "alerts": items}
    ).encode()  # fmt: skip


def gateway_posts(alerts: list[dict[str, Any]], offset: int) -> list[bytes]:
    return [webhook(alerts[i : i + PER_POST], offset + i) for i in range(0, len(alerts), PER_POST)]


class Receiver:
    """The gateway's webhook channel: records when each fingerprint first arrives."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}

    async def handle(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        body = await request.json()
        key = (body.get("payload") or {}).get("fingerprint", "")
        self.arrivals.setdefault(key, now)
        return web.json_response({"ok": True})


def start_gateway(
    tmp: Path, db: str, hook: str, journal: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """`journal`: gateway.journal_max_alerts (None: the default; 0: every webhook recorded
    before its answer, as before the journal)."""
    config = tmp / "gateway.yaml"
    settings: dict[str, Any] = {"webhooks": {"feishu": {"url": hook}}}
    if journal is not None:
        settings["gateway"] = {"journal_max_alerts": journal}
    config.write_text(yaml.safe_dump(settings))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"127.0.0.1:{port}",
         "--db", db, "--config", str(config), "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return proc, url


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all its threads) process `pid` used so far; 0.0 where
    /proc is not there (not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def alertmanager_round(tmp: Path, posts: list[bytes], concurrency: int) -> float:
    """Alerts/s a fresh Alertmanager ingests `posts` at."""
    config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    with start_alertmanager(tmp, config) as am:
        asyncio.run(load(am.url + "/api/v2/alerts", posts[:4], 4))  # warm-up (not counted)
        elapsed, _ = asyncio.run(load(am.url + "/api/v2/alerts", posts[4:], concurrency))
    return (len(posts) - 4) * PER_POST / elapsed


async def _p0_latency(gateway: str, receiver: Receiver, start: datetime) -> float:
    p0 = {
        "labels": {"alertname": "TrainingJobHang", "trainingjob": "other-job",
                   "namespace": "ml", "priority": "P0", "severity": "critical"},
        "annotations": {"summary": "hang"},
        "startsAt": start.isoformat(),
        "generatorURL": "http://prometheus/graph",
    }  # fmt: skip
    body = webhook([p0], offset=10**9)
    key = f"{10**9:016x}"
    async with aiohttp.ClientSession() as session:
        sent = time.perf_counter()
        async with session.post(f"{gateway}/api/v1/alertmanager", data=body) as response:
            assert response.status == 200, await response.text()
    deadline = time.perf_counter() + 60
    while key not in receiver.arrivals:
        if time.perf_counter() > deadline:
            return float("inf")
        await asyncio.sleep(0.002)
    return receiver.arrivals[key] - sent


async def _gateway_round(
    tmp: Path,
    db: str,
    posts: list[bytes],
    warm: list[bytes],
    concurrency: int,
    start: datetime,
    p0_delay: float = 0.0,
    journal: int | None = None,
) -> tuple[float, float, float, float]:
    """Intake and planned rates (alerts/s), the P0's latency (s), and the gateway process's
    CPU seconds per storm alert (from the warm-up planned to the storm planned: the intake,
    the expansion, the policy and the /metrics polls, every thread)."""
    receiver = Receiver()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hook = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    proc, url = await asyncio.to_thread(start_gateway, tmp, db, hook, journal)
    try:
        await load(url + "/api/v1/alertmanager", warm, 4)
        await asyncio.to_thread(wait_planned, url)
        cpu_before = cpu_seconds(proc.pid)
        started = time.perf_counter()
        elapsed, _ = await load(url + "/api/v1/alertmanager", posts, concurrency)
        await asyncio.sleep(p0_delay)
        latency = await _p0_latency(url, receiver, start)
        await asyncio.to_thread(wait_planned, url)
        planned_s = time.perf_counter() - started
        cpu = cpu_seconds(proc.pid) - cpu_before
        assert await asyncio.to_thread(inbox_depth, url) == 0
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        await runner.cleanup()
    alerts = len(posts) * PER_POST
    return alerts / elapsed, alerts / planned_s, latency, cpu / alerts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alerts", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--db", help="gateway database URL (default: a fresh SQLite per round)")
    parser.add_argument(
        "--p0-delay", type=float, default=0.0, help="seconds after the storm's last answer"
    )
    parser.add_argument(
        "--journal-max-alerts",
        type=int,
        help="the gateway's journal_max_alerts (0: no journal; default: the gateway's)",
    )
    args = parser.parse_args()

    start = datetime.now(UTC) - timedelta(minutes=5)
    alerts = storm_alerts(args.alerts, start)
    am_posts = alertmanager_posts(alerts)
    am_rates: list[float] = []
    intake: list[float] = []
    planned: list[float] = []
    p0: list[float] = []
    cpu: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for round_no in range(args.rounds):
            tmp = Path(folder) / f"round-{round_no}"
            tmp.mkdir()
            am_rates.append(alertmanager_round(tmp, am_posts, args.concurrency))
            db = args.db or f"sqlite:///{tmp / 'gateway.db'}"
            offset = (round_no + 1) * 10**7  # fresh fingerprints if --db is reused
            warm = gateway_posts(storm_alerts(200, start - timedelta(hours=1)), offset - 10**6)
            rates = asyncio.run(
                _gateway_round(
                    tmp,
                    db,
                    gateway_posts(alerts, offset),
                    warm,
                    args.concurrency,
                    start,
                    args.p0_delay,
                    args.journal_max_alerts,
                )
            )
            intake.append(rates[0])
            planned.append(rates[1])
            p0.append(rates[2])
            cpu.append(rates[3])
            print(
                f"round {round_no}: alertmanager {am_rates[-1]:8.0f}/s  gateway intake "
                f"{rates[0]:8.0f}/s  planned {rates[1]:8.0f}/s  P0 behind it "
                f"{rates[2] * 1e3:6.0f} ms  gateway CPU {rates[3] * 1e6:4.0f} µs/alert "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    am, gi, gp = (statistics.median(v) for v in (am_rates, intake, planned))
    backend = (args.db or "sqlite").split(":", 1)[0]
    print(
        f"\nmedian of {args.rounds} rounds, {args.alerts} alerts, {args.concurrency} clients, "
        f"gateway on {backend} (cpu count {os.cpu_count()})"
    )
    print(f"  alertmanager ingest {am:9.0f} alerts/s")
    print(f"  gateway intake      {gi:9.0f} alerts/s  ratio {gi / am:.2f}  (target >= 0.5)")
    print(f"  gateway planned     {gp:9.0f} alerts/s  ratio {gp / am:.2f}  (target >= 0.25)")
    print(
        f"  P0 behind the storm {statistics.median(p0) * 1e3:9.0f} ms  "
        f"({args.p0_delay:g} s after its last answer) "
        f"(each: {', '.join(f'{v * 1e3:.0f}' for v in p0)}; target < 500)"
    )
    print(
        f"  gateway CPU         {statistics.median(cpu) * 1e6:9.0f} µs per storm alert "
        "(intake, expansion, policy, /metrics polls; the process, every thread)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
