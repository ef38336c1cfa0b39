"""An unchanged 50-alert group re-sent vs a fresh 50-alert group, through the real gateway.

Alertmanager re-sends every alert of a group each repeat_interval; the gateway recognises an
unchanged resend at intake (store/resends.py) and does nothing more for it. This measures
what each costs the gateway, in alternating triples on one running gateway process:
- fresh: a new group (its own job, 50 new alerts, as Alertmanager sends them);
- resend: the same body again (what Alertmanager's repeat sends);
- recorded: the same alerts in a new body (`notification_reason` changed, as newer
  Alertmanagers write it): unchanged, but recorded in full, which is what every resend
  cost before (the baseline in the same run);
- healthz: `GET /healthz`, the cheapest request there is: what any HTTP request costs;
- idle: no request, the same wait: what the gateway's own timers and polls use in such a
  window (the floor of the method, included in every figure).

Each measurement is a burst of `--burst` webhooks of one kind, one after the other (so it
does not hinge on the wake-up of an idle process). Per webhook: the wall time until the
gateway went quiet again (the answers, and for fresh groups their planning, and with
`--send console` their notifications sent to the console channel, always on by default;
with `--send no` the policy routes to no channel, so a fresh group costs intake and policy
only), and the CPU the gateway used meanwhile: its process (all threads,
/proc/PID/task/*/schedstat, nanoseconds), plus on PostgreSQL the server processes serving
its connections. A resend's receipt count is written later, once for all resends of that
second; that write is timed on its own.

    .venv/bin/python -m bench.bench_resend [--backend sqlite|postgresql|both] [--pairs 30]
        [--burst 5] [--send no|console|both]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg

from bench.bench_intake import wait_ready
from tests.support.pg_databases import drop_pg_database, make_pg_database
from tests.support.ports import free_port
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.store import create_engine
from trainsentry.store.resends import ReceiptTouch, touch_receipts

ALERTS = 50
QUIET_S = 0.05  # no CPU used for this long: the gateway has finished with a webhook
WARMUP = 3


def group(index: int, reason: str = "first notification") -> bytes:
    """One Alertmanager group of 50 firing alerts of job `bench-INDEX`."""
    job = f"bench-{index}"
    alerts = [
        make_alert(
            index * ALERTS + n,
            name="DCGMXidError",
            labels={"trainingjob": job, "priority": "P2"},
        )
        for n in range(ALERTS)
    ]
    body = make_body(alerts, group_key=f'{{}}:{{alertname="DCGMXidError", trainingjob="{job}"}}')
    return encode({**body, "notification_reason": reason})


def cpu_ns(pids: Iterable[int]) -> int:
    """CPU time used by `pids` and all their threads, in nanoseconds."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread or backend that ended
    return total


class Probe:
    """Where the gateway's work runs: its process, and on PostgreSQL its server backends."""

    def __init__(self, gateway_pid: int, pg_url: str | None) -> None:
        self.gateway_pid = gateway_pid
        self.pg_url = pg_url
        self.pids = [gateway_pid]

    async def refresh(self) -> None:
        if self.pg_url is None:
            return
        conn = await asyncpg.connect(self.pg_url)
        try:
            rows = await conn.fetch(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await conn.close()
        self.pids = [self.gateway_pid, *(int(row["pid"]) for row in rows)]

    async def until_quiet(self, started: float) -> tuple[float, int]:
        """Waits until no CPU is used for QUIET_S; (seconds from `started` to the last CPU
        used, CPU ns at that point)."""
        last_cpu = cpu_ns(self.pids)
        last_busy = time.perf_counter()
        while time.perf_counter() - last_busy < QUIET_S:
            await asyncio.sleep(0.002)
            now = cpu_ns(self.pids)
            if now != last_cpu:
                last_cpu, last_busy = now, time.perf_counter()
        return last_busy - started, last_cpu


async def one(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[bytes] | None,
    probe: Probe,
    expect: str,
) -> tuple[float, float]:
    """Posts `bodies` one after the other; per webhook, (wall seconds until the gateway went
    quiet, its CPU seconds). A burst, so a measurement does not hinge on one wake-up of an
    idle process. With no bodies: the same wait on an idle gateway (its timers and polls)."""
    await probe.until_quiet(time.perf_counter())
    before = cpu_ns(probe.pids)
    started = time.perf_counter()
    for body in bodies or ():
        if expect == "healthz":
            async with session.get(url.replace("/api/v1/alertmanager", "/healthz")) as response:
                await response.read()
            continue
        async with session.post(url, data=body) as response:
            answer = await response.json()
            assert response.status == 200, answer
        if expect == "fresh":
            assert answer["new"] == ALERTS and not answer["resend"], answer
        elif expect == "resend":
            assert answer["resend"] and answer["unchanged"] == ALERTS, answer
        else:
            assert not answer["resend"] and answer["unchanged"] == ALERTS, answer
    wall, after = await probe.until_quiet(started)
    count = len(bodies or [None])
    return wall / count, (after - before) / 1e9 / count


async def run_pairs(
    url: str, probe: Probe, pairs: int, burst: int
) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {
        "fresh": [],
        "resend": [],
        "recorded": [],
        "healthz": [],
        "idle": [],
    }
    async with aiohttp.ClientSession() as session:
        for index in range(pairs + WARMUP):
            await probe.refresh()
            groups = range(index * burst, (index + 1) * burst)
            bodies = [group(g) for g in groups]
            fresh = await one(session, url, bodies, probe, "fresh")
            later: list[tuple[str, list[bytes] | None]] = [
                ("resend", bodies),
                ("recorded", [group(g, "repeat interval elapsed") for g in groups]),
                ("healthz", [b""] * burst),
                ("idle", None),
            ]
            if index % 2:
                later.reverse()  # the order within a triple alternates
            measured = {kind: await one(session, url, b, probe, kind) for kind, b in later}
            if index < WARMUP:
                continue
            results["fresh"].append(fresh)
            for kind, figures in measured.items():
                results[kind].append(figures)
            f, r = fresh, measured["resend"]
            print(
                f"triple {index - WARMUP:3d}: fresh {f[0] * 1e3:6.1f} ms wall {f[1] * 1e3:6.2f}"
                f" ms cpu | resend {r[0] * 1e3:5.2f} ms wall {r[1] * 1e3:5.2f} ms cpu"
                f" | recorded {measured['recorded'][1] * 1e3:5.2f} ms cpu",
                flush=True,
            )
    return results


async def counts_write_seconds(db_url: str, rounds: int = 20) -> float:
    """The median time of the transaction that adds a second's resends to their receipts."""
    engine = create_engine(db_url)
    times = []
    try:
        for _ in range(rounds):
            touches = {receipt_id: ReceiptTouch(1, datetime.now(UTC)) for receipt_id in (1, 2)}
            started = time.perf_counter()
            async with engine.begin() as conn:
                await touch_receipts(conn, touches)
            times.append(time.perf_counter() - started)
    finally:
        await engine.dispose()
    return statistics.median(times)


def bench(backend: str, pairs: int, burst: int, tmp: Path, send: bool) -> None:
    pg_url = make_pg_database() if backend == "postgresql" else None
    db_url = pg_url or f"sqlite:///{tmp / f'resend-{send}.db'}"
    port = free_port()
    argv = [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"127.0.0.1:{port}"]
    argv += ["--db", db_url, "--log-level", "WARNING"]
    env = dict(os.environ)
    if not send:  # no channel: the policy plans and writes nothing to send
        policy = tmp / "no-channels.yaml"
        policy.write_text("routing:\n  always: []\n")
        env["TRAINSENTRY_POLICY_FILE"] = str(policy)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        probe = Probe(proc.pid, pg_url)
        url = f"http://127.0.0.1:{port}/api/v1/alertmanager"
        results = asyncio.run(run_pairs(url, probe, pairs, burst))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    try:
        write_s = asyncio.run(counts_write_seconds(db_url))
    finally:
        if pg_url is not None:
            drop_pg_database(pg_url)

    def med(kind: str, i: int) -> float:
        return statistics.median(figures[i] for figures in results[kind])

    def ratio(kind: str, i: int) -> float:
        pairs_ = zip(results[kind], results["fresh"], strict=True)
        return statistics.median(k[i] / f[i] for k, f in pairs_)

    what = "notifications sent to the console channel" if send else "planned, no channel"
    print(
        f"\n{backend}, {what}: medians of {pairs} alternating triples of bursts of {burst} "
        "50-alert webhooks, per webhook"
    )
    print("                    wall ms   CPU ms   (ratio to fresh: wall, CPU; medians of pairs)")
    for kind in ("fresh", "resend", "recorded", "healthz", "idle"):
        line = f"  {kind:9s}   {med(kind, 0) * 1e3:9.2f} {med(kind, 1) * 1e3:8.2f}"
        if kind in ("resend", "recorded"):
            line += f"   {ratio(kind, 0):.3f}  {ratio(kind, 1):.3f}"
        print(line)
    print(
        f"  goal: resend <= 0.10 of fresh; the resends' receipt counts, written once a second "
        f"for all of that second: {write_s * 1e3:.2f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--pairs", type=int, default=30, help="measured triples per backend")
    parser.add_argument("--burst", type=int, default=5, help="webhooks per measurement")
    parser.add_argument(
        "--send",
        choices=("no", "console", "both"),
        default="both",
        help="no: route to no channel (fresh = intake + policy); console: and send its "
        "notifications to the console channel",
    )
    args = parser.parse_args()
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    sends = {"no": (False,), "console": (True,), "both": (False, True)}[args.send]
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            for send in sends:
                bench(backend, args.pairs, args.burst, Path(tmp), send)
    return 0


if __name__ == "__main__":
    sys.exit(main())
