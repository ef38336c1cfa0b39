"""NCCL RAS as NCCL writes it: the real 2.28.9 artifacts, and fixtures written line by line
from the format strings of NCCL's `src/ras/client_support.cc` (v2.24.3 to v2.30.7).

Text sections quoted here: `#%d-%d (%016lx) INCOMPLETE` with `Rank %d -- GPU %s managed by
process %d on node %s` (>= 2.26) or `The missing rank%s: %s` (2.24/2.25); `ERROR` with
`Asynchronous error%s on %d rank%s` and `Rank %d reported %s -- ...`; `MISMATCH` with
`Communicator ranks have different %s operation counts` (2.24/2.25: `collective`), `%d ranks
have launched up to operation %ld` and `Rank %d has status %s -- ...`. JSON as written by
`jsonWriteRankData` / `jsonWriteMissingRank`, including 2.28.7/2.28.9's missing comma after a
missing rank's `"nvml_dev": %d`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.nccl_artifacts import nccl_dir
from trainsentry.cli import main as cli_main
from trainsentry.diagnostics import AnalyzeError, Report, analyze

HEADER_2289 = """NCCL version 2.28.9 compiled with CUDA 13.0
CUDA runtime version 13000, driver version 13000

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
{summary}

Communicators... (0.001s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
{table}

Errors
======

{errors}Warnings
========

{warnings}"""


def text_report(summary: str, table: str, errors: str = "", warnings: str = "") -> str:
    return HEADER_2289.format(summary=summary, table=table, errors=errors, warnings=warnings)


def root_pids(report: Report) -> list[int]:
    """The pids of the processes the verdict names as root causes."""
    return [p.pid for p in report.hang.processes if p.role == "root_cause"]


def probe_statuses(pids: dict[int, int], host: str) -> list[dict[str, Any]]:
    """What each rank's probe answers on /status today (trainsentry/probe/runtime.py
    status(): `pid` and `host_ips` name the process), for global rank -> pid on `host`."""
    return [
        {
            "rank": g,
            "local_rank": g,
            "world_size": len(pids),
            "node": f"gpu-{g:02d}",
            "pod": f"hang-w-{g}",
            "trainingjob": "hang",
            "namespace": "gpu",
            "pid": pid,
            "host_ips": [host],
            "step": 19,
            "healthy": True,
            "error": "",
            "recorders": ["nccl"],
            "captured_at": 0.0,
            "process_groups": {},
        }
        for g, pid in pids.items()
    ]


def gpu_line(rank: int, pid: int, host: str, gpu: int, what: str = "") -> str:
    lead = f"Rank {rank} {what} -- " if what else f"Rank {rank} -- "
    return f"  {lead}GPU {gpu} managed by process {pid} on node {host}\n"


# ------------------------------------------------------------------ the real artifacts


def test_real_2289_text_names_rank_2_and_its_process(tmp_path: Path) -> None:
    """RAS names the process (GPU 0, pid 468, node 127.0.0.1), rank 2 of its communicator.
    Alone that is no global rank (a communicator as large as the job need not be the
    world); with the probes' status (pid, host_ips) it is global rank 2."""
    report = analyze([nccl_dir() / "ras" / "hang.txt"])
    assert report.format == "ras"
    assert report.verdict == "hang"
    assert report.hang.root_cause_ranks == [] and report.culprit_ranks == []
    (root,) = report.hang.processes
    assert (root.role, root.pid, root.node_address, root.gpu) == (
        "root_cause",
        468,
        "127.0.0.1",
        "0",
    )
    assert [(p.communicator, p.rank) for p in root.places] == [("3fbb9922cfecdb6e", 2)]
    assert (
        root.describe()
        == "process 468 on 127.0.0.1 (GPU 0; communicator rank 2 of 3fbb9922cfecdb6e)"
    )
    primary = report.primary_hang
    assert primary is not None and primary.op == "AllReduce" and primary.seq == 20
    assert list(primary.arrived_ranks) == [0, 1, 3] and primary.rank_space == "communicator"
    assert any("process 468 on node 127.0.0.1" in n for n in report.notes), report.notes
    statuses = tmp_path / "status.json"
    statuses.write_text(json.dumps(probe_statuses({0: 462, 1: 466, 2: 468, 3: 471}, "127.0.0.1")))
    mapped = analyze([nccl_dir() / "ras" / "hang.txt", statuses]).to_dict()
    assert mapped["root_cause_ranks"] == [2] and mapped["culprit_ranks"] == [2]
    assert mapped["processes"][0]["pod"] == "hang-w-2"
    # The text names only rank 2's process: the others' ranks stay communicator ranks.
    assert mapped["hang"]["rank_space"] == "communicator"
    in_json = analyze([nccl_dir() / "ras" / "hang.json", statuses]).to_dict()
    assert in_json["hang"]["rank_space"] == "global" and in_json["culprit_ranks"] == [2]
    assert in_json["hang"]["arrived_ranks"] == [0, 1, 3]


def test_real_2289_json_and_text_are_two_snapshots_of_one_stalled_communicator() -> None:
    ras = nccl_dir() / "ras"
    report = analyze([ras / "hang.json", ras / "hang.txt"])
    assert report.verdict == "hang"
    assert report.communicators == 1  # one communicator seen twice, not two
    assert root_pids(report) == [468]
    assert len(report.hang.hangs) == 1


# ------------------------------------------------------------------ 2.28.9 JSON defect


def _json_rank(
    rank: int,
    host: str,
    pid: int,
    counts: dict[str, int],
    async_error: int = 0,
    gpu: int | None = None,
) -> str:
    """One `ranks[]` entry exactly as jsonWriteRankData prints it."""
    lines = [
        "        {",
        f'          "rank": {rank},',
        f'          "host": "{host}",',
        f'          "pid": {pid},',
        f'          "cuda_dev": {rank % 8 if gpu is None else gpu},',
        f'          "nvml_dev": {rank % 8 if gpu is None else gpu},',
        '          "status": {',
        '            "init_state": 0,',
        f'            "async_error": {async_error},',
        '            "finalize_called": false,',
        '            "destroy_flag": false,',
        '            "abort_flag": false',
        "          },",
        '          "collective_counts": {',
    ]
    ops = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"]
    for i, op in enumerate(ops):
        lines.append(f'            "{op}": {counts.get(op, 0)}' + ("," if i < len(ops) - 1 else ""))
    lines += ["          }", "        }"]
    return "\n".join(lines)


def _json_missing(
    rank: int, host: str, pid: int, unresponsive: bool, dead: bool, comma: bool
) -> str:
    """One `missing_ranks[]` entry as jsonWriteMissingRank prints it; 2.28.7/2.28.9 omit the
    comma after nvml_dev (fixed in 2.29.2)."""
    return "\n".join(
        [
            "        {",
            f'          "rank": {rank},',
            f'          "host": "{host}",',
            f'          "pid": {pid},',
            f'          "cuda_dev": {rank % 8},',
            f'          "nvml_dev": {rank % 8}' + ("," if comma else ""),
            '          "status": {',
            f'            "unresponsive": {"true" if unresponsive else "false"},',
            f'            "considered_dead": {"true" if dead else "false"}',
            "          }",
            "        }",
        ]
    )


def json_report(
    comms: list[tuple[str, int, list[str], list[str]]],
    version: str = "2.28.9",
    timestamp: str = "2026-11-24 21:30:02",
) -> str:
    """A whole report as rasDumpCommsToJSON assembles it: (hash, size, ranks, missing)."""
    out = [
        "{",
        f'  "nccl_version": "{version}",',
        '  "cuda_runtime_version": 13000,',
        '  "cuda_driver_version": 13000,',
        f'  "timestamp": "{timestamp}",',
        f'  "communicators_count": {len(comms)},',
        '  "communicators": [',
    ]
    blocks = []
    for comm_hash, size, ranks, missing in comms:
        block = [
            "    {",
            f'      "hash": "0x{comm_hash}",',
            '      "secondary_hash": "0xb0a107a0d9d6402a:0x18ba6269d025848a",',
            f'      "size": {size},',
            f'      "ranks_count": {len(ranks)},',
            f'      "missing_ranks_count": {len(missing)},',
            '      "ranks": [',
            ",\n".join(ranks),
            "      ],",
            '      "missing_ranks": [',
            ",\n".join(missing),
            "      ]",
            "    }",
        ]
        blocks.append("\n".join(block))
    out.append(",\n".join(blocks))
    out += [
        "  ],",
        '  "ras": {',
        '    "collection_time_sec": 0.004,',
        '    "timeouts_count": 0',
        "  }",
        "}",
    ]
    return "\n".join(out) + "\n"


def ar(n: int) -> dict[str, int]:
    return {"AllReduce": n}


def test_2289_json_with_an_unresponsive_process_is_repaired(tmp_path: Path) -> None:
    raw = json_report(
        [
            (
                "3fbb9922cfecdb6e",
                4,
                [_json_rank(r, "10.0.0.1", 460 + r, ar(20)) for r in (0, 1, 3)],
                [_json_missing(2, "10.0.0.2", 468, True, False, comma=False)],
            )
        ]
    )
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # the defect is real: the document as NCCL writes it does not parse
    path = tmp_path / "ras.json"
    path.write_text(raw)
    report = analyze([path])
    assert report.errors == []
    assert report.verdict == "hang"
    assert root_pids(report) == [468]
    assert any("process 468 on node 10.0.0.2" in n for n in report.notes), report.notes
    assert any("2.28" in n and "comma" in n for n in report.notes), report.notes


# ------------------------------------------------------------------ healthy text


def test_healthy_text_status_is_ok(tmp_path: Path) -> None:
    path = tmp_path / "ras.txt"
    path.write_text(
        text_report(
            "      1          4            1          4        4",
            "    0         1         1         4         4         4   RUNNING      OK",
        )
    )
    report = analyze([path])
    assert report.verdict == "ok"
    assert report.communicators == 1


# ------------------------------------------------------------------ 2.24/2.25 wording

TEXT_224 = """NCCL version 2.24.3 compiled with CUDA 12.6
CUDA runtime version 12060, driver version 12060

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      4          8            1         32       32

Communicators... (0.02s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4         8        32        32   RUNNING  INCOMPLETE
    1         4         1         8         8        32   RUNNING      OK

Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 7021 on node 10.0.0.3 managing GPU 5

#0-0 (00000000abcdef01) INCOMPLETE
  Missing communicator data from 1 rank
  The missing rank: 21

Warnings
========

"""


def test_224_missing_rank_wording(tmp_path: Path) -> None:
    path = tmp_path / "ras.txt"
    path.write_text(TEXT_224)
    report = analyze([path])
    assert report.verdict == "hang"
    # 2.24 names no process for a missing rank: communicator rank 21, no global rank (a
    # 32-rank communicator in a 32-GPU job is not therefore the world).
    assert report.hang.root_cause_ranks == []
    (root,) = report.hang.processes
    assert root.pid == -1 and [(p.communicator, p.rank) for p in root.places] == [
        ("00000000abcdef01", 21)
    ]
    assert report.primary_hang is not None
    assert list(report.primary_hang.missing_ranks) == [21]


def test_224_collective_counts_wording_with_several_missing(tmp_path: Path) -> None:
    text = TEXT_224.replace("1 rank\n  The missing rank: 21", "2 ranks\n  The missing ranks: 5,21")
    text = text.replace(
        "Warnings\n========\n\n",
        "Warnings\n========\n\n"
        "#1-2 (0000000000000042) MISMATCH\n"
        "  Communicator ranks have different collective operation counts\n"
        "  7 ranks have launched up to operation 310\n"
        "  Rank 4 has launched up to operation 309 -- GPU 4 managed by process 7020 "
        "on node 10.0.0.2\n\n",
    )
    path = tmp_path / "ras.txt"
    path.write_text(text)
    report = analyze([path])
    assert report.verdict == "hang"
    missing = {tuple(h.missing_ranks) for h in report.hang.hangs}
    assert (5, 21) in missing and (4,) in missing


# ------------------------------------------------------------------ errors


def test_text_error_section_names_the_rank(tmp_path: Path) -> None:
    errors = (
        "#0-0 (00000000000000aa) ERROR\n"
        "  Asynchronous error on 1 rank\n"
        + gpu_line(1, 101, "10.0.0.1", 1, "reported System error")
        + "\n"
    )
    path = tmp_path / "ras.txt"
    path.write_text(
        text_report(
            "      1          4            1          4        4",
            "    0         1         1         4         4         4   RUNNING   ERROR",
            errors,
        )
    )
    report = analyze([path])
    assert report.verdict == "hang"
    (root,) = report.hang.processes
    assert (root.role, root.pid, root.gpu) == ("root_cause", 101, "1")
    assert root.places[0].what == "reported System error" and "System error" in root.meaning
    assert any("System error" in n for n in report.notes), report.notes


def test_json_remote_error_points_at_the_unresponsive_peer(tmp_path: Path) -> None:
    raw = json_report(
        [
            (
                "aa",
                4,
                [_json_rank(r, "10.0.0.1", 100 + r, ar(7), async_error=6) for r in (0, 2, 3)],
                [_json_missing(1, "10.0.0.1", 101, True, True, comma=True)],
            )
        ],
        version="2.29.2",
    )
    path = tmp_path / "ras.json"
    path.write_text(raw)
    report = analyze([path])
    assert report.verdict == "hang"
    assert root_pids(report) == [101]
    remote = [p for p in report.hang.processes if p.role == "remote_error"]
    assert [p.pid for p in remote] == [100, 102, 103]
    assert any("Remote process error" in n for n in report.notes), report.notes


def test_json_local_async_error_is_the_culprit(tmp_path: Path) -> None:
    ranks = [
        _json_rank(r, "10.0.0.1", 100 + r, ar(7), async_error=2 if r == 3 else 0) for r in range(4)
    ]
    path = tmp_path / "ras.json"
    path.write_text(json_report([("ab", 4, ranks, [])], version="2.29.2"))
    report = analyze([path])
    assert report.verdict == "hang"
    assert root_pids(report) == [103]


# ------------------------------------------------------------------ one rank ahead


def test_text_one_rank_ahead_names_the_others_as_not_arrived(tmp_path: Path) -> None:
    warnings = (
        "#0-0 (00000000000000bb) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  3 ranks have launched up to operation 19\n"
        + gpu_line(0, 100, "10.0.0.1", 0, "has launched up to operation 20")
        + "\n"
    )
    path = tmp_path / "ras.txt"
    path.write_text(
        text_report(
            "      1          4            1          4        4",
            "    0         1         1         4         4         4   RUNNING  MISMATCH",
            warnings=warnings,
        )
    )
    report = analyze([path])
    assert report.verdict == "hang"
    primary = report.primary_hang
    assert primary is not None
    assert list(primary.arrived_ranks) == [0]
    assert list(primary.missing_ranks) == [1, 2, 3]
    assert primary.seq == 20
    assert any("ahead" in n for n in report.notes), report.notes


# ------------------------------------------------------------------ snapshots


def _comm_at(counts: dict[int, int], size: int = 4) -> str:
    return json_report(
        [("cc", size, [_json_rank(r, "10.0.0.1", 100 + r, ar(n)) for r, n in counts.items()], [])],
        version="2.29.2",
        timestamp="{ts}",
    )


def test_progress_between_snapshots_is_not_a_hang(tmp_path: Path) -> None:
    first = tmp_path / "a.json"
    second = tmp_path / "b.json"
    first.write_text(_comm_at({0: 20, 1: 20, 2: 19, 3: 20}).replace("{ts}", "2026-11-24 10:00:00"))
    second.write_text(_comm_at({0: 61, 1: 61, 2: 60, 3: 61}).replace("{ts}", "2026-11-24 10:00:20"))
    report = analyze([first, second])
    assert report.verdict == "ok"
    assert report.communicators == 1
    assert any("progress" in n for n in report.notes), report.notes


def test_no_progress_between_snapshots_is_a_hang(tmp_path: Path) -> None:
    first = tmp_path / "a.json"
    second = tmp_path / "b.json"
    first.write_text(_comm_at({0: 20, 1: 20, 2: 19, 3: 20}).replace("{ts}", "2026-11-24 10:00:00"))
    second.write_text(_comm_at({0: 20, 1: 20, 2: 19, 3: 20}).replace("{ts}", "2026-11-24 10:00:20"))
    report = analyze([first, second])
    assert report.verdict == "hang"
    assert root_pids(report) == [102]
    assert len(report.hang.hangs) == 1


# ------------------------------------------------------------------ teardown


def test_rank_that_left_during_teardown_is_not_missing(tmp_path: Path) -> None:
    raw = json_report(
        [
            (
                "dd",
                4,
                [_json_rank(r, "10.0.0.1", 100 + r, ar(50)) for r in (0, 1, 2)],
                [_json_missing(3, "10.0.0.1", 103, False, False, comma=True)],
            )
        ],
        version="2.29.2",
    )
    path = tmp_path / "ras.json"
    path.write_text(raw)
    report = analyze([path])
    assert report.verdict == "ok"
    assert any("left" in n for n in report.notes), report.notes


# ------------------------------------------------------------------ TP x DP: one process


def tp_dp_report(stalled: int = 5) -> str:
    """8 processes, TP=2 pairs and DP=4 groups; global rank g is process 5000+g on node
    10.0.1.(g // 4). The stalled process never launched its 31st AllReduce anywhere."""

    def rank(comm_rank: int, g: int, n: int) -> str:
        return _json_rank(comm_rank, f"10.0.1.{g // 4}", 5000 + g, ar(n), gpu=g % 4)

    comms = []
    for tp in range(4):
        members = [2 * tp, 2 * tp + 1]
        comms.append(
            (
                f"{0x100 + tp:x}",
                2,
                [rank(i, g, 30 if g == stalled else 31) for i, g in enumerate(members)],
                [],
            )
        )
    for dp in range(2):
        members = [dp, dp + 2, dp + 4, dp + 6]
        comms.append(
            (
                f"{0x200 + dp:x}",
                4,
                [rank(i, g, 30 if g == stalled else 31) for i, g in enumerate(members)],
                [],
            )
        )
    return json_report(comms, version="2.29.2")


def probe_status(g: int) -> dict[str, Any]:
    """What each probe's /status answers (trainsentry/probe/runtime.py status())."""
    return {
        "rank": g,
        "local_rank": g % 4,
        "world_size": 8,
        "node": f"gpu-node-{g // 4}",
        "pod": f"llm-worker-{g}",
        "trainingjob": "llm",
        "namespace": "ml",
        "pid": 5000 + g,
        "host_ips": [f"10.0.1.{g // 4}"],
        "step": 31,
        "healthy": True,
        "error": "",
        "recorders": ["nccl"],
        "captured_at": 0.0,
        "process_groups": {},
    }


def test_tp_dp_one_process_with_probe_status_is_one_global_rank(tmp_path: Path) -> None:
    (tmp_path / "ras.json").write_text(tp_dp_report(stalled=5))
    probes = tmp_path / "probes"
    probes.mkdir()
    for g in range(8):
        (probes / f"status_{g}.json").write_text(json.dumps(probe_status(g)))
    report = analyze([tmp_path / "ras.json", probes])
    assert report.errors == []
    assert report.verdict == "hang"
    assert report.hang.root_cause_ranks == [5]
    assert any("llm-worker-5" in n and "gpu-node-1" in n for n in report.notes), report.notes


def test_tp_dp_without_probe_status_names_one_process(tmp_path: Path) -> None:
    (tmp_path / "ras.json").write_text(tp_dp_report(stalled=5))
    report = analyze([tmp_path / "ras.json"])
    assert report.verdict == "hang"
    assert report.hang.root_cause_ranks == []  # no communicator ranks passed off as global ones
    culprit = [n for n in report.notes if "process 5005 on node 10.0.1.1" in n]
    assert len(culprit) == 1, report.notes
    assert "2 communicators" in culprit[0]


def test_probe_status_alone_is_no_trace(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps(probe_status(0)))
    with pytest.raises(AnalyzeError):
        analyze([tmp_path / "s.json"])


# ------------------------------------------------------------------ more shapes


def test_cascade_across_communicators_names_the_stalled_process_only(tmp_path: Path) -> None:
    """Process 3 stalls; in TP {2,3} rank 2 waits on it; in DP {0,2} rank 0 launched the
    next op and rank 2, stuck in TP, has not. Rank 2 is a victim, 3 the root cause."""

    def rank(comm_rank: int, g: int, n: int) -> str:
        return _json_rank(comm_rank, "10.0.2.1", 7000 + g, ar(n), gpu=g)

    comms = [
        ("e1", 4, [rank(g, g, 12) for g in range(4)], []),  # the world, in step
        ("e2", 2, [rank(0, 2, 9), rank(1, 3, 8)], []),  # TP {2,3}: 3 behind
        ("e3", 2, [rank(0, 0, 5), rank(1, 2, 4)], []),  # DP {0,2}: 2 behind
    ]
    path = tmp_path / "ras.json"
    path.write_text(json_report(comms, version="2.30.7"))
    report = analyze([path])
    assert report.verdict == "hang"
    assert root_pids(report) == [7003]
    assert [p.pid for p in report.hang.processes if p.role == "victim"] == [7002]
    assert sum(n.startswith("culprit:") for n in report.notes) == 1


def test_cli_takes_a_directory_of_probe_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainsentry.cli import main

    (tmp_path / "ras.json").write_text(tp_dp_report(stalled=6))
    probes = tmp_path / "probes"
    probes.mkdir()
    for g in range(8):
        (probes / f"rank{g}.json").write_text(json.dumps(probe_status(g)))
    code = main(["analyze", "--json", str(tmp_path / "ras.json"), str(probes)])
    out = json.loads(capsys.readouterr().out)
    assert code == 3
    assert out["hang"]["root_cause_ranks"] == [6]
    assert all(i["ok"] for i in out["inputs"])


def test_probe_ras_snapshot_file_is_read(tmp_path: Path) -> None:
    """The probe's /ras answer saved to a file (RasStatus.to_dict: the raw report inside)."""
    from trainsentry.probe.ras import status_from_report

    raw = (nccl_dir() / "ras" / "hang.txt").read_text()
    path = tmp_path / "ras_snapshot.json"
    path.write_text(json.dumps(status_from_report(raw, "text").to_dict()))
    report = analyze([path])
    assert report.verdict == "hang"
    assert root_pids(report) == [468]


def test_communicator_gone_from_the_latest_json_is_not_hung(tmp_path: Path) -> None:
    first = tmp_path / "a.json"
    second = tmp_path / "b.json"
    first.write_text(_comm_at({0: 20, 1: 20, 2: 19, 3: 20}).replace("{ts}", "2026-11-24 10:00:00"))
    other = json_report(
        [("ee", 2, [_json_rank(r, "10.0.0.1", 100 + r, ar(3)) for r in (0, 1)], [])],
        version="2.29.2",
        timestamp="2026-11-24 10:00:30",
    )
    second.write_text(other)
    assert analyze([second, first]).verdict == "ok"  # ordered by timestamp, not by argument


def test_nonverbose_text_with_two_unlisted_groups_is_a_hang_naming_nobody(tmp_path: Path) -> None:
    """Plain STATUS prints a group of ranks by count only when it is not an outlier
    (rasCountIsOutlier: more than 10 ranks or a quarter): 12 ranks behind, none named."""
    warnings = (
        "#0-0 (00000000000000f1) MISMATCH\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  20 ranks have launched up to operation 90\n"
        "  12 ranks have launched up to operation 89\n\n"
    )
    path = tmp_path / "ras.txt"
    path.write_text(
        text_report(
            "      4          8            1         32       32",
            "    0         1         4         8        32        32   RUNNING  MISMATCH",
            warnings=warnings,
        )
    )
    report = analyze([path])
    assert report.verdict == "hang"
    assert report.hang.root_cause_ranks == []
    assert any("12 rank(s) have not launched AllReduce 90" in n for n in report.notes), report.notes


def test_text_rank_with_status_nocomm_left_and_is_not_missing(tmp_path: Path) -> None:
    warnings = (
        "#0-0 (00000000000000d1) MISMATCH\n"
        "  Communicator ranks have different status\n"
        "  3 ranks have status RUNNING\n"
        + gpu_line(3, 103, "10.0.0.1", 3, "has status NOCOMM")
        + "\n"
    )
    path = tmp_path / "ras.txt"
    path.write_text(
        text_report(
            "      1          4            1          4        4",
            "    0         1         1         4         4         4   RUNNING  MISMATCH",
            warnings=warnings,
        )
    )
    report = analyze([path])
    assert report.verdict == "ok"
    assert any("[3] answered without this communicator" in n for n in report.notes), report.notes


# ------------------------------------------------------------------ garbage in

_PHRASES = [
    "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors",
    "    0         1         1         4         4         4   RUNNING  MISMATCH",
    "    1         2         1         2         2         4   RUNNING      OK",
    "#0-0 (00000000000000aa) MISMATCH",
    "#1-1 (00000000000000ab) INCOMPLETE",
    "#0-0 (00000000000000aa) ERROR",
    "  Communicator ranks have different AllReduce operation counts",
    "  Communicator ranks have different status",
    "  3 ranks have launched up to operation 20",
    "  2 ranks have not launched any operations",
    "  Rank 2 has launched up to operation 19 -- GPU 0 managed by process 468 on node 1.2.3.4",
    "  Rank 7 -- GPU 1 managed by process 9 on node h",
    "  Rank 1 -- [process information not found]",
    "  Rank 3 has status NOCOMM -- GPU 3 managed by process 103 on node 10.0.0.1",
    "  Rank 0 reported Remote process error -- GPU 0 managed by process 1 on node h",
    "  2 ranks reported System error",
    "  The missing ranks: 5,21",
    "  Missing communicator data from 3 ranks",
    "Warnings",
    "",
]


@pytest.mark.parametrize("seed", range(40))
def test_shuffled_nccl_lines_never_crash(tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    lines = [rng.choice(_PHRASES) for _ in range(rng.randint(1, 25))]
    path = tmp_path / "ras.txt"
    path.write_text("Job summary\n" + "\n".join(lines) + "\n")
    try:
        report = analyze([path], format="ras")
    except AnalyzeError:
        return
    assert report.verdict in ("ok", "hang")


def test_no_communicator_data_is_verdict_ok_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ncclras` prints "No communicator data collected!" under its Communicators heading
    (src/ras/client_support.cc, rasClientRunComms) when no process it reached holds a
    communicator: nothing to diagnose, not an unreadable input (it was exit 1). A DEAD
    process listed beside it is still named in the notes."""
    comms = "Communicators... (0.002s)\n=============\n\nNo communicator data collected!\n"
    path = tmp_path / "ras.txt"
    path.write_text(comms)
    code = cli_main(["analyze", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verdict"] == "ok"
    assert any("No communicator data collected" in n for n in out["notes"])
    path.write_text(
        comms + "\nErrors\n======\n\nDEAD\n"
        "  1 job process is considered dead (unreachable via the RAS network)\n"
        "  Process 3748990 on node node1 managing GPU 3\n\nWarnings\n========\n"
    )
    code = cli_main(["analyze", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert any("3748990" in n and "dead" in n for n in out["notes"])


# ------------------------------------------------------------------ processes, not ranks


def test_tp_dp_stalled_process_is_one_culprit_and_no_communicator_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Process 5005 is rank 1 of its TP pair and rank 2 of its DP group. Before, the verdict
    named "rank 1" (`culprit_ranks`, the TP pair's rank, as if global) and the hangs ranks 1
    and 2; now one process, with its rank in each communicator, and no global rank."""
    (tmp_path / "ras.json").write_text(tp_dp_report(stalled=5))
    out = analyze([tmp_path / "ras.json"]).to_dict()
    assert out["culprit_ranks"] == [] and out["root_cause_ranks"] == []
    (root,) = out["processes"]
    assert (root["role"], root["pid"], root["node_address"], root["gpu"]) == (
        "root_cause",
        5005,
        "10.0.1.1",
        "1",
    )
    assert [(c["communicator"], c["rank"]) for c in root["communicators"]] == [
        ("0000000000000102", 1),
        ("0000000000000201", 2),
    ]
    assert all(h["rank_space"] == "communicator" for h in out["hangs"])
    assert cli_main(["analyze", str(tmp_path / "ras.json")]) == 3
    summary = " ".join(capsys.readouterr().out.split())
    assert (
        "root cause: process 5005 on 10.0.1.1 (GPU 1; communicator rank 1 of "
        "0000000000000102, communicator rank 2 of 0000000000000201)" in summary
    ), summary
    assert "root cause rank(s)" not in summary


def _two_groups(only_b: bool) -> str:
    """Groups A (global 0-3, node 10.0.3.0) and B (global 4-7, node 10.0.3.1) of 4 ranks,
    each its own communicator; B's rank 2 (global rank 6, pid 6006) stalls. With `only_b`
    A's processes hold no communicator any more, so the report lists B alone: a communicator
    as large as every GPU the report shows."""
    comms = []
    for name, base in (("b0", 0), ("b1", 4)):
        if only_b and base == 0:
            continue
        ranks = [
            _json_rank(
                i, f"10.0.3.{base // 4}", 6000 + base + i, ar(40 if i == 2 and base else 41), gpu=i
            )
            for i in range(4)
        ]
        comms.append((name, 4, ranks, []))
    return json_report(comms, version="2.29.2")


@pytest.mark.parametrize("only_b", [False, True])
def test_group_b_rank_2_is_global_rank_6_only_by_the_probes(tmp_path: Path, only_b: bool) -> None:
    """Before: `culprit_ranks` said 2 (B's communicator rank), or with B alone in the report
    it was taken for the world and its rank 2 for global rank 2."""
    path = tmp_path / "ras.json"
    path.write_text(_two_groups(only_b))
    out = analyze([path]).to_dict()
    assert out["culprit_ranks"] == [] and out["root_cause_ranks"] == []
    (root,) = out["processes"]
    assert (root["pid"], root["global_rank"]) == (6006, None)
    assert (
        root["description"]
        == "process 6006 on 10.0.3.1 (GPU 2; communicator rank 2 of 00000000000000b1)"
    )
    statuses = tmp_path / "probes.json"
    statuses.write_text(
        json.dumps(
            [dict(probe_status(g), pid=6000 + g, host_ips=[f"10.0.3.{g // 4}"]) for g in range(8)]
        )
    )
    mapped = analyze([path, statuses]).to_dict()
    assert mapped["culprit_ranks"] == [6] and mapped["root_cause_ranks"] == [6]
    assert mapped["processes"][0]["description"].startswith(
        "global rank 6 (process 6006 on 10.0.3.1"
    )


def test_op_mismatch_names_the_rank_that_launched_what_the_others_never_did(
    tmp_path: Path,
) -> None:
    """Rank 0 launched a Broadcast where ranks 1-3 launched AllReduce 21: each rank is
    behind the others on some function. Before: all four were culprits; now the rank whose
    counts differ from the three others'. MISMATCH lines as rasClientRunComms prints them
    (a group of more than one rank by count, the single outlier rank by rank)."""
    line = "-- GPU 0 managed by process 100 on node 10.0.0.1\n"
    warnings = (
        "#0-0 (00000000000000c1) MISMATCH\n"
        "  Communicator ranks have different Broadcast operation counts\n"
        "  3 ranks have not launched any operations\n"
        f"  Rank 0 has launched up to operation 1 {line}"
        "\n"
        "  Communicator ranks have different AllReduce operation counts\n"
        "  3 ranks have launched up to operation 21\n"
        f"  Rank 0 has launched up to operation 20 {line}"
        "\n"
    )
    text = tmp_path / "ras.txt"
    text.write_text(
        text_report(
            "      1          4            1          4        4",
            "    0         1         1         4         4         4   RUNNING  MISMATCH",
            warnings=warnings,
        )
    )
    ranks = [
        _json_rank(r, "10.0.0.1", 100 + r, {"Broadcast": 1, "AllReduce": 20} if r == 0 else ar(21))
        for r in range(4)
    ]
    as_json = tmp_path / "ras.json"
    as_json.write_text(json_report([("c1", 4, ranks, [])], version="2.29.2"))
    for path in (text, as_json):
        report = analyze([path])
        assert report.verdict == "hang"
        assert [p.pid for p in report.hang.processes] == [100], report.hang.processes
        primary = report.primary_hang
        assert primary is not None and list(primary.missing_ranks) == [0]
        assert list(primary.arrived_ranks) == [1, 2, 3]
        assert primary.op == "AllReduce" and primary.seq == 21
        assert any("collective mismatch" in n and "[0]" in n for n in report.notes), report.notes


def test_op_mismatch_two_against_two_names_everyone(tmp_path: Path) -> None:
    """No group is larger: RAS cannot tell which side launched the wrong collective."""
    ranks = [
        _json_rank(r, "10.0.0.1", 100 + r, {"Broadcast": 1, "AllReduce": 20} if r < 2 else ar(21))
        for r in range(4)
    ]
    path = tmp_path / "ras.json"
    path.write_text(json_report([("c2", 4, ranks, [])], version="2.29.2"))
    report = analyze([path])
    assert sorted(p.pid for p in report.hang.processes) == [100, 101, 102, 103]
    assert any("no group" in n for n in report.notes), report.notes


def test_remote_process_error_carries_the_reporting_rank_and_what_it_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`Rank 2 reported Remote process error -- GPU 2 managed by process 1234 on node
    10.0.0.2` (rasClientBreakDownErrors), nobody missing: before, the verdict named nobody
    and the rank was only in a note. Now the structured verdict carries the reporting rank,
    its GPU, process and node, and what ncclRemoteError means."""
    errors = (
        "#0-0 (00000000000000e5) ERROR\n"
        "  Asynchronous error on 1 rank\n"
        + gpu_line(2, 1234, "10.0.0.2", 2, "reported Remote process error")
        + "\n"
    )
    text = tmp_path / "ras.txt"
    text.write_text(
        text_report(
            "      2          2            1          4        4",
            "    0         1         2         2         4         4   RUNNING   ERROR",
            errors,
        )
    )
    ranks = [
        _json_rank(r, f"10.0.0.{1 + r // 2}", 1232 + r, ar(9), async_error=6 if r == 2 else 0)
        for r in range(4)
    ]
    as_json = tmp_path / "ras.json"
    as_json.write_text(json_report([("e5", 4, ranks, [])], version="2.29.2"))
    for path in (text, as_json):
        out = analyze([path]).to_dict()
        assert out["verdict"] == "hang"
        (lead,) = out["processes"]
        assert lead["role"] == "remote_error"
        assert (lead["pid"], lead["node_address"], lead["gpu"]) == (1234, "10.0.0.2", "2")
        assert lead["communicators"] == [
            {
                "communicator": "00000000000000e5",
                "size": 4,
                "rank": 2,
                "what": "reported Remote process error",
            }
        ]
        assert "remote process exited or the network failed" in lead["meaning"]
        assert "peers" in lead["meaning"]
        assert out["culprit_ranks"] == []  # the failed peer is not named by RAS
    assert cli_main(["analyze", str(text)]) == 3
    summary = " ".join(capsys.readouterr().out.split())
    assert "reported a remote error: process 1234 on 10.0.0.2" in summary, summary
