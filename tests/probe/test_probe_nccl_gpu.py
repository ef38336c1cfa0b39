"""The probe in a real NCCL job on a GPU (skipped without CUDA; CI has no GPU).

Four NCCL ranks share the machine's one GPU (each its own NCCL_HOSTID, sockets on lo), each
started the documented way (`TRAINSENTRY_PROBE=1 python -m trainsentry.probe.launch`). Rank
2 stops before an all_reduce its peers enter. What the issue measured before: every probe
said healthy with no process group for minutes. Here the peers must show the collective in
flight, the stalled rank must show itself behind, /dump must hold NCCL's entries, and the
time from the stall to that picture is printed (docs/probe.md quotes it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx
import pytest

from probe.probe_harness import TOKEN, GlooJob

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.torch, pytest.mark.e2e]
if not torch.cuda.is_available():
    pytest.skip("needs an NVIDIA GPU (CUDA): CI has none", allow_module_level=True)

WORLD, STALL_RANK, STALL_STEP = 4, 2, 5


def test_nccl_hang_is_seen_by_the_probe_within_seconds(
    gloo_job: Callable[..., GlooJob],
) -> None:
    job = gloo_job(
        WORLD,
        BACKEND="nccl",
        STALL_RANK=str(STALL_RANK),
        STALL_STEP=str(STALL_STEP),
        TRAINSENTRY_PROBE_INTERVAL="1",
        TORCH_NCCL_ASYNC_ERROR_HANDLING="0",
    )
    peers = [r for r in range(WORLD) if r != STALL_RANK]
    expected_seq = 2 * STALL_STEP + 1
    started = time.monotonic()
    statuses: dict[int, dict] = {}
    while time.monotonic() - started < 120:
        statuses = {
            r: httpx.get(f"http://127.0.0.1:{job.ports[r]}/status", timeout=5).json()
            for r in range(WORLD)
        }
        flights = [statuses[r]["process_groups"].get("0", {}).get("in_flight") for r in peers]
        if all(f and f["seq"] == expected_seq for f in flights):
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"peers never showed #{expected_seq} in flight: {statuses}")
    print(f"stall -> /status shows the waiting ranks: {time.monotonic() - started:.1f} s")
    for rank in peers:
        group = statuses[rank]["process_groups"]["0"]
        assert group["backend"] == "nccl" and group["pg_desc"] == "default_pg"
        assert group["in_flight"]["op"] == "all_reduce"
        assert statuses[rank]["healthy"] is True
        assert "nccl" in statuses[rank]["recorders"]
    absent = statuses[STALL_RANK]["process_groups"]["0"]
    assert absent["in_flight"] is None and absent["last_enqueued"] == expected_seq - 1
    dump = httpx.get(
        f"http://127.0.0.1:{job.ports[0]}/dump",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    assert dump.status_code == 200
    entries = json.loads(dump.content)["entries"]
    assert any(e["profiling_name"] == "nccl:all_reduce" for e in entries)
