"""Hang enrichment: bounded fetching over real HTTP, and the card sentence (pure)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from probe.probe_harness import free_port

from trainsentry.gateway.stages.hang.enrichment import (
    PodAddress,
    RankEndpoint,
    culprit_ranks,
    endpoints_for_pods,
    enrich_hang,
    fetch_dumps,
    summarize,
)

IDS = {13: ("llama-w-13", "gpu-07"), 4: ("llama-w-4", "gpu-02"), 5: ("llama-w-5", "")}


def hang_report(**hang: Any) -> dict[str, Any]:
    base = {
        "communicator": "7",
        "description": "tp-3",
        "op": "all_reduce 1024 Float",
        "seq": 4812,
        "missing_ranks": [13],
        "ranks_without_dump": [],
        "arrived_count": 15,
        "waited_s": 312.4,
    }
    base.update(hang)
    return {"verdict": "hang", "hang": base, "ranks": 16}


def test_summary_names_the_rank_that_never_arrived() -> None:
    assert summarize(hang_report(), IDS) == (
        "rank 13 (pod llama-w-13, node gpu-07) never entered all_reduce #4812 of pg tp-3; "
        "15 ranks waiting 312 s"
    )


def test_summary_variants() -> None:
    many = summarize(hang_report(missing_ranks=[4, 5, 13, 14], arrived_count=1), IDS)
    assert many.startswith(
        "rank 4 (pod llama-w-4, node gpu-02), rank 5 (pod llama-w-5), "
        "rank 13 (pod llama-w-13, node gpu-07) and 1 more never entered"
    )
    assert many.endswith("; 1 rank waiting 312 s")
    no_dump = summarize(hang_report(missing_ranks=[], ranks_without_dump=[13]), IDS)
    assert no_dump.startswith("all_reduce #4812 of pg tp-3 is stuck; rank 13 (pod llama-w-13")
    no_desc = summarize(hang_report(description="", waited_s=None), {})
    assert no_desc == "rank 13 never entered all_reduce #4812 of pg 7; 15 ranks waiting"
    mismatch = {
        "verdict": "mismatch",
        "mismatches": [
            {
                "communicator": "0",
                "seq": 9,
                "kind": "op",
                "culprit_ranks": [4],
                "expected": "all_reduce",
                "found": "all_gather",
            },
        ],
    }
    assert summarize(mismatch, IDS) == (
        "rank 4 (pod llama-w-4, node gpu-02) called all_gather where peers called "
        "all_reduce at #9 of pg 0 (op mismatch)"
    )
    assert culprit_ranks(mismatch) == (4,)
    slow = {"verdict": "slow", "slow_ranks": [{"rank": 5, "lag_ms": 41.7}]}
    assert summarize(slow, IDS) == (
        "no hang in the dumps; rank 5 (pod llama-w-5) is persistently last to arrive (lag 42 ms)"
    )
    assert culprit_ranks(slow) == (5,)
    assert summarize({"verdict": "ok", "ranks": 8}, {}) == (
        "no hang visible in the Flight Recorder dumps of 8 ranks"
    )
    assert culprit_ranks(hang_report()) == (13,)


class SlowProbes:
    """A real HTTP server standing in for many rank probes; counts concurrency."""

    def __init__(self) -> None:
        self.active = 0
        self.max_active = 0

    async def dump(self, request: web.Request) -> web.Response:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            rank = int(request.match_info["rank"])
            await asyncio.sleep(30 if rank == 99 else 0.2)
            if request.headers.get("Authorization") != "Bearer t":
                return web.Response(status=401)
            return web.Response(
                body=b'{"entries": [], "version": "2.10"}',
                headers={"X-Trainsentry-Rank": str(rank), "X-Trainsentry-Pod": f"p-{rank}"},
            )
        finally:
            self.active -= 1


@pytest.fixture
async def probes() -> AsyncIterator[tuple[SlowProbes, str]]:
    state = SlowProbes()
    app = web.Application()
    app.router.add_get("/r/{rank}/dump", state.dump)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield state, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_fetch_is_bounded_and_partial(probes: tuple[SlowProbes, str]) -> None:
    state, base = probes
    endpoints = [RankEndpoint(f"{base}/r/{rank}", rank=rank) for rank in range(6)]
    endpoints.append(RankEndpoint(f"{base}/r/99", pod="stuck-pod", rank=99))
    endpoints.append(RankEndpoint(f"127.0.0.1:{free_port()}", rank=7))  # nobody listens
    started = time.monotonic()
    results = await fetch_dumps(endpoints, "t", timeout_s=1.0, deadline_s=3.0, concurrency=2)
    elapsed = time.monotonic() - started
    assert elapsed < 4.0
    assert state.max_active <= 2
    by_rank = {r.rank: r for r in results}
    assert all(by_rank[r].ok and by_rank[r].pod == f"p-{r}" for r in range(6))
    assert by_rank[99].error in {"timeout", "deadline"}
    assert by_rank[99].pod == "stuck-pod"
    assert by_rank[7].error == "ConnectError"


async def test_enrich_with_no_usable_dump_is_unknown_not_an_error(
    probes: tuple[SlowProbes, str],
) -> None:
    _state, base = probes
    endpoints = [RankEndpoint(f"{base}/r/{rank}", rank=rank) for rank in range(3)]
    verdict = await enrich_hang("ns/job", endpoints, "wrong", timeout_s=1, deadline_s=3)
    assert verdict.verdict == "unknown"
    assert verdict.ranks_failed == tuple(f"rank {r}: HTTP 401" for r in range(3))
    assert (await enrich_hang("ns/job", [], "t")).summary.startswith("no rank answered")


def test_endpoints_for_pods() -> None:
    pods = [PodAddress("w-0", "10.0.0.1", "gpu-01"), PodAddress("w-1", "", "gpu-02")]
    endpoints = endpoints_for_pods(pods, base_port=9401, ranks_per_pod=2)
    assert [(e.base_url, e.pod, e.node, e.rank) for e in endpoints] == [
        ("http://10.0.0.1:9401", "w-0", "gpu-01", None),
        ("http://10.0.0.1:9402", "w-0", "gpu-01", None),
    ]  # a pod without an IP (not scheduled yet) has no probe to ask
