"""A job's probes cannot take the gateway's memory: dumps are read in a stream, cut at the
cap while they are read, within a byte budget per diagnosis and in total.

Through the real gateway (a subprocess, SQLite, the shipped diagnosis defaults) with two
ranks whose probes answer `/dump` with 400 MiB (one declaring its length, one chunked, as
a probe that lies would), and the chart's memory limit for the gateway (768Mi): the
gateway's peak resident memory (VmHWM) stays under it, and the verdict says why those
ranks were not read.

About 30 s on the shared machine: a gateway subprocess and 128 MiB streamed over loopback.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.support.gateway_process import settled_rss, start_gateway
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.diagnostics.synthetic import make_dump

pytestmark = [pytest.mark.e2e]

TOKEN = "gw-token"
CHART_LIMIT = 768 * 1024 * 1024
HANG = {"alertname": "TrainingJobHang", "priority": "P0", "trainingjob": "llama", "namespace": "ml"}
CHUNK = b" " * (1 << 20)


def chart_memory_limit() -> int:
    """The gateway's memory limit in the chart's values (bytes)."""
    values = yaml.safe_load(Path("charts/trainsentry/values.yaml").read_text())
    limit = str(values["gateway"]["resources"]["limits"]["memory"])
    assert limit.endswith("Mi"), limit
    return int(limit[:-2]) * 1024 * 1024


async def huge_probe(rank: int, *, declared: bool) -> web.AppRunner:
    """A probe answering `/dump` with 400 MiB (JSON-looking whitespace), streamed."""

    async def dump(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"X-Trainsentry-Rank": str(rank)})
        if declared:
            response.content_length = 400 * len(CHUNK)
        await response.prepare(request)
        try:
            await response.write(b'{"version": "2.10", "entries": [')
            for _ in range(400):
                await response.write(CHUNK)
            await response.write(b"]}")
        except (ConnectionError, RuntimeError):
            pass  # the gateway stopped reading: what it must do
        return response

    return await _serve(dump)


async def small_probe(rank: int) -> web.AppRunner:
    data = json.dumps(make_dump(rank, 4, 30, scenario="hang", culprit=3)).encode()

    async def dump(request: web.Request) -> web.Response:
        return web.Response(body=data, headers={"X-Trainsentry-Rank": str(rank)})

    return await _serve(dump)


async def _serve(handler: Any) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/dump", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_two_ranks_answering_400_mib_dumps_keep_the_gateway_under_the_charts_limit(
    tmp_path: Path,
) -> None:
    assert chart_memory_limit() == CHART_LIMIT
    probes = [await huge_probe(0, declared=True), await huge_probe(1, declared=False)]
    probes += [await small_probe(2), await small_probe(3)]
    endpoints = [f"127.0.0.1:{p.addresses[0][1]}" for p in probes]
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"diagnosis": {"static_endpoints": {"ml/llama": endpoints}}}))
    env = {"TRAINSENTRY_PROBE_TOKEN": "probe-token"}
    try:
        with start_gateway(
            tmp_path, f"sqlite:///{tmp_path / 'gw.db'}", token=TOKEN, config=config, env=env
        ) as gw:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            await asyncio.to_thread(settled_rss, gw.process.pid)  # the analyzer imported
            before = peak_rss(gw.process.pid)
            async with aiohttp.ClientSession(headers=headers) as http:
                body = encode(make_body([make_alert(1, name="TrainingJobHang", labels=HANG)]))
                async with http.post(f"{gw.url}/api/v1/alertmanager", data=body) as answer:
                    assert answer.status == 200
                verdict = await _verdict(http, gw.url)
            peak = peak_rss(gw.process.pid)
    finally:
        for probe in probes:
            await probe.cleanup()
    print(f"gateway peak RSS {peak / 2**20:.0f} MiB, {before / 2**20:.0f} MiB before")
    assert peak < CHART_LIMIT, f"gateway peak RSS {peak / 2**20:.0f} MiB"
    # no dump is held whole: the diagnosis adds well under one dump cap (64 MiB) of memory
    assert peak - before < 64 * 2**20, f"{(peak - before) / 2**20:.0f} MiB more"
    failed = " | ".join(verdict["ranks_failed"])
    assert "rank 0" in failed and "rank 1" in failed and "too large" in failed, failed
    # named only from a dump that was read: rank 3 never entered, ranks 0 and 1 unread
    assert verdict["culprit_ranks"] == [3], verdict["summary"]


async def _verdict(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        async with http.get(f"{url}/api/v1/alerts") as answer:
            items = (await answer.json())["items"]
        if items and items[0].get("verdict"):
            verdict: dict[str, Any] = items[0]["verdict"]
            return verdict
        await asyncio.sleep(0.2)
    raise AssertionError("no verdict stored")
