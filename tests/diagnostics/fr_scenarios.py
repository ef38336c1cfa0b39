"""Real multi-process gloo jobs, one per hang/mismatch class, that leave Flight Recorder dumps.

`generate(scenario, outdir)` (or `python fr_scenarios.py SCENARIO OUTDIR`) starts the ranks as
separate processes. Each rank runs the scenario's program step by step; every collective is
issued with `async_op=True` and polled: one that does not complete within `BLOCK_S` is where
the rank is stuck, so it stops issuing (as a blocking call would) and, after `IDLE_S`, writes
its dump three ways:

- `json/fr_rank_<r>.json`: `_dump_fr_trace_json` as torch writes it (gloo: `pg_config` names
  no group, `pg_status` is keyed by the rank's local `pg_id`);
- `pkl/fr_rank_<r>`: `_dump_fr_trace` (pickle), as torch writes it;
- `pgcfg/fr_rank_<r>`: the same pickle with an NCCL-style `pg_config` (group name -> name,
  desc, ranks) of the groups this rank created, from torch's own `get_process_group_ranks`
  (gloo records none; NCCL does, and PyTorch's `fr_trace` needs it).

Groups are made with `new_group` in one global order on every rank, so their names are a
global counter while each rank's local `pg_id` counts only its own groups.

Scenarios (rank numbers are global):
- `tpdp`: 8 ranks, TP pairs {0,1},{2,3},{4,5},{6,7}, DP groups {0,2,4,6},{1,3,5,7}; each
  step is a TP all_reduce, two DP all_reduces (gradient buckets), a world all_reduce, so a
  rank's DP group is ahead of its TP group in sequence numbers. In step 4 rank 3 stops before its
  TP all_reduce: rank 2 waits on TP, the others block behind it.
- `rooted`: 4 ranks, a healthy job: gather/scatter/reduce/broadcast to root 0 and
  all_to_all_single with uneven splits, then an all_reduce. Nothing is wrong.
- `split`: 4 ranks, {0,1} and {2,3} (what `split_group` makes; gloo on a CPU cannot split,
  so the test renames both to one name as split_group records them). {0,1} all_reduce 8
  floats three times, {2,3} 4 floats; rank 3 stops before the third.
- `cascade`: 8 ranks, sub-group {4,5,6,7}; each step is a sub-group all_reduce (members) then
  a world all_reduce. In step 3 rank 6 skips the sub-group all_reduce and goes on to the
  world one: 4, 5 and 7 wait for it in the sub-group, everyone else waits in the world.
- `size`: 4 ranks, three all_reduces of 8 floats, then rank 2 all_reduces 12 (a size
  mismatch; gloo aborts it right after, so the others dump first).

(gloo records no send/recv in the Flight Recorder, so pipeline hangs are tested on the real
NCCL dumps in tests/fixtures/nccl/pp instead.)
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path

BLOCK_S = 1.5
IDLE_S = 2.5
WORLD = {"tpdp": 8, "rooted": 4, "split": 4, "cascade": 8, "size": 4}
SIZE_CULPRIT = 2
SPLIT_NAME = "1"  # what split_group would name both halves (the first group after the world)


def _run(rank: int, scenario: str, outdir: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    world = WORLD[scenario]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    mine: list[object] = []

    def group(ranks: list[int], desc: str) -> object:
        pg = dist.new_group(ranks, group_desc=desc)  # every rank calls it, in one order
        if rank in ranks:
            mine.append(pg)
        return pg

    def done(work: object) -> bool:
        deadline = time.monotonic() + BLOCK_S
        while time.monotonic() < deadline:
            if work.is_completed():  # type: ignore[attr-defined]
                return True
            time.sleep(0.005)
        return False

    t = torch.ones(8)
    if scenario == "tpdp":
        tps = [group([2 * i, 2 * i + 1], f"tp-{i}") for i in range(4)]
        dps = [group([i, i + 2, i + 4, i + 6], f"dp-{i}") for i in range(2)]
        tp, dp = tps[rank // 2], dps[rank % 2]
        for step in range(1, 5):
            if step == 4 and rank == 3:
                break
            if not done(dist.all_reduce(t, group=tp, async_op=True)):
                break
            if not done(dist.all_reduce(t, group=dp, async_op=True)):
                break
            if not done(dist.all_reduce(t, group=dp, async_op=True)):
                break
            if not done(dist.all_reduce(t, async_op=True)):
                break
    elif scenario == "rooted":
        t4 = torch.ones(4)
        outs = [torch.empty(4) for _ in range(world)] if rank == 0 else None
        works = [dist.gather(t4, outs, dst=0, async_op=True)]
        ins = [torch.ones(4) for _ in range(world)] if rank == 0 else None
        works.append(dist.scatter(torch.empty(4), ins, src=0, async_op=True))
        works.append(dist.reduce(t4, dst=0, async_op=True))
        works.append(dist.broadcast(t4, src=0, async_op=True))
        # MoE-style uneven splits: rank r sends r + 1 + j elements to rank j.
        send = [rank + 1 + j for j in range(world)]
        recv = [j + 1 + rank for j in range(world)]
        a2a_in, a2a_out = torch.ones(sum(send)), torch.empty(sum(recv))
        works.append(dist.all_to_all_single(a2a_out, a2a_in, recv, send, async_op=True))
        works.append(dist.all_reduce(t, async_op=True))
        for work in works:
            done(work)
    elif scenario == "split":
        a, b = group([0, 1], "tp"), group([2, 3], "tp")
        pg, tensor = (a, torch.ones(8)) if rank < 2 else (b, torch.ones(4))
        for step in range(1, 4):
            if step == 3 and rank == 3:
                break
            if not done(dist.all_reduce(tensor, group=pg, async_op=True)):
                break
    elif scenario == "cascade":
        sub = group([4, 5, 6, 7], "sub")
        for step in range(1, 4):
            skips = step == 3 and rank == 6
            if rank >= 4 and not skips and not done(dist.all_reduce(t, group=sub, async_op=True)):
                break
            if not done(dist.all_reduce(t, async_op=True)):
                break
    elif scenario == "size":
        for _ in range(3):
            done(dist.all_reduce(t, async_op=True))
        store = dist.distributed_c10d._get_default_store()
        if rank == SIZE_CULPRIT:
            # gloo aborts the process once it sees the bad size: the others dump first, the
            # culprit enqueues its larger tensor and dumps at once.
            while store.add("dumped", 0) < world - 1:
                time.sleep(0.01)
            dist.all_reduce(torch.ones(12), async_op=True)
        else:
            dist.all_reduce(t, async_op=True)
    if not (scenario == "size" and rank == SIZE_CULPRIT):
        time.sleep(IDLE_S)
    _dump(rank, outdir, mine)
    # No rank may exit before every rank has dumped: a closed connection fails the peers'
    # pending gloo ops, which the recorder then marks retired.
    store = dist.distributed_c10d._get_default_store()
    store.add("dumped", 1)
    deadline = time.monotonic() + 30
    while store.add("dumped", 0) < world and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.stdout.flush()
    os._exit(0)  # a stuck collective must not block teardown


def _dump(rank: int, outdir: str, groups: list[object]) -> None:
    import torch
    import torch.distributed as dist

    c10d = torch._C._distributed_c10d
    text = c10d._dump_fr_trace_json(True, True)
    raw = c10d._dump_fr_trace(True, True)
    world = dist.group.WORLD
    config = {}
    for pg in [world, *groups]:
        name = dist.distributed_c10d._get_process_group_name(pg)  # type: ignore[arg-type]
        desc = pg.group_desc  # type: ignore[union-attr]
        ranks = dist.get_process_group_ranks(pg)  # type: ignore[arg-type]
        config[name] = {"name": name, "desc": desc, "ranks": str(sorted(ranks))}
    dump = pickle.loads(raw)
    dump["pg_config"] = config
    for sub, name, data in (
        ("json", f"fr_rank_{rank}.json", text if isinstance(text, bytes) else text.encode()),
        ("pkl", f"fr_rank_{rank}", raw),
        ("pgcfg", f"fr_rank_{rank}", pickle.dumps(dump)),
    ):
        Path(outdir, sub).mkdir(parents=True, exist_ok=True)
        Path(outdir, sub, name).write_bytes(data)


def generate(scenario: str, outdir: str, port: int, timeout_s: float = 120.0) -> list[int]:
    """Run one scenario's ranks as separate processes; their return codes."""
    from tests.support.ranks import run_ranks

    env = {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "OMP_NUM_THREADS": "1",
    }
    codes = run_ranks(__file__, WORLD[scenario], [scenario, outdir, str(port)], env, timeout_s)
    Path(outdir, "codes.json").write_text(json.dumps(codes))
    return codes


def main() -> None:
    if sys.argv[1] == "--rank":
        _run(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        print(generate(sys.argv[1], sys.argv[2], int(sys.argv[3])))


if __name__ == "__main__":
    main()
