"""NCCL RAS snapshots (`ncclras` text and `ncclras -f json`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainsentry.diagnostics import analyze
from trainsentry.diagnostics.readers.nccl_ras import parse_ras_json
from trainsentry.probe.ras_report import report_from_text

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


def _rank(rank: int, allreduce: int, async_error: int = 0) -> dict[str, Any]:
    counts = dict.fromkeys(FUNCS, 0)
    counts["AllReduce"] = allreduce
    counts["Broadcast"] = 3
    return {
        "rank": rank,
        "host": f"10.0.0.{rank // 8}",
        "pid": 1000 + rank,
        "cuda_dev": rank % 8,
        "nvml_dev": rank % 8,
        "status": {
            "init_state": 0,
            "async_error": async_error,
            "finalize_called": False,
            "destroy_flag": False,
            "abort_flag": False,
        },
        "collective_counts": counts,
    }


def ras_json(behind: int, unresponsive: int | None = None) -> dict[str, Any]:
    size = 16
    ranks = [_rank(r, 1200 if r != behind else 1199) for r in range(size) if r != unresponsive]
    missing = []
    if unresponsive is not None:
        missing.append(
            {
                "rank": unresponsive,
                "host": "10.0.0.1",
                "pid": 4242,
                "cuda_dev": 1,
                "nvml_dev": 1,
                "status": {"unresponsive": True, "considered_dead": True},
            }
        )
    return {
        "nccl_version": "2.28.7",
        "cuda_runtime_version": 12080,
        "cuda_driver_version": 12080,
        "timestamp": "2026-11-22 01:00:00",
        "communicators_count": 2,
        "communicators": [
            {
                "hash": "0x1f2e3d",
                "secondary_hash": "0x1:0x2",
                "size": size,
                "ranks_count": len(ranks),
                "missing_ranks_count": len(missing),
                "ranks": ranks,
                "missing_ranks": missing,
            },
            {
                "hash": "0xabc",
                "secondary_hash": "0x1:0x3",
                "size": 2,
                "ranks_count": 2,
                "missing_ranks_count": 0,
                "ranks": [_rank(0, 50), _rank(1, 50)],
                "missing_ranks": [],
            },
        ],
        "ras": {"collection_time_sec": 0.012, "timeouts_count": 0},
    }


TEXT = """\
Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      2          8            1         16       16

Communicators... (0.00s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         2         8        16        16   RUNNING  MISMATCH
    1         8         1         2         2        16   RUNNING      OK

Errors
======

#0-0 (00000000001f2e3d) INCOMPLETE
  Missing communicator data from 1 rank
  Rank 9 -- GPU 1 managed by process 4242 on node 10.0.0.1

Warnings
========

#0-0 (00000000001f2e3d) MISMATCH
  Communicator ranks have different AllReduce operation counts
  14 ranks have launched up to operation 1200
  Rank 6 has launched up to operation 1199 -- GPU 6 managed by process 1006 on node 10.0.0.0
"""


def test_json_names_the_rank_that_is_behind(tmp_path: Path) -> None:
    path = tmp_path / "ras.json"
    path.write_text(json.dumps(ras_json(behind=6)))
    report = analyze([path])
    assert report.format == "ras"
    assert report.verdict == "hang"
    hang = report.to_dict()["hang"]
    assert hang["communicator"] == "00000000001f2e3d"  # as the text report prints it
    assert hang["missing_ranks"] == [6] and hang["rank_space"] == "communicator"
    # RAS names a process; without the probes' status that is no global rank.
    assert hang["root_cause_ranks"] == [] and report.culprit_ranks == []
    (root,) = report.to_dict()["processes"]
    assert (root["pid"], root["node_address"], root["gpu"]) == (1006, "10.0.0.0", "6")
    assert root["communicators"][0]["rank"] == 6 and root["global_rank"] is None
    assert hang["op"] == "AllReduce" and hang["seq"] == 1200
    assert hang["waited_s"] is None
    assert hang["arrived_count"] == 15


def test_json_unresponsive_rank_is_missing() -> None:
    (comm, _) = parse_ras_json(ras_json(behind=-1, unresponsive=9), "mem")
    assert comm.missing_ranks == (9,) and comm.dead_ranks == (9,)


def test_healthy_json_is_ok(tmp_path: Path) -> None:
    path = tmp_path / "ras.json"
    path.write_text(json.dumps(ras_json(behind=-1)))
    assert analyze([path], format="ras").verdict == "ok"


def test_text_output(tmp_path: Path) -> None:
    (comm,) = report_from_text(TEXT).comms
    assert comm.hash == "00000000001f2e3d"
    assert comm.size == 16
    assert comm.missing == {9}
    # Only rank 6 is listed; the 14 others are the unlisted group at 1200 (rank 9 sent nothing).
    assert comm.counts["AllReduce"] == {r: 1199 if r == 6 else 1200 for r in range(16) if r != 9}
    path = tmp_path / "ras.txt"
    path.write_text(TEXT)
    report = analyze([path])
    assert report.verdict == "hang"
    assert sorted(p.pid for p in report.hang.processes if p.role == "root_cause") == [1006, 4242]


def test_corrupt_json_names_the_file(tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    good.write_text(json.dumps(ras_json(behind=3)))
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps(ras_json(behind=3))[:300])
    report = analyze([good, bad], format="ras")
    assert [e.path for e in report.errors] == [str(bad)]
    assert [p.pid for p in report.hang.processes if p.role == "root_cause"] == [1003]
