"""Flight Recorder reader and the hang / mismatch / slow analyses on synthetic dumps."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from trainsentry.diagnostics import AnalyzeError, analyze, analyze_trace
from trainsentry.diagnostics.model import Trace
from trainsentry.diagnostics.readers.flight_recorder import (
    FlightRecorderError,
    SignatureCache,
    decode_dump,
    infer_rank_names,
    join_dumps,
    load_plain_pickle,
    parse_rank_dump,
)
from trainsentry.diagnostics.synthetic import make_dump, write_dumps

WORLD = 1024


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One 1,024-rank dump directory per scenario (pickle, and JSON for one of them)."""
    out = {}
    for scenario, culprit, fmt in (
        ("hang", 517, "pickle"),
        ("size", 33, "json"),
        ("slow", 700, "pickle"),
        ("ok", 0, "pickle"),
    ):
        directory = tmp_path_factory.mktemp(scenario)
        write_dumps(directory, WORLD, 30, scenario, culprit, fmt=fmt)
        out[scenario] = directory
    return out


def test_1024_rank_hang_names_the_missing_rank(big: dict[str, Path]) -> None:
    # write_dumps sets each file's mtime to when its rank "took" it: files in place.
    report = analyze([big["hang"]], in_place=True)
    assert report.verdict == "hang"
    hang = report.to_dict()["hang"]
    assert hang["missing_ranks"] == [517]
    assert hang["root_cause_ranks"] == [517]
    assert hang["seq"] == 30
    assert hang["arrived_count"] == WORLD - 1
    assert hang["waited_s"] >= 599


def test_1024_rank_size_mismatch_names_the_culprit(big: dict[str, Path]) -> None:
    report = analyze([big["size"]])
    assert report.verdict == "mismatch"
    (mismatch,) = report.blocking_mismatches
    assert (mismatch.kind, mismatch.culprit_ranks, mismatch.seq) == ("size", (33,), 30)


def test_1024_rank_slow_rank(big: dict[str, Path]) -> None:
    report = analyze([big["slow"]])
    assert report.verdict == "slow"
    assert [s.rank for s in report.slow.slow_ranks] == [700]
    assert report.slow.slow_ranks[0].p_value < 1e-6
    assert 4.0 < report.slow.slow_ranks[0].lag_ms < 5.5


def test_1024_rank_healthy_job_is_ok(big: dict[str, Path]) -> None:
    report = analyze([big["ok"]])
    assert report.verdict == "ok"
    assert report.hang.hangs == [] and report.slow.slow_ranks == []
    assert report.blocking_mismatches == []


def test_bad_files_are_named_and_the_rest_analysed(tmp_path: Path) -> None:
    paths = write_dumps(tmp_path, 8, 20, "hang", 5)
    paths[1].write_bytes(os.urandom(300))  # corrupt
    paths[2].write_bytes(paths[2].read_bytes()[:200])  # truncated pickle
    paths[3].write_text(json.dumps({"version": "2.10", "pg_config": {}}))  # no entries
    result = analyze([tmp_path])
    errors = {Path(e.path).name: e.message for e in result.errors}
    assert set(errors) == {paths[1].name, paths[2].name, paths[3].name}
    assert "entries" in errors[paths[3].name]
    assert paths[2].name in errors[paths[2].name]
    hang = result.to_dict()["hang"]
    # rank 5 skipped the collective; ranks 1-3 have no readable dump, so they are
    # missing too, reported as such rather than silently dropped.
    assert 5 in hang["missing_ranks"]
    assert hang["ranks_without_dump"] == [1, 2, 3]
    assert {i["path"]: i["ok"] for i in result.to_dict()["inputs"]}[str(paths[0])] is True


def test_nothing_readable_raises(tmp_path: Path) -> None:
    (tmp_path / "rank_0").write_bytes(b"\x00garbage")
    with pytest.raises(AnalyzeError, match="rank_0"):
        analyze([tmp_path])


class Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_globals() -> None:
    payload = pickle.dumps({"version": "2.10", "entries": [Boom()]})
    with pytest.raises(pickle.UnpicklingError, match=r"(posix|os)\.system"):
        load_plain_pickle(payload)
    with pytest.raises(FlightRecorderError, match="evil_3"):
        decode_dump(payload, "evil_3")
    # Plain containers, tuples included, still load.
    assert load_plain_pickle(pickle.dumps({"a": (1, [2.5, "x"]), "b": None})) == {
        "a": (1, [2.5, "x"]),
        "b": None,
    }


def test_prefix_is_inferred_from_file_names(tmp_path: Path) -> None:
    names = ["nccl_trace_rank_0", "nccl_trace_rank_1", "nccl_trace_rank_10", "README", "x.json"]
    paths = [tmp_path / n for n in names]
    ranks = infer_rank_names(paths)
    assert ranks == {paths[0]: 0, paths[1]: 1, paths[2]: 10}
    assert infer_rank_names([tmp_path / "rank_3.json"]) == {tmp_path / "rank_3.json": 3}


def _trace(dumps: dict[int, dict[str, Any]]) -> Trace:
    trace = Trace(format="fr")
    cache = SignatureCache(trace.signatures)
    parsed = [parse_rank_dump(d, r, f"rank_{r}", cache) for r, d in dumps.items()]
    trace = join_dumps(parsed, trace)
    # In files the dump time is the file's mtime; in memory, the synthetic dump's end.
    trace.capture_end_ns = max(int(d["dump_time_ns"]) for d in dumps.values())
    return trace


def test_old_versions_and_unknown_keys() -> None:
    dumps = {}
    for rank in range(4):
        dump = make_dump(rank, 4, 12, "hang", culprit=2)
        dump["version"] = "2.1"
        dump["brand_new_key"] = {"ignored": True}
        for entry in dump["entries"]:
            entry["seq_id"] = entry.pop("collective_seq_id")
            del entry["is_p2p"], entry["p2p_seq_id"], entry["input_dtypes"]
            entry["future_field"] = [1, 2, 3]
        del dump["pg_status"]
        dumps[rank] = dump
    report = analyze_trace(_trace(dumps))
    assert report.verdict == "hang"
    assert report.primary_hang is not None
    assert report.primary_hang.missing_ranks == (2,)


def test_ring_buffer_wrap_uses_pg_status_not_a_false_missing_rank() -> None:
    dumps = {r: make_dump(r, 4, 40, "hang", culprit=1) for r in range(4)}
    # Rank 3's buffer kept only its first 10 entries' worth of history... but pg_status says
    # it enqueued up to 40: it reached the stuck collective, it is not missing.
    dumps[3]["entries"] = dumps[3]["entries"][:10]
    trace = _trace(dumps)
    report = analyze_trace(trace)
    assert report.primary_hang is not None
    assert report.primary_hang.missing_ranks == (1,)
    assert report.gaps == []  # truncation at the end is not a gap inside the record


def test_coalesced_group_compared_as_a_whole() -> None:
    dumps = {r: make_dump(r, 4, 6, "ok") for r in range(4)}
    for rank, dump in dumps.items():
        template = dict(dump["entries"][-1])
        extra = []
        for k, numel in enumerate((8, 16 if rank != 3 else 32)):
            e = dict(
                template,
                collective_seq_id=7,
                op_id=100 + k,
                profiling_name="nccl:all_reduce",
                input_sizes=[[numel]],
                output_sizes=[[numel]],
            )
            extra.append(e)
        extra.append(
            dict(
                template,
                collective_seq_id=7,
                profiling_name="nccl:coalesced",
                input_sizes=[],
                output_sizes=[],
            )
        )
        dump["entries"].extend(extra)
    report = analyze_trace(_trace(dumps))
    (mismatch,) = report.blocking_mismatches
    assert mismatch.seq == 7 and mismatch.culprit_ranks == (3,) and mismatch.kind == "size"
    assert mismatch.found.startswith("coalesced[")


def test_dtype_and_op_mismatch_kinds() -> None:
    dumps = {r: make_dump(r, 4, 8, "ok") for r in range(4)}
    dumps[1]["entries"][3]["input_dtypes"] = ["BFloat16"]
    dumps[2]["entries"][5]["profiling_name"] = "nccl:broadcast_other"
    report = analyze_trace(_trace(dumps))
    kinds = {(m.seq, m.kind, m.culprit_ranks) for m in report.blocking_mismatches}
    assert (4, "dtype", (1,)) in kinds
    assert (6, "op", (2,)) in kinds


def test_all_gather_output_must_be_input_times_group_size() -> None:
    dumps = {r: make_dump(r, 4, 10, "ok") for r in range(4)}
    ag = next(
        i for i, e in enumerate(dumps[0]["entries"]) if e["profiling_name"] == "nccl:all_gather"
    )
    for rank in range(4):  # every rank agrees, but the output is only 2x the input
        entry = dumps[rank]["entries"][ag]
        entry["output_sizes"] = [[entry["input_sizes"][0][0] * 2]]
    report = analyze_trace(_trace(dumps))
    assert {m.kind for m in report.blocking_mismatches} == {"size"}
    assert sorted(r for m in report.blocking_mismatches for r in m.culprit_ranks) == [0, 1, 2, 3]


def test_p2p_victim_points_to_the_root_cause() -> None:
    """Rank 1 waits in recv from rank 0; rank 0 waits in a collective rank 3 never joined."""
    dumps = {r: make_dump(r, 4, 10, "hang", culprit=3) for r in range(4)}
    # Rank 1 is not in the stuck collective: it is blocked in a recv from rank 0 instead.
    last = dumps[1]["entries"].pop()
    dumps[1]["entries"].append(
        dict(
            last,
            profiling_name="nccl:recv 1<-0",
            is_p2p=True,
            p2p_seq_id=1,
            collective_seq_id=0,
            state="started",
            retired=False,
        )
    )
    dumps[1]["pg_status"]["0"]["last_enqueued_collective"] = 9
    report = analyze_trace(_trace(dumps))
    assert report.hang.root_cause_ranks == [3]
    assert 1 in report.primary_hang.missing_ranks  # type: ignore[union-attr]
    assert 1 in report.hang.victim_ranks
    assert any(w.rank == 1 and w.peer == 0 for w in report.hang.p2p_waits)


def test_recent_tail_is_not_a_hang() -> None:
    dumps = {r: make_dump(r, 4, 10, "hang", culprit=0) for r in range(4)}
    trace = _trace(dumps)
    stuck_since = max(int(s.time_ns.max()) for s in trace.streams.values())
    trace.capture_end_ns = stuck_since + 500_000_000  # dumped 0.5 s after
    report = analyze_trace(trace)
    assert report.verdict == "ok"
    assert report.hang.too_recent and report.hang.too_recent[0].missing_ranks == (0,)
    assert analyze_trace(trace, min_idle_s=0.1).verdict == "hang"


def test_pipeline_stage_offsets_are_not_slowness() -> None:
    """Stage s always reaches the world collective s x 20 ms late (pipeline schedule); rank 2
    is 5 ms late on top of its stage. Only with the topology is rank 2 found, and the late
    last stage is never called slow."""
    from trainsentry.diagnostics.topology import Topology

    topology = Topology(tp=1, pp=4, dp=2)  # stages {0,1} {2,3} {4,5} {6,7}
    dumps = {}
    for rank in range(8):
        dump = make_dump(rank, 8, 60, "slow" if rank == 2 else "ok", culprit=2, slow_ms=5.0)
        for entry in dump["entries"]:
            entry["time_created_ns"] += topology.stage_of(rank) * 20_000_000
        dumps[rank] = dump
    trace = _trace(dumps)
    trace.topology = topology
    report = analyze_trace(trace)
    assert [s.rank for s in report.slow.slow_ranks] == [2]
    assert report.verdict == "slow"
    trace.topology = None
    blind = analyze_trace(trace)
    assert 2 not in [s.rank for s in blind.slow.slow_ranks]  # hidden behind stage 3's skew


def test_parallel_parsing_matches_in_process(tmp_path: Path) -> None:
    from trainsentry.diagnostics.readers import flight_recorder as fr

    paths = write_dumps(tmp_path, 24, 30, "size", culprit=7)
    paths[4].write_bytes(b"\x80garbage")
    items = [(i, str(p), r) for i, (p, r) in enumerate(fr.infer_rank_names(paths).items())]
    chunks = fr._read_in_workers(items, 2, None)  # the fork path, whatever the caller
    assert len(chunks) > 1
    assert sorted(d.rank for c in chunks for d in c.dumps) == [r for r in range(24) if r != 4]
    one = analyze([tmp_path], workers=1).to_dict()
    two = analyze([tmp_path], workers=2).to_dict()
    for report in (one, two):
        report.pop("elapsed_s")
    assert one == two
    assert one["mismatches"][0]["culprit_ranks"] == [7]


def _p2p_entry(template: dict[str, Any], pg: list[str], name: str, seq: int, **extra: Any) -> dict:
    return dict(
        template,
        process_group=pg,
        profiling_name=name,
        is_p2p=True,
        p2p_seq_id=seq,
        collective_seq_id=0,
        input_sizes=[[1024]],
        output_sizes=[[1024]],
        **extra,
    )


def _pp_group_dumps(with_rank_2: bool) -> dict[int, dict[str, Any]]:
    """4 ranks without a usable pg_config (gloo's `{"": {"ranks": "[]"}}`); ranks 1-3 share
    group "5". Rank 1 (group rank 0) sends to group rank 1 (global rank 2) and waits."""
    dumps = {r: make_dump(r, 4, 10, "ok") for r in range(4) if with_rank_2 or r != 2}
    pg = ["5", "pipeline"]
    for rank, dump in dumps.items():
        dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        last = dump["entries"][-1]
        if rank == 0:
            continue
        dump["entries"].append(
            dict(last, process_group=pg, collective_seq_id=1, profiling_name="nccl:all_reduce")
        )
        if rank == 1:
            pending = {"state": "started", "retired": False, "time_discovered_completed_ns": None}
            dump["entries"].append(_p2p_entry(last, pg, "nccl:send 0->1", 1, **pending))
        if rank == 2:  # received an earlier message from group rank 0
            dump["entries"].append(_p2p_entry(last, pg, "nccl:recv 1<-0", 1))
    return dumps


def test_p2p_peer_in_a_group_of_unknown_membership_is_not_guessed() -> None:
    """Group "5" is {1, 2, 3}; rank 2's dump is lost, so the group looks like {1, 3}. Group
    rank 1 must not be read as position 1 of that list (rank 3): nothing says who it is."""
    report = analyze_trace(_trace(_pp_group_dumps(with_rank_2=False)))
    assert 3 not in report.hang.root_cause_ranks
    assert all(w.peer != 3 for w in report.hang.p2p_waits)
    assert any("5/p2p" in note and "membership" in note for note in report.notes)
    # With rank 2's dump, rank 2 itself says it is group rank 1 (`recv 1<-0`): named.
    full = analyze_trace(_trace(_pp_group_dumps(with_rank_2=True)))
    assert [(w.rank, w.peer) for w in full.hang.p2p_waits] == [(1, 2)]
    assert full.hang.root_cause_ranks == [2]


def test_world_size_from_all_gather_names_the_highest_rank_without_dump() -> None:
    """gloo-style dumps (no usable pg_config) of ranks 0-2 of a 4-rank job whose rank 3 never
    arrived: the all_gathers (output = 4 x input) give the world size, so rank 3 is named
    and the all_gathers are not a size mismatch of a 3-rank world."""
    dumps = {r: make_dump(r, 4, 12, "hang", culprit=3) for r in range(3)}
    for dump in dumps.values():
        dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
    report = analyze_trace(_trace(dumps))
    assert report.blocking_mismatches == []
    assert report.verdict == "hang"
    assert report.primary_hang is not None
    assert report.primary_hang.missing_ranks == (3,)
    # Its dump was not read: named as waited on, not as the root cause.
    assert report.hang.root_cause_ranks == [] and report.hang.unread_ranks == [3]
    # No all_gather at all: the world size is unknown, and the report says so.
    for dump in dumps.values():
        for entry in dump["entries"]:
            entry["profiling_name"] = "nccl:all_reduce"
            entry["output_sizes"] = entry["input_sizes"]
    blind = analyze_trace(_trace(dumps))
    assert blind.primary_hang is not None
    assert blind.primary_hang.missing_ranks == ()
    assert blind.to_dict()["hang"]["membership_known"] is False
    assert any("membership" in note and "unknown" in note for note in blind.notes)


def test_p2p_on_the_default_group_keeps_slow_detection() -> None:
    """Pipeline send/recv on the world group (TP=1, DP=4, PP=2: pairs r -> r + 4) and stage 1
    reaching every world collective 20 ms after stage 0. The p2p pairs give the stages;
    rank 2, 5 ms late within its stage, is found without a topology."""
    dumps = {}
    for rank in range(8):
        dump = make_dump(rank, 8, 60, "slow" if rank == 2 else "ok", culprit=2, slow_ms=5.0)
        stage = rank // 4
        for entry in dump["entries"]:
            entry["time_created_ns"] += stage * 20_000_000
        last = dump["entries"][-1]
        name = f"nccl:send {rank}->{rank + 4}" if stage == 0 else f"nccl:recv {rank}<-{rank - 4}"
        dump["entries"].extend(
            _p2p_entry(last, ["0", "default_pg"], name, seq) for seq in range(1, 4)
        )
        dumps[rank] = dump
    report = analyze_trace(_trace(dumps))
    assert [s.rank for s in report.slow.slow_ranks] == [2]
    assert report.verdict == "slow"


def test_coalesced_uneven_all_to_all_and_markers_are_not_mismatches() -> None:
    """A coalesced group of an all_to_all with uneven splits (sizes differ on every rank) and
    an all_reduce, closed by NCCL's `ALLGATHER_coalesced` marker whose sizes differ too: each
    member compared as its collective defines it (PyTorch's `Op.match`), so no mismatch."""
    dumps = {r: make_dump(r, 4, 6, "ok") for r in range(4)}
    for rank, dump in dumps.items():
        template = dict(dump["entries"][-1])
        for name, numel in (
            ("nccl:all_to_all", 10 + rank),
            ("nccl:all_reduce", 16),
            ("nccl:ALLGATHER_coalesced", 4 * (rank + 1)),
        ):
            dump["entries"].append(
                dict(
                    template,
                    collective_seq_id=7,
                    profiling_name=name,
                    input_sizes=[[numel]],
                    output_sizes=[[numel]],
                )
            )
    report = analyze_trace(_trace(dumps))
    assert report.blocking_mismatches == []
