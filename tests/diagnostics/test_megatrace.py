"""The real Megatrace sample: rank 2 was made slow; no hang happened."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainsentry.diagnostics import analyze
from trainsentry.diagnostics.readers.megatrace import (
    MegatraceFormatError,
    build_trace,
    parse_lines,
)
from trainsentry.diagnostics.report import Report
from trainsentry.diagnostics.topology import Topology


@pytest.fixture(scope="module")
def report(megatrace_sample: Path) -> Report:
    return analyze([megatrace_sample])


def test_rank_2_is_the_top_slow_rank_with_tiny_p(report: Report) -> None:
    assert report.verdict == "slow"
    top = report.slow.slow_ranks[0]
    assert top.rank == 2
    assert top.p_value < 1e-6
    assert top.log10_p_bound < -6  # the same, without float underflow
    assert report.to_dict()["slow_ranks"][0]["log10_p_value_bound"] < -6
    json.dumps(report.to_dict(), allow_nan=False)  # strict JSON: no inf/nan anywhere
    assert top.lag_ms >= 1.0
    assert "tp1" in top.communicators  # its tensor-parallel pair with rank 3


def test_no_hang_and_rank_7_tail_is_end_of_log(report: Report) -> None:
    assert report.hang.hangs == []
    assert report.to_dict()["hang"] is None
    (recent,) = report.hang.too_recent
    assert recent.missing_ranks == (7,)
    assert recent.waited_s is not None and recent.waited_s < 0.01
    assert any("end of log, not a hang" in note for note in report.notes)


def test_topology_comes_from_config_yaml(report: Report) -> None:
    assert report.topology == Topology(tp=2, pp=4, dp=1)


def test_communicators_are_reconstructed_from_stream_pointers(megatrace_sample: Path) -> None:
    raws = []
    for path in sorted(megatrace_sample.glob("rank_*.log")):
        with path.open() as handle:
            raws.extend(parse_lines(handle, str(path)))
    trace = build_trace(raws, Topology(2, 4, 1))
    groups = {c.ranks for c in trace.communicators.values() if len(c.ranks) > 1}
    # TP pairs; ranks 2-5 have identical op mixes, only timing separates {2,3} from {4,5}.
    assert {(0, 1), (2, 3), (4, 5), (6, 7)} <= groups
    assert (0, 2, 4, 6) in groups and (1, 3, 5, 7) in groups  # PP from the topology
    worlds = [c for c in trace.communicators.values() if len(c.ranks) == 8]
    assert len(worlds) == 3
    singles = [c for c in trace.communicators.values() if len(c.ranks) == 1]
    assert len(singles) == 8  # the DP=1 ReduceScatter/AllGather communicator per rank


def test_ring_buffer_gaps_are_reported_not_hangs(report: Report) -> None:
    gaps = {(g.rank, g.after_seq, g.before_seq) for g in report.gaps}
    assert (2, 383, 6937) in gaps  # rank 2's TP stream jumps, per the sample's README
    assert (2, 25, 269) in gaps
    assert report.to_dict()["gaps_total"] == len(report.gaps) > 0
    assert report.hang.hangs == []


def test_pipeline_victim_is_not_a_cause(report: Report) -> None:
    causes = [s.rank for s in report.slow.slow_ranks]
    assert 4 not in causes
    assert all(v.victim_of == 2 for v in report.slow.victims)


def test_without_topology_rank_2_is_still_top(tmp_path: Path, megatrace_sample: Path) -> None:
    for path in megatrace_sample.glob("rank_*.log"):
        shutil.copy(path, tmp_path / path.name)
    result = analyze([tmp_path])
    assert result.topology is None
    assert result.slow.slow_ranks[0].rank == 2
    forced = analyze([tmp_path], topology=Topology(2, 4, 1))
    assert forced.slow.slow_ranks[0].rank == 2


def test_group_hash_lines_define_communicators() -> None:
    lines = [
        f"[save_count 1] [100.{i:09d}] [Rank {rank}] Fun AllReduce Data 8 stream 0x{rank}a "
        f"opCount {i} groupHash -42"
        for rank in (0, 1)
        for i in range(20)
    ]
    raws = parse_lines(lines, "mem")
    trace = build_trace(raws)
    assert [c.ranks for c in trace.communicators.values()] == [(0, 1)]
    assert next(iter(trace.communicators)) == "g-42"


def test_malformed_line_names_the_file_and_line() -> None:
    with pytest.raises(MegatraceFormatError, match=r"bad\.log:2"):
        parse_lines(
            [
                "[save_count 1] [1.5] [Rank 0] Fun AllReduce Data 1 stream 0x1 opCount 0",
                "garbage here",
            ],
            "bad.log",
        )


def test_corrupt_rank_file_is_reported_and_others_analysed(
    tmp_path: Path, megatrace_sample: Path
) -> None:
    for path in megatrace_sample.glob("rank_*.log"):
        shutil.copy(path, tmp_path / path.name)
    shutil.copy(megatrace_sample / "config.yaml", tmp_path / "config.yaml")
    bad = tmp_path / "rank_5.log"
    bad.write_text(bad.read_text()[:5000] + "\nthis line is not megatrace\n")
    result = analyze([tmp_path])
    assert [e.path for e in result.errors] == [str(bad)]
    assert "rank_5.log" in result.errors[0].message
    assert result.slow.slow_ranks[0].rank == 2
