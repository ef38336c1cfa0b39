"""End-to-end latency: webhook POST → first channel request, and a storm's message count.

A real gateway process (SQLite) sends to a "feishu" webhook channel pointed at a local
receiver. The baseline is the same client POSTing the same body straight to the receiver
(one loopback HTTP hop), measured in the same run.

1. No storm: single-alert webhooks of distinct jobs at a steady rate; latency from the POST to
   the receiver seeing the notification. Target p99 < 200 ms.
2. Storm: 20,000 alerts for one job across 1,000 nodes, 50 per webhook, 8 webhooks in flight;
   how many messages reach the chat channel per minute, and whether all 20,000 are stored.
   Right after the storm's last webhook, one P0 and one P2 alert of another job arrive
   together: the P0's latency (claimed first from the policy inbox) against the P2's (behind
   the storm's backlog, which is P2 too).

    .venv/bin/python -m bench.bench_notify_latency [--alerts 200] [--storm 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from bench.bench_intake import inbox_depth_in, journal_depth_in
from tests.support.ports import free_port


class Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}  # alert fingerprint -> first arrival
        self.messages: list[tuple[float, str]] = []  # (arrival, kind)

    async def handle(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        body = await request.json()
        payload = body.get("payload") or {}
        self.messages.append((now, body.get("kind", "")))
        key = payload.get("fingerprint") or body.get("idempotency_key", "")
        self.arrivals.setdefault(key, now)
        return web.json_response({"ok": True})


def alert(n: int, job: str, node: str, start: datetime, priority: str = "P2") -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": "GPUXidApplicationError", "priority": priority, "trainingjob": job,
                   "namespace": "ml", "node": node, "gpu": str(n % 8)},
        "annotations": {"summary": f"XID 13 on {node}"},
        "startsAt": (start + timedelta(milliseconds=n)).isoformat(),
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"{n:016x}",
    }  # fmt: skip


def body(alerts: list[dict[str, Any]]) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "ts", "groupKey": "g",
                       "alerts": alerts}).encode()  # fmt: skip


def start_gateway(tmp: Path, receiver_url: str) -> tuple[subprocess.Popen[bytes], str]:
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump({"webhooks": {"feishu": {"url": receiver_url}}}))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"127.0.0.1:{port}",
         "--db", f"sqlite:///{tmp / 'bench.db'}", "--config", str(config),
         "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("gateway did not start")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(args: argparse.Namespace) -> None:
    receiver = Receiver()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/hook", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hook = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    start = datetime.now(UTC) - timedelta(minutes=5)
    with tempfile.TemporaryDirectory() as folder:
        proc, gateway = await asyncio.to_thread(start_gateway, Path(folder), hook)
        try:
            async with aiohttp.ClientSession() as session:
                # baseline: the same client straight to the receiver
                base: list[float] = []
                for n in range(args.alerts):
                    payload = json.dumps({"kind": "alert", "payload": {"fingerprint": f"b{n}"}})
                    t0 = time.perf_counter()
                    async with session.post(hook, data=payload) as response:
                        await response.read()
                    base.append(time.perf_counter() - t0)
                # no storm: one alert per webhook, a different job each time, 20 per second
                sent: dict[str, float] = {}
                for n in range(args.alerts):
                    item = alert(n, f"job-{n}", f"node-{n}", start)
                    sent[item["fingerprint"]] = time.perf_counter()
                    async with session.post(
                        f"{gateway}/api/v1/alertmanager", data=body([item])
                    ) as r:
                        assert r.status == 200, await r.text()
                    await asyncio.sleep(0.05)
                await asyncio.sleep(2)
                latencies = [
                    receiver.arrivals[k] - t for k, t in sent.items() if k in receiver.arrivals
                ]
                print(f"no storm: {len(latencies)}/{len(sent)} delivered")
                print(
                    f"  webhook -> first channel request  p50 {pct(latencies, 0.5) * 1e3:7.1f} ms"
                    f"  p99 {pct(latencies, 0.99) * 1e3:7.1f} ms"
                )
                print(
                    f"  baseline (direct POST)          p50 {pct(base, 0.5) * 1e3:7.1f} ms"
                    f"  p99 {pct(base, 0.99) * 1e3:7.1f} ms"
                )
                # storm: one job, 1,000 nodes
                receiver.messages.clear()
                t_storm = time.perf_counter()
                offset = 10**6
                storm = [
                    alert(offset + n, "llama-storm", f"node-{n % 1000:04d}", start)
                    for n in range(args.storm)
                ]
                posts = [body(storm[i : i + 50]) for i in range(0, len(storm), 50)]

                async def poster() -> None:
                    while posts:
                        async with session.post(
                            f"{gateway}/api/v1/alertmanager", data=posts.pop(0)
                        ) as r:
                            assert r.status == 200

                await asyncio.gather(*(poster() for _ in range(args.concurrency)))
                posted_s = time.perf_counter() - t_storm
                # behind the storm: a P0 and a P2 of another job in one webhook
                urgent = alert(2 * offset, "other-job", "node-p0", start, priority="P0")
                usual = alert(2 * offset + 1, "other-job", "node-p2", start)
                t_pair = time.perf_counter()
                async with session.post(
                    f"{gateway}/api/v1/alertmanager", data=body([usual, urgent])
                ) as r:
                    assert r.status == 200
                async with session.get(f"{gateway}/metrics") as response:
                    text = await response.text()
                    backlog = inbox_depth_in(text) + journal_depth_in(text)
                await asyncio.sleep(args.settle)
                per_minute: dict[int, int] = {}
                for at, _kind in receiver.messages:
                    minute = int((at - t_storm) // 60)
                    per_minute[minute] = per_minute.get(minute, 0) + 1
                async with session.get(f"{gateway}/metrics") as response:
                    metrics = await response.text()
                stored = next(
                    float(line.split()[-1])
                    for line in metrics.splitlines()
                    if line.startswith("trainsentry_alerts_stored_total ")
                )
                print(
                    f"storm: {args.storm} alerts posted in {posted_s:.1f} s "
                    f"({args.storm / posted_s:.0f} alerts/s, {args.concurrency} concurrent posts); "
                    f"stored {stored - args.alerts - 2:.0f}"
                )
                print(
                    f"  chat messages: {len(receiver.messages)} in all; per minute "
                    f"{[per_minute.get(m, 0) for m in range(max(per_minute, default=0) + 1)]}"
                )
                print(f"  max per minute {max(per_minute.values(), default=0)} (target <= 100)")
                print(f"behind the storm ({backlog:.0f} changes waiting for the policy):")
                for name, item in (("P0", urgent), ("P2", usual)):
                    arrived = receiver.arrivals.get(item["fingerprint"])
                    shown = (
                        "not delivered" if arrived is None else f"{(arrived - t_pair) * 1e3:.0f} ms"
                    )
                    print(f"  {name} of another job: webhook -> first channel request {shown}")
        finally:
            proc.terminate()
            proc.wait(30)
            await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alerts", type=int, default=200)
    parser.add_argument("--storm", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=8, help="storm posts in flight")
    parser.add_argument("--settle", type=float, default=70.0, help="seconds to wait for summaries")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
