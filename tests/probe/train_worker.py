"""A tiny gloo training loop run by the probe tests (one process per rank).

Run through the launcher hook: `TRAINSENTRY_PROBE=1 python -m trainsentry.probe.launch
train_worker.py`. Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus
  PORT_DIR     the rank writes its probe port to PORT_DIR/port.<rank>
  STALL_RANK   this rank stops before the collective of step STALL_STEP (-1: nobody)
  STALL_STEP   the step at which STALL_RANK stops
  STALL_AFTER  seconds of training after which STALL_RANK stops instead (rank 0 decides the
               step and broadcasts it, so every rank agrees)
  STALL_RANKS  more ranks that stop at STALL_STEP in their own place: read_shard() (sleep mode)
  SLOW_RANK    this rank sleeps SLOW_SECONDS before every step's collectives (fail-slow)
  Each rank that stops writes the unix time to PORT_DIR/stalled.<rank> first.
  STEPS        steps to run (default: forever, until killed)
  BACKEND      "nccl": NCCL on the one GPU of the machine, every rank pretending to be its own
               host (NCCL_HOSTID) and talking over sockets on lo. Default gloo on the CPU.
  STALL_MODE   "sleep" (default): STALL_RANK sleeps for ever in load_batch() before the
               collective. "save": at STALL_STEP, STALL_RANK runs torch.save into a file that
               takes STALL_SECONDS to write while the others wait in a barrier, then all go on.
               "phase": the same, but the pause is time.sleep inside
               trainsentry.probe.phase("checkpoint").
  THEN_STALL_RANK   after a "save"/"phase" pause ends, this rank stops for good (sleep mode,
               in load_batch) THEN_STALL_DELAY seconds later (default 5): a hang right after
               a checkpoint.
  LAYOUT       "tpdp": Megatron-style TP pairs (tp-i) and DP groups (dp-j); each step
               all-reduces the loss in its TP pair, then the gradients in its DP group, and
               STALL_RANK stops before the TP all_reduce. Default: the world plus one group.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import trainsentry.probe


class SlowFile:
    """A file that takes `seconds` in all to write: a checkpoint to slow storage."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        self.written = 0

    def write(self, data: bytes) -> int:
        while time.monotonic() < self.until:  # the first write takes the whole time
            time.sleep(0.1)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def load_batch() -> None:
    """The stalled rank's data loader: it never returns."""
    while True:
        time.sleep(1)


def read_shard() -> None:
    """A second stalled rank, stuck somewhere else: it never returns either."""
    while True:
        time.sleep(1)


def mark_stalled(rank: int) -> None:
    folder = Path(os.environ["PORT_DIR"])
    (folder / f".stalled.{rank}").write_text(repr(time.time()))
    (folder / f".stalled.{rank}").rename(folder / f"stalled.{rank}")


def save_checkpoint(model: torch.nn.Module, mode: str, seconds: float) -> None:
    if mode == "phase":
        with trainsentry.probe.phase("checkpoint"):
            time.sleep(seconds)
        return
    torch.save(model.state_dict(), SlowFile(seconds))  # type: ignore[arg-type]


def main() -> None:
    rank = int(os.environ["RANK"])
    stall_rank = int(os.environ.get("STALL_RANK", "-1"))
    stall_step = int(os.environ.get("STALL_STEP", "5"))
    also = {int(r) for r in os.environ.get("STALL_RANKS", "").split(",") if r.strip()}
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_seconds = float(os.environ.get("SLOW_SECONDS", "1"))
    steps = int(os.environ.get("STEPS", "0")) or 10**9
    backend = os.environ.get("BACKEND", "gloo")
    device = "cpu"
    if backend == "nccl":  # several ranks on one GPU: NCCL must think they are on other hosts
        os.environ.setdefault("NCCL_HOSTID", f"trainsentry-test-host-{rank}")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_IB_DISABLE", "1")
        torch.cuda.set_device(0)
        device = "cuda"
    dist.init_process_group(backend)
    world = dist.get_world_size()
    tpdp = os.environ.get("LAYOUT") == "tpdp"
    if tpdp:  # every rank creates every group, as Megatron does; each keeps its own
        for i in range(world // 2):
            pair = dist.new_group([2 * i, 2 * i + 1], group_desc=f"tp-{i}")
            if rank // 2 == i:
                tp = pair
        for j in range(2):
            column = dist.new_group(list(range(j, world, 2)), group_desc=f"dp-{j}")
            if rank % 2 == j:
                dp = column
    else:
        tp = dist.new_group(list(range(world)), group_desc="tp-0")
    probe = trainsentry.probe.current()
    port_dir = Path(os.environ["PORT_DIR"])
    tmp = port_dir / f".port.{rank}"
    tmp.write_text(str(probe.port if probe is not None else -1))
    tmp.rename(port_dir / f"port.{rank}")

    then_rank = int(os.environ.get("THEN_STALL_RANK", "-1"))
    then_delay = float(os.environ.get("THEN_STALL_DELAY", "5"))
    saved_at: float | None = None  # when the checkpoint's pause ended (monotonic)
    after = float(os.environ.get("STALL_AFTER", "0"))
    if after > 0:  # rank 0 picks the step from its own speed; every rank learns it
        began = time.monotonic()
        for _ in range(10):
            dist.all_reduce(torch.zeros(1, device=device))
            time.sleep(0.02)
        per_step = (time.monotonic() - began) / 10
        chosen = torch.tensor([int(after / max(per_step, 1e-3))], device=device)
        dist.broadcast(chosen, src=0)
        stall_step = int(chosen.item())
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(8, 16, device=device)
    for step in range(steps):
        loss = model(data).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        mode = os.environ.get("STALL_MODE", "sleep")
        if step == stall_step and mode in ("save", "phase"):
            if rank == stall_rank:
                mark_stalled(rank)
                save_checkpoint(model, mode, float(os.environ.get("STALL_SECONDS", "8")))
            dist.barrier()
            saved_at = time.monotonic()
        elif (
            rank == then_rank and saved_at is not None and time.monotonic() - saved_at >= then_delay
        ):
            mark_stalled(rank)
            load_batch()  # a hang right after the checkpoint: this rank never arrives
        elif rank == stall_rank and step == stall_step:
            mark_stalled(rank)
            load_batch()  # this rank never enters the collective; the others wait in it
        elif rank in also and step == stall_step:
            mark_stalled(rank)
            read_shard()
        if rank == slow_rank:
            time.sleep(slow_seconds)
        if tpdp:
            dist.all_reduce(loss.detach(), group=tp)
            for param in model.parameters():
                assert param.grad is not None
                dist.all_reduce(param.grad, group=dp)
        else:
            for param in model.parameters():
                assert param.grad is not None
                dist.all_reduce(param.grad)
            dist.all_reduce(loss.detach(), group=tp)
        opt.step()
        trainsentry.probe.step()
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
