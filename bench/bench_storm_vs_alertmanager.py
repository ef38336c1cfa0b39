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
round also prints the gateway processes' CPU per storm alert (all their threads, summed over
the replicas, from /proc: Linux) and the load average: on a shared machine the rates swing
with the load, the CPU per alert much less.

Each job's alerts come in their own Alertmanager group (`groupKey` per alertname, namespace
and trainingjob, as the shipped route groups them: rules/alertmanager-inhibit.yaml);
`--one-group` sends the whole storm as one group (one incident for every job, as this bench
did before issue 46 part 3).

Replicas (issue 46): `--db postgresql` runs the gateway on a fresh scratch database of the
local PostgreSQL per round (tests/support/pg_databases.py), or `--db URL` on that one;
`--replicas 1,2,3` runs, in every round, 1, 2 and 3 gateway processes on it (in an order
that rotates per round), the posts spread over them round-robin, and `--sqlite-too` adds a
SQLite run to each round. Per setup: medians, ratios to one replica, and how the batches
(`trainsentry_policy_batches_total`) and changes split between the replicas, and how many
database sessions waited for a lock during the storm (mean of samples every 20 ms).

    .venv/bin/python -m bench.bench_storm_vs_alertmanager [--alerts 20000] [--rounds 3] [--db URL]
        [--p0-delay SECONDS] [--journal-max-alerts N]   (0: the intake without its journal)
        [--replicas 1,2,3] [--sqlite-too] [--one-group]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml
from aiohttp import web

from bench.bench_intake import inbox_depth, wait_planned, wait_ready
from bench.bench_intake import load as intake_load
from bench.process_stats import cpu_seconds
from tests.support.pg_databases import drop_pg_database, make_pg_database
from tests.support.ports import free_port
from tests.support.realservers import start_alertmanager

PER_POST = 50
JOBS = 20
NODES = 1000


async def load(url: str, payloads: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    """bench_intake's client, posting JSON (Alertmanager refuses other content types)."""
    return await intake_load(url, payloads, concurrency, {"Content-Type": "application/json"})


async def load_spread(urls: list[str], payloads: list[bytes], concurrency: int) -> float:
    """Posts `payloads` over `concurrency` connections spread round-robin over `urls` (the
    replicas); the seconds until the last answer."""
    started = time.perf_counter()
    await asyncio.gather(
        *(
            load(url, payloads[i :: len(urls)], max(1, concurrency // len(urls)))
            for i, url in enumerate(urls)
        )
    )
    return time.perf_counter() - started


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


def webhook(alerts: list[dict[str, Any]], offset: int, group_key: str = "storm") -> bytes:
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
        {"version": "4", "groupKey": group_key, "truncatedAlerts": 0, "status": "firing",
         "receiver": "trainsentry", "groupLabels": {}, "commonLabels": {},
         "commonAnnotations": {}, "externalURL": "http://am", "alerts": items}
    ).encode()  # fmt: skip


def group_of(labels: dict[str, str]) -> str:
    """Pure: the groupKey the shipped route gives an alert (group_by alertname, namespace,
    trainingjob)."""
    return (
        f'{{}}:{{alertname="{labels["alertname"]}", namespace="{labels["namespace"]}", '
        f'trainingjob="{labels["trainingjob"]}"}}'
    )


def gateway_posts(
    alerts: list[dict[str, Any]], offset: int, one_group: bool = False
) -> list[bytes]:
    """Pure: the storm as webhooks of PER_POST alerts. One group per job (each post one
    job's), the jobs' posts interleaved as the storm goes; `one_group`: consecutive alerts
    (every job in each post) in one group, "storm". Fingerprints: `offset` + the alert's
    index in `alerts`."""
    if one_group:
        return [
            webhook(alerts[i : i + PER_POST], offset + i) for i in range(0, len(alerts), PER_POST)
        ]
    by_group: dict[str, list[int]] = {}
    for index, alert in enumerate(alerts):
        by_group.setdefault(group_of(alert["labels"]), []).append(index)
    posts: list[list[bytes]] = []
    for group, indexes in by_group.items():
        posts.append([])
        for i in range(0, len(indexes), PER_POST):
            chunk = indexes[i : i + PER_POST]
            items = [{**alerts[n], "fingerprint": f"{offset + n:016x}"} for n in chunk]
            posts[-1].append(_webhook_items(items, group))
    return [post for row in itertools.zip_longest(*posts) for post in row if post is not None]


def _webhook_items(items: list[dict[str, Any]], group_key: str) -> bytes:
    """Pure: one webhook body of alerts that carry their fingerprints."""
    alerts = [{"status": "firing", **a, "endsAt": "0001-01-01T00:00:00Z"} for a in items]
    return json.dumps(
        {"version": "4", "groupKey": group_key, "truncatedAlerts": 0, "status": "firing",
         "receiver": "trainsentry", "groupLabels": {}, "commonLabels": {},
         "commonAnnotations": {}, "externalURL": "http://am", "alerts": alerts}
    ).encode()  # fmt: skip


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


def counters(url: str) -> tuple[float, float]:
    """(trainsentry_policy_batches_total, trainsentry_policy_planned_total) of one gateway."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = {"trainsentry_policy_batches_total": 0.0, "trainsentry_policy_planned_total": 0.0}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found["trainsentry_policy_batches_total"], found["trainsentry_policy_planned_total"]


class LockWaits:
    """Samples, every 20 ms while it runs, how many sessions of the gateway's PostgreSQL
    database wait for a lock (`pg_stat_activity.wait_event_type = 'Lock'`: a row lock of
    another replica's planning, say): the serialisation the replicas' planning meets."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.samples: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _sample(self) -> None:
        conn = await asyncpg.connect(self.db)
        try:
            while True:
                self.samples.append(
                    int(
                        await conn.fetchval(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        )
                    )
                )
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    def start(self) -> None:
        if self.db.startswith("postgresql"):
            self._task = asyncio.create_task(self._sample())

    async def stop(self) -> float:
        """The mean number of sessions waiting for a lock (0 on SQLite)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return statistics.fmean(self.samples) if self.samples else 0.0


@dataclass
class Outcome:
    """One gateway round: rates, the P0's latency, and per replica (batches, changes)."""

    intake: float
    planned: float
    p0: float
    split: list[tuple[int, int]]
    lock_waiters: float  # sessions waiting for a lock, mean over the storm (`LockWaits`)
    cpu: float  # the gateways' CPU seconds per storm alert (`cpu_seconds`, all replicas)


async def _gateway_round(
    tmp: Path,
    db: str,
    posts: list[bytes],
    warm: list[bytes],
    concurrency: int,
    start: datetime,
    p0_delay: float = 0.0,
    journal: int | None = None,
    replicas: int = 1,
) -> Outcome:
    receiver = Receiver()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hook = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    started_gateways: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for index in range(replicas):  # one after the other: the first migrates the store
            folder = tmp / f"replica-{index}"
            folder.mkdir(exist_ok=True)
            proc, url = await asyncio.to_thread(start_gateway, folder, db, hook, journal)
            started_gateways.append(proc)
            urls.append(url)
        await load(urls[0] + "/api/v1/alertmanager", warm, 4)
        await asyncio.to_thread(wait_planned, urls[0])
        before = [await asyncio.to_thread(counters, url) for url in urls]
        waits = LockWaits(db)
        waits.start()
        cpu_before = sum(cpu_seconds(proc.pid) for proc in started_gateways)
        started = time.perf_counter()
        elapsed = await load_spread([u + "/api/v1/alertmanager" for u in urls], posts, concurrency)
        await asyncio.sleep(p0_delay)
        latency = await _p0_latency(urls[0], receiver, start)
        for url in urls:
            await asyncio.to_thread(wait_planned, url)
        planned_s = time.perf_counter() - started
        lock_waiters = await waits.stop()
        cpu = sum(cpu_seconds(proc.pid) for proc in started_gateways) - cpu_before
        assert await asyncio.to_thread(inbox_depth, urls[0]) == 0
        after = [await asyncio.to_thread(counters, url) for url in urls]
    finally:
        for proc in started_gateways:
            proc.terminate()
        for proc in started_gateways:
            await asyncio.to_thread(proc.wait, 30)
        await runner.cleanup()
    alerts = len(posts) * PER_POST
    split = [(int(a[0] - b[0]), int(a[1] - b[1])) for a, b in zip(after, before, strict=True)]
    return Outcome(alerts / elapsed, alerts / planned_s, latency, split, lock_waiters, cpu / alerts)


@dataclass
class Setup:
    """A gateway setup measured in each round: its store and replica count."""

    name: str
    backend: str  # "sqlite", "postgresql" (a scratch database per round) or a URL
    replicas: int
    rounds: list[Outcome] = field(default_factory=list)


def _setups(args: argparse.Namespace) -> list[Setup]:
    counts = [int(n) for n in args.replicas.split(",")]
    if args.db is None:
        if counts != [1]:
            raise SystemExit("--replicas needs --db postgresql (or a PostgreSQL URL)")
        return [Setup("sqlite", "sqlite", 1)]
    setups = [Setup("sqlite", "sqlite", 1)] if args.sqlite_too else []
    backend = args.db.split(":", 1)[0]
    setups += [Setup(f"{backend} ×{n}", args.db, n) for n in counts]
    return setups


def _database(setup: Setup, tmp: Path) -> tuple[str, str | None]:
    """The database URL of a setup's round, and a scratch database to drop after it."""
    if setup.backend == "sqlite":
        return f"sqlite:///{tmp / 'gateway.db'}", None
    if setup.backend == "postgresql":
        url = make_pg_database()
        return url, url
    return setup.backend, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alerts", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--db",
        help="gateway database: 'postgresql' (a scratch database per round) or a URL "
        "(default: a fresh SQLite per round)",
    )
    parser.add_argument(
        "--p0-delay", type=float, default=0.0, help="seconds after the storm's last answer"
    )
    parser.add_argument(
        "--journal-max-alerts",
        type=int,
        help="the gateway's journal_max_alerts (0: no journal; default: the gateway's)",
    )
    parser.add_argument("--replicas", default="1", help="gateway processes, e.g. 1,2,3")
    parser.add_argument("--sqlite-too", action="store_true", help="a SQLite run in each round")
    parser.add_argument("--one-group", action="store_true", help="the storm as one group")
    args = parser.parse_args()

    start = datetime.now(UTC) - timedelta(minutes=5)
    alerts = storm_alerts(args.alerts, start)
    am_posts = alertmanager_posts(alerts)
    am_rates: list[float] = []
    setups = _setups(args)
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for round_no in range(args.rounds):
            tmp = Path(folder) / f"round-{round_no}"
            tmp.mkdir()
            am_rates.append(alertmanager_round(tmp, am_posts, args.concurrency))
            print(f"round {round_no}: alertmanager {am_rates[-1]:8.0f}/s", flush=True)
            shift = round_no % len(setups)  # each setup goes first in some round
            for setup in setups[shift:] + setups[:shift]:
                where = tmp / setup.name.replace(" ", "-")
                where.mkdir()
                db, scratch = _database(setup, where)
                offset = (round_no + 1) * 10**7  # fresh fingerprints if --db is reused
                warm = gateway_posts(
                    storm_alerts(200, start - timedelta(hours=1)), offset - 10**6, args.one_group
                )
                loads.append(os.getloadavg()[0])
                try:
                    outcome = asyncio.run(
                        _gateway_round(
                            where,
                            db,
                            gateway_posts(alerts, offset, args.one_group),
                            warm,
                            args.concurrency,
                            start,
                            args.p0_delay,
                            args.journal_max_alerts,
                            setup.replicas,
                        )
                    )
                finally:
                    if scratch is not None:
                        drop_pg_database(scratch)
                setup.rounds.append(outcome)
                split = " ".join(f"{b} batches/{c} changes" for b, c in outcome.split)
                print(
                    f"  {setup.name:14s} intake {outcome.intake:8.0f}/s  planned "
                    f"{outcome.planned:8.0f}/s  P0 {outcome.p0 * 1e3:6.0f} ms  "
                    f"split: {split}  lock waiters {outcome.lock_waiters:.2f}  "
                    f"CPU {outcome.cpu * 1e6:4.0f} µs/alert  (load {loads[-1]:.1f})",
                    flush=True,
                )
    am = statistics.median(am_rates)
    print(
        f"\nmedian of {args.rounds} rounds, {args.alerts} alerts, {args.concurrency} clients, "
        f"{'one group' if args.one_group else 'one group per job'} (cpu count "
        f"{os.cpu_count()}, load average at the rounds' starts "
        f"{min(loads):.1f}–{max(loads):.1f})"
    )
    print(f"  alertmanager ingest {am:9.0f} alerts/s")
    base = next((s for s in setups if s.backend != "sqlite" and s.replicas == 1), None)
    base_planned = statistics.median(o.planned for o in base.rounds) if base else None
    for setup in setups:
        gi = statistics.median(o.intake for o in setup.rounds)
        gp = statistics.median(o.planned for o in setup.rounds)
        p0 = [o.p0 for o in setup.rounds]
        versus = f"  ×{gp / base_planned:.2f} PostgreSQL ×1" if base_planned else ""
        waiting = statistics.median(o.lock_waiters for o in setup.rounds)
        print(
            f"  {setup.name:14s} intake {gi:8.0f}/s ({gi / am:.2f}×)  planned {gp:8.0f}/s "
            f"({gp / am:.2f}×){versus}  P0 {statistics.median(p0) * 1e3:.0f} ms "
            f"(each: {', '.join(f'{v * 1e3:.0f}' for v in p0)})  lock waiters {waiting:.2f}"
            f"  CPU {statistics.median(o.cpu for o in setup.rounds) * 1e6:.0f} µs/alert"
        )
        if setup.replicas > 1:
            for number, outcome in enumerate(setup.rounds):
                shares = ", ".join(f"{b} batches / {c} changes" for b, c in outcome.split)
                print(f"      round {number}: {shares}")
    print("  targets: intake >= 0.5×, planned >= 0.25×, P0 < 500 ms; 2 replicas >= 1.3× one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
