"""The real NCCL artifacts in tests/fixtures/nccl (an H100, torch 2.11.0+cu130, NCCL 2.28.9).

A 4-rank NCCL job whose rank 2 stops before all_reduce #20 (`hang/`, with NCCL RAS's answer in
`ras/`), a 4-stage send/recv pipeline whose rank 2 stops (`pp/`), and rank 3's GPU stuck in a
compute kernel with TORCH_NCCL_ENABLE_TIMING=1 (`compute_timing/`). They are part of the
repository (tests/fixtures/nccl/README.md says where and how they were made), so every test
that reads them runs on a fresh clone.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

NCCL_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def nccl_dir() -> Path:
    """The folder of the real artifacts (in the repository: never skipped)."""
    return NCCL_DIR


class _Plain(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def watchdog_dump(case: str, rank: int) -> dict[str, Any]:
    """torch's watchdog pickle `<case>/watchdog/fr_nccl_rank_<rank>` as plain containers."""
    with (nccl_dir() / case / "watchdog" / f"fr_nccl_rank_{rank}").open("rb") as f:
        data: dict[str, Any] = _Plain(f).load()
    return data


def nccl_json(rank: int) -> dict[str, Any]:
    """`_dump_nccl_trace_json()` taken inside rank `rank` 25 s into the plain hang."""
    path = nccl_dir() / "hang" / "json" / f"nccl_trace_rank_{rank}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def generic_json_during_hang() -> dict[str, Any]:
    """What the generic recorder (`_dump_fr_trace_json`) held in the same NCCL process."""
    path = nccl_dir() / "hang" / "probe_dump_rank0_during_hang.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data
