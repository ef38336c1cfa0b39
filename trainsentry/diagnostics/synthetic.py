"""Synthetic NCCL-style Flight Recorder dumps for tests and benchmarks.

The layout follows torch 2.13's dump (version "2.10"): `pg_config`, `pg_status` and
`entries` with the same keys a real NCCL dump has. Scenarios:
- `ok`: every rank completes every collective;
- `hang`: `culprit` never issues the last collective; the others wait in it;
- `size`: `culprit` passes a tensor twice the size at the last collective;
- `slow`: `culprit` enqueues every collective `slow_ms` after the others.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

SCENARIOS = ("ok", "hang", "size", "slow")
_OPS = ("all_reduce", "all_reduce", "all_gather", "reduce_scatter", "broadcast")
_BASE_NS = 1_750_000_000_000_000_000
_STEP_NS = 10_000_000  # 10 ms between collectives


def _sizes(op: str, numel: int, world: int) -> tuple[list[list[int]], list[list[int]]]:
    if op == "all_gather":
        return [[numel]], [[numel * world]]
    if op == "reduce_scatter":
        return [[numel * world]], [[numel]]
    return [[numel]], [[numel]]


def make_dump(
    rank: int,
    world: int,
    entries: int,
    scenario: str = "ok",
    culprit: int = 0,
    slow_ms: float = 5.0,
    idle_s: float = 600.0,
) -> dict[str, Any]:
    """One rank's dump as a plain dict; deterministic (jitter derives from rank and seq)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}")
    last = entries  # collective_seq_id of the final collective
    skip_last = scenario == "hang" and rank == culprit
    count = entries - 1 if skip_last else entries
    first_seq = 1
    records = []
    for i in range(count):
        seq = first_seq + i
        op = _OPS[seq % len(_OPS)]
        numel = 1024 * (1 + seq % 7)
        if scenario == "size" and rank == culprit and seq == last:
            numel *= 2
        inputs, outputs = _sizes(op, numel, world)
        jitter = ((rank * 7919 + seq * 104729) % 1000) * 1000  # up to 1 ms
        created = _BASE_NS + seq * _STEP_NS + jitter
        if scenario == "slow" and rank == culprit:
            created += int(slow_ms * 1e6)
        hung = scenario == "hang" and seq == last
        state = "started" if hung else "completed"
        records.append(
            {
                "frames": [],
                "record_id": i,
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "collective_seq_id": seq,
                "p2p_seq_id": 0,
                "op_id": seq,
                "profiling_name": f"nccl:{op}",
                "time_created_ns": created,
                "input_sizes": inputs,
                "input_dtypes": ["Float"],
                "output_sizes": outputs,
                "output_dtypes": ["Float"],
                "state": state,
                "time_discovered_started_ns": created + 1000,
                "time_discovered_completed_ns": None if hung else created + 2_000_000,
                "retired": not hung,
                "timeout_ms": 600000,
                "is_p2p": False,
            }
        )
    end_ns = _BASE_NS + (last + 1) * _STEP_NS + int(idle_s * 1e9)
    last_seq = first_seq + count - 1
    return {
        "version": "2.10",
        "comm_lib_version": "2.27.5",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": last_seq,
                "last_started_collective": last_seq,
                "last_completed_collective": last_seq
                - (1 if scenario == "hang" and not skip_last else 0),
            }
        },
        "entries": records,
        "nccl_comm_state": {},
        "dump_time_ns": end_ns,
    }


def write_dumps(
    directory: Path,
    world: int,
    entries: int,
    scenario: str = "ok",
    culprit: int = 0,
    fmt: str = "pickle",
    prefix: str = "nccl_trace_rank_",
    slow_ms: float = 5.0,
) -> list[Path]:
    """Write one dump per rank; returns the paths. Files' mtime is set to the dump end."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(world):
        dump = make_dump(rank, world, entries, scenario, culprit, slow_ms)
        path = directory / f"{prefix}{rank}{'.json' if fmt == 'json' else ''}"
        if fmt == "json":
            path.write_text(json.dumps(dump), encoding="utf-8")
        else:
            path.write_bytes(pickle.dumps(dump, protocol=4))
        end_ns = int(dump["dump_time_ns"])
        os.utime(path, ns=(end_ns, end_ns))
        paths.append(path)
    return paths
