"""The incident console's Now page with 1,000 open alerts: server time and browser time.

A real in-process gateway on a SQLite file holds 1,000 firing alerts (20 training jobs,
250 nodes, 8 GPUs each, every priority, a few acked), planned by the real policy. Timed:
- `GET /ui/` over loopback HTTP: the store read, the grouping and the rendered HTML, whole;
- baseline in the same run: `GET /api/v1/alerts?status=firing&limit=1000`, the read API's
  JSON of the same alerts (the store read and a serialisation, no view and no HTML);
- with Chromium present (the Debian package): navigation to the load event of `/ui/` in
  headless Chromium (tests/support/browser.py): fetched, parsed, styled, laid out.

Medians of `--rounds`; target: the page renders in under 1 s.

    .venv/bin/python -m bench.bench_console [--alerts 1000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer

from tests.support.browser import CHROMIUM, Browser
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.config import GatewaySettings
from trainsentry.gateway.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.console import ConsoleNotifier

PRIORITIES = ("P0", "P1", "P2", "P3")


def alerts(count: int) -> list[dict[str, object]]:
    return [
        make_alert(
            i,
            name=("GPUXidError", "IBLinkFlapping", "NodeDiskFull", "TrainingJobHang")[i % 4],
            labels={
                "priority": PRIORITIES[i % 4],
                "trainingjob": f"job-{i % 20:02d}",
                "namespace": ("ml", "research")[i % 2],
                "node": f"gpu-{i % 250:04d}",
                "gpu": str(i % 8),
                "component": ("gpu", "fabric", "node", "training")[i % 4],
            },
        )
        for i in range(count)
    ]


async def timed_get(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.get(url) as response:
        body = await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started, len(body)


async def run(count: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = GatewaySettings(listen="127.0.0.1:0", db=f"sqlite:///{Path(tmp) / 's.db'}")
        app = create_app(
            settings, notifiers={"console": ConsoleNotifier(Path(tmp) / "c.jsonl")},
            tick_interval=3600,
        )  # fmt: skip
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            all_alerts = alerts(count)
            async with aiohttp.ClientSession() as session:
                for start in range(0, count, 100):
                    body = make_body(all_alerts[start : start + 100], group_key=f"g{start}")
                    async with session.post(server.make_url(WEBHOOK_PATH), data=encode(body)) as r:
                        assert r.status == 200
                await app[GATEWAY_KEY].settle()
                page_url = str(server.make_url("/ui/"))
                api_url = str(server.make_url("/api/v1/alerts?status=firing&limit=1000"))
                page, api = [], []
                size = 0
                for _ in range(rounds):  # alternating, so both see the same machine load
                    seconds, size = await timed_get(session, page_url)
                    page.append(seconds)
                    api.append((await timed_get(session, api_url))[0])
            figures = {
                "page_s": statistics.median(page),
                "api_s": statistics.median(api),
                "page_kb": size / 1024,
            }
            if CHROMIUM is not None:
                figures["browser_s"] = await browser_load(Path(tmp), page_url, rounds)
            return figures
        finally:
            await server.close()


async def browser_load(workdir: Path, url: str, rounds: int) -> float:
    async with Browser.launch(workdir) as tab:
        await tab.goto(url)  # warm: the first navigation starts the renderer
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            await tab.goto(url)
            count = await tab.evaluate("document.querySelectorAll('a.card').length")
            times.append(time.perf_counter() - started)
        assert count > 0
        return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args.alerts, args.rounds))
    print(f"open alerts: {args.alerts}, rounds: {args.rounds} (medians)")
    print(f"GET /ui/ (server, whole page):  {figures['page_s'] * 1000:8.1f} ms"
          f"  ({figures['page_kb']:.0f} KiB of HTML)")  # fmt: skip
    print(f"GET /api/v1/alerts (baseline):  {figures['api_s'] * 1000:8.1f} ms")
    print(f"ratio page / API:               {figures['page_s'] / figures['api_s']:8.2f}")
    if "browser_s" in figures:
        print(f"Chromium: navigation to load:   {figures['browser_s'] * 1000:8.1f} ms")
        ok = figures["browser_s"] < 1.0
    else:
        print("Chromium: not installed, browser time not measured")
        ok = figures["page_s"] < 1.0
    print(f"target < 1 s: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
