"""A small gloo job that leaves Flight Recorder dumps behind, one scenario per run.

`launch(scenario, outdir, port)` (or `python fr_job.py SCENARIO OUTDIR PORT`) starts the
4 ranks as separate processes. Each runs a few all_reduces, the scenario's fault happens on
the last one, and every rank writes its dump to OUTDIR (`fr_rank_<r>.json`, or `.pkl` for
the size scenario) and exits without waiting for the stuck collective.

`lost` is `hang` plus what a gloo dump needs to be read without its skipper's file: each
round also all_gathers on the world (gloo records the output as `[world, numel]`, the only
place a gloo dump states a group's size; its `pg_config` names no group), and ranks 1-3
share a subgroup whose last all_reduce rank 3 skips too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

WORLD_SIZE = 4
ROUNDS = 30
HANG_SKIPPER = 3
SIZE_CULPRIT = 2
SLOW_RANK = 1
SLOW_SLEEP_S = 0.03
IDLE_BEFORE_DUMP_S = 3.0
SUBGROUP = (1, 2, 3)


def worker(rank: int, scenario: str, outdir: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    tensor = torch.ones(16)
    sub = dist.new_group(list(SUBGROUP)) if scenario == "lost" else None  # all ranks call it
    gathered = [torch.empty(16) for _ in range(WORLD_SIZE)]
    rounds = ROUNDS if scenario == "slow" else 10
    for _ in range(rounds):
        if scenario == "slow" and rank == SLOW_RANK:
            time.sleep(SLOW_SLEEP_S)
        dist.all_reduce(tensor)
        if scenario == "lost":
            dist.all_gather(gathered, tensor)
            if rank in SUBGROUP:
                dist.all_reduce(tensor, group=sub)
    if scenario in ("hang", "lost"):
        if rank != HANG_SKIPPER:
            dist.all_reduce(tensor, async_op=True)
            if scenario == "lost" and rank in SUBGROUP:
                dist.all_reduce(tensor, group=sub, async_op=True)
        time.sleep(IDLE_BEFORE_DUMP_S)
    c10d = torch._C._distributed_c10d
    if scenario == "size":
        # gloo aborts the process once it sees the bad size, so the other ranks enqueue and
        # dump first; the culprit enqueues its differently sized tensor and dumps last.
        store = dist.distributed_c10d._get_default_store()
        if rank != SIZE_CULPRIT:
            dist.all_reduce(torch.ones(16), async_op=True)
        else:
            while store.add("dumped", 0) < WORLD_SIZE - 1:
                time.sleep(0.01)
            dist.all_reduce(torch.ones(24), async_op=True)
        data = c10d._dump_fr_trace(True, True)
        Path(outdir, f"fr_rank_{rank}.pkl").write_bytes(data)
        store.add("dumped", 1)
        time.sleep(IDLE_BEFORE_DUMP_S)
    else:
        text = c10d._dump_fr_trace_json(True, True)
        mode = "wb" if isinstance(text, bytes) else "w"
        with open(Path(outdir, f"fr_rank_{rank}.json"), mode) as handle:
            handle.write(text)
    sys.stdout.flush()
    os._exit(0)  # a hung collective must not block process-group teardown


def launch(scenario: str, outdir: str, port: int, timeout_s: float = 120.0) -> list[int]:
    """Start the 4 ranks as separate processes (one rank's abort must not kill the others)."""
    from tests.support.ranks import run_ranks

    env = {"TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
    return run_ranks(__file__, WORLD_SIZE, [scenario, outdir, str(port)], env, timeout_s)


def main() -> None:
    if sys.argv[1] == "--rank":
        worker(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        print(launch(sys.argv[1], sys.argv[2], int(sys.argv[3])))


if __name__ == "__main__":
    main()
