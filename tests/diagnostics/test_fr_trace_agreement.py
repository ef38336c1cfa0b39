"""Agreement with PyTorch's own Flight Recorder analysis (`torch.distributed.flight_recorder`,
the library behind `fr_trace`) on every scenario of the corpus where it runs.

fr_trace needs an NCCL-style `pg_config` (on raw gloo dumps it fails), so it reads the
`pgcfg/` variant. For each collective fr_trace reports with missing ranks, trainsentry must
report a stuck collective of the same group and sequence number missing the same ranks, and
the other way round; mismatch culprits must be equal. Where trainsentry says more (root
cause vs. victims, never-started ranks), that is on top of the agreement, not instead of it.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from trainsentry.diagnostics import analyze

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

SCENARIOS = ("tpdp", "cascade", "rooted", "split", "size")


def _fr_trace(folder: Path) -> Any:
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    logging.getLogger("torch.distributed.flight_recorder").setLevel(logging.CRITICAL)
    args = JobConfig().parse_args([str(folder), "--prefix", "fr_rank_"])
    details, version = read_dir(args)
    return build_db(details, args, version)


def _renamed_split(source: Path, target: Path) -> Path:
    """As in test_fr_scenarios: both halves named "1", as split_group names them."""
    target.mkdir()
    for path in sorted(source.iterdir()):
        dump = pickle.loads(path.read_bytes())
        for entry in dump["entries"]:
            if entry["process_group"][0] == "2":
                entry["process_group"] = ("1", entry["process_group"][1])
        if "2" in dump["pg_config"]:
            dump["pg_config"]["1"] = {**dump["pg_config"].pop("2"), "name": "1"}
        (target / path.name).write_bytes(pickle.dumps(dump))
    return target


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_missing_ranks_and_culprits_equal_fr_trace(
    fr_corpus: dict[str, Path], scenario: str, tmp_path: Path
) -> None:
    folder = fr_corpus[scenario] / "pgcfg"
    if scenario == "split":
        folder = _renamed_split(folder, tmp_path / "split")
    db = _fr_trace(folder)
    theirs_missing = {
        (c.pg_desc.split(":", 1)[1], c.collective_seq_id): sorted(c.missing_ranks)
        for c in db.collectives
        if c.missing_ranks
    }
    theirs_culprits = sorted(
        r for c in db.collectives if not c.pass_check for r in (c.mismatch_collectives or {})
    )
    out = analyze([folder]).to_dict()
    ours_missing = {
        (h["description"], h["seq"]): h["missing_ranks"] for h in out["hangs"] if h["missing_ranks"]
    }
    ours_culprits = sorted(
        r for m in out["mismatches"] if m["kind"] != "state" for r in m["culprit_ranks"]
    )
    assert ours_missing == theirs_missing
    assert ours_culprits == theirs_culprits
    # What each scenario was built to show (so agreement is not agreement on nothing).
    expected = {
        "tpdp": {("tp-1", 4): [3], ("dp-0", 7): [2], ("dp-1", 7): [3]},
        "cascade": {("sub", 3): [6], ("default_pg", 3): [4, 5, 7]},
        "rooted": {},
        "split": {("tp", 3): [3]},
        "size": {},
    }[scenario]
    assert ours_missing == expected
    assert ours_culprits == ([2] if scenario == "size" else [])


def _nccl(case: str) -> Path:
    from tests.support.nccl_artifacts import nccl_dir

    return nccl_dir() / case / "watchdog"


def _fr_trace_nccl(case: str) -> Any:
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    logging.getLogger("torch.distributed.flight_recorder").setLevel(logging.CRITICAL)
    args = JobConfig().parse_args([str(_nccl(case)), "--prefix", "fr_nccl_rank_"])
    details, version = read_dir(args)
    return build_db(details, args, version)


def test_real_nccl_hang_agrees() -> None:
    (stuck,) = [c for c in _fr_trace_nccl("hang").collectives if c.missing_ranks]
    out = analyze([_nccl("hang")]).to_dict()
    assert (stuck.collective_seq_id, sorted(stuck.missing_ranks)) == (20, [2])
    assert (out["hang"]["seq"], out["hang"]["missing_ranks"]) == (20, [2])


def test_real_nccl_stuck_gpu_agrees_on_the_culprit() -> None:
    """fr_trace calls all_reduce #20 a state mismatch (started vs scheduled) with culprit
    rank 3; trainsentry names rank 3 as never having started it."""
    (bad,) = [c for c in _fr_trace_nccl("compute_timing").collectives if not c.pass_check]
    out = analyze([_nccl("compute_timing")]).to_dict()
    assert (bad.collective_seq_id, sorted(bad.mismatch_collectives or {})) == (20, [3])
    assert out["hang"]["not_started_ranks"] == [3] and out["root_cause_ranks"] == [3]


def test_real_nccl_pipeline_where_fr_trace_differs() -> None:
    """fr_trace calls the pipeline's early sends and receives mismatches naming ranks 0, 2
    and 3, and does not name rank 2 as the stage that stopped. It is wrong there: the flagged
    entries compare ops of one p2p sequence number across ranks, but `p2p_seq_id` counts
    each rank's own sends and receives (rank 1 does a recv and a send per step, rank 0 only
    a send), so #5 on one rank is not #5's partner on another. Every one of those operations
    completed (the dumps say `completed`); the only incomplete ones are the waits on rank 2.
    trainsentry follows each pending send or receive to the peer it names, names
    rank 2 and calls nothing a mismatch."""
    from tests.support.nccl_artifacts import watchdog_dump

    flagged = [c for c in _fr_trace_nccl("pp").collectives if not c.pass_check]
    assert flagged and all(
        c.collective_name.split(":")[1].split()[0] in ("send", "recv") for c in flagged
    )
    assert all(2 not in (c.missing_ranks or set()) for c in flagged)
    for rank in range(4):
        entries = watchdog_dump("pp", rank)["entries"]
        pending = [e for e in entries if e["state"] != "completed"]
        assert len(pending) <= 1  # only the last op, waiting on its stopped neighbour
    out = analyze([_nccl("pp")]).to_dict()
    assert out["mismatches"] == []
    assert out["root_cause_ranks"] == [2]
