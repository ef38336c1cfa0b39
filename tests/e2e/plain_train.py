"""A training script that knows nothing of trainsentry: no import, no launcher. Run as a
PyTorchJob's container runs it (`python train.py`, with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the training operator), under the PYTHONPATH the admission webhook gives.

Environment (the test's, not the webhook's):
  MARK_DIR     the rank writes `ready.<rank>` once its process group is up, and a rank that
               stops writes the unix time to `stalled.<rank>` first
  STALL_RANK   this rank stops in its data loader before the collective of the step that
               STALL_AFTER seconds of training reach (rank 0 decides, every rank learns it)
  STALL_AFTER  seconds (default 5)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def write(name: str, text: str) -> None:
    folder = Path(os.environ["MARK_DIR"])
    (folder / f".{name}").write_text(text)
    (folder / f".{name}").rename(folder / name)


def load_batch() -> None:
    """The stalled rank's data loader: it never returns."""
    while True:
        time.sleep(1)


def main() -> None:
    rank = int(os.environ["RANK"])
    stall_rank = int(os.environ.get("STALL_RANK", "-1"))
    dist.init_process_group("gloo")
    write(f"ready.{rank}", "1")
    began = time.monotonic()
    for _ in range(10):
        dist.all_reduce(torch.zeros(1))
        time.sleep(0.02)
    per_step = (time.monotonic() - began) / 10
    after = float(os.environ.get("STALL_AFTER", "5"))
    chosen = torch.tensor([int(after / max(per_step, 1e-3))])
    dist.broadcast(chosen, src=0)
    stall_step = int(chosen.item())
    model = torch.nn.Linear(16, 4)
    data = torch.randn(8, 16)
    step = 0
    while True:
        loss = model(data).pow(2).mean()
        loss.backward()
        if rank == stall_rank and step == stall_step:
            write(f"stalled.{rank}", repr(time.time()))
            load_batch()  # this rank never enters the all_reduce; its peers wait in it
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
        step += 1
        time.sleep(0.02)


if __name__ == "__main__":
    main()
