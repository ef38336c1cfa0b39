"""Hang classes with no real NCCL artifact yet, in torch's NCCL Flight Recorder format.

The dumps are built by `nccl_fr` (each entry a copy of a real H100 entry, the recorded values
set as ProcessGroupNCCL sets them; see its docstring for the sources). What happens between
the ranks is a model, stated per test: which batch or collective completes is decided by who
posted its side, the way NCCL matches them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnostics.nccl_fr import MIB, NcclRank, write_dumps
from trainsentry.cli import main as cli_main
from trainsentry.diagnostics import analyze

BASE_NS = 1_795_555_000_000_000_000
STEP_NS = 200_000_000  # the real H100 dumps' step period (socket transport, 4 MB)
DONE_NS = 150_000_000  # and when the watchdog discovered completion
TIMEOUT_NS = 60 * 10**9


def _ring_ranks(world: int, skipper: int, stop: int, steps: int) -> list[NcclRank]:
    """A ring exchange: every step each rank runs batch_isend_irecv([isend to r+1, irecv from
    r-1]) and waits for it (a CPU sync per step, as a training step's loss.item() does).

    At step `stop` rank `skipper` never posts its batch. A batch completes once every peer
    posted its matching side in the same step, so the ranks next to the skipper stop at
    `stop`, and the stall spreads one rank further each step after, until every rank waits
    (or, with no skipper, for `steps` steps).
    """
    ranks = [NcclRank(r, world) for r in range(world)]
    posted: dict[int, int] = dict.fromkeys(range(world), 0)  # last step posted
    done: dict[int, int] = dict.fromkeys(range(world), 0)  # last step completed
    for step in range(1, steps + 1):
        moved = False
        for r in range(world):
            if done[r] == step - 1 and not (r == skipper and step >= stop):
                posted[r] = step
                moved = True
        if not moved:
            break
        for r in range(world):
            if posted[r] == step:
                nxt, prv = (r + 1) % world, (r - 1) % world
                if posted[nxt] >= step and posted[prv] >= step:
                    done[r] = step
        for r in range(world):
            if posted[r] != step:
                continue
            created = BASE_NS + step * STEP_NS + r * 300_000
            finished = created + DONE_NS if done[r] == step else None
            ranks[r].batch(
                [("send", (r + 1) % world), ("recv", (r - 1) % world)], created, finished
            )
    return ranks


@pytest.mark.parametrize(("world", "skipper"), [(4, 2), (6, 3), (8, 0)])
def test_ring_exchange_names_the_rank_that_never_posted_its_batch(
    tmp_path: Path, world: int, skipper: int
) -> None:
    """Each waiting rank's pending batch names its send and recv partners; only the skipper
    waits on nobody. (Before: every rank was a root cause, because the ops inside a batch
    stay `scheduled` in torch's recorder even after the batch completed, so every rank
    seemed to wait in its oldest batch; and the batch's `nccl:coalesced` entry, recorded as
    a collective, landed in the collective stream.)"""
    ranks = _ring_ranks(world, skipper, stop=12, steps=40)
    folder = write_dumps(ranks, tmp_path / "dumps")
    last_ns = max(e["time_created_ns"] for r in ranks for e in r.entries)
    out = analyze([folder], captured_at_ns=last_ns + TIMEOUT_NS).to_dict()
    assert out["verdict"] == "hang", out
    assert out["culprit_ranks"] == [skipper]
    assert out["root_cause_ranks"] == [skipper]
    assert out["mismatches"] == []
    waits = {(w["rank"], w["peer"]) for w in out["p2p_waits"]}
    left, right = (skipper - 1) % world, (skipper + 1) % world
    assert (left, skipper) in waits and (right, skipper) in waits
    assert all(w["rank"] != skipper for w in out["p2p_waits"])
    hang = out["hang"]
    assert hang["communicator"] == "0/p2p" and hang["missing_ranks"] == [skipper]


def test_ring_exchange_that_completes_is_ok(tmp_path: Path) -> None:
    """Every batch completed: the ops inside it stay `scheduled`, the group's closing entry
    says `completed`: no wait, no hang."""
    ranks = _ring_ranks(4, skipper=-1, stop=99, steps=10)
    folder = write_dumps(ranks, tmp_path / "dumps")
    last_ns = max(e["time_created_ns"] for r in ranks for e in r.entries)
    out = analyze([folder], captured_at_ns=last_ns + TIMEOUT_NS).to_dict()
    assert out["verdict"] == "ok", out
    assert out["p2p_waits"] == [] and out["culprit_ranks"] == []


def _running_mismatch(world: int = 4, odd: int = 1, at: int = 12, last: int = 60) -> list[NcclRank]:
    """all_reduce of MIB floats every step; at step `at` rank `odd` all_reduces 2 x MIB.

    NCCL does not check counts: the odd rank's larger all_reduce consumes its peers' next one
    too (the ring carries bytes, not operations), so the job keeps running with the odd
    rank one collective behind: its seq k (k > at) runs with the others' k + 1, enqueued a
    step later than theirs. The dumps are taken in each process while this goes on, some
    just before, some just after enqueuing their latest all_reduce.
    """
    ranks = [NcclRank(r, world) for r in range(world)]

    def t(step: int, r: int) -> int:
        return BASE_NS + step * STEP_NS + r * 400_000

    for r in range(world):
        top = last - 1 if r == odd else last
        for seq in range(1, top + 1):
            if r != odd or seq < at:
                created, pairs_with = t(seq, r), seq
            elif seq == at:
                created, pairs_with = t(seq, r), seq + 1
            else:
                created, pairs_with = t(seq + 1, r) + 5_000_000, seq + 1
            in_flight = pairs_with >= last
            done = None if in_flight else t(pairs_with, 0) + DONE_NS
            numel = 2 * MIB if (r == odd and seq == at) else MIB
            ranks[r].all_reduce(created, done, numel)
    return ranks


def test_size_mismatch_in_a_running_job_names_the_odd_rank_only(tmp_path: Path) -> None:
    """Dumps taken while the job runs on, each with its capture time (what the probe's
    collector records): a size mismatch naming rank 1; no hang (the end of the record is
    40 ms old); no slow rank, though rank 1's later collectives pair with its peers' next
    ones and so look a step late."""
    ranks = _running_mismatch()
    folder = write_dumps(ranks, tmp_path / "dumps")
    for r in ranks:
        taken = max(e["time_created_ns"] for e in r.entries) + 40_000_000
        (folder / f"fr_nccl_rank_{r.rank}.captured_at_ns").write_text(str(taken))
    out = analyze([folder]).to_dict()
    assert out["verdict"] == "mismatch", out
    assert out["culprit_ranks"] == [1]
    blocking = [m for m in out["mismatches"] if m["kind"] != "state"]
    assert [(m["seq"], m["kind"], m["culprit_ranks"]) for m in blocking] == [(12, "size", [1])]
    assert out["hangs"] == [] and out["root_cause_ranks"] == []
    assert out["slow_ranks"] == []


def test_size_mismatch_in_a_running_job_copied_without_capture_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same dumps copied off the cluster (fresh file times, no capture time): the end of
    the record cannot be timed, but the job ran 48 collectives past the mismatch, so that end
    is no hang of its own and names nobody; the mismatch names rank 1 alone."""
    folder = write_dumps(_running_mismatch(), tmp_path / "dumps")
    code = cli_main(["analyze", str(folder), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 4 and out["verdict"] == "mismatch"
    assert out["culprit_ranks"] == [1]
    assert out["hangs"] == [] and out["root_cause_ranks"] == [] and out["slow_ranks"] == []
    cli_main(["analyze", str(folder)])
    summary = " ".join(capsys.readouterr().out.split())
    assert "root cause" not in summary and "slow ranks" not in summary


def test_a_stall_after_a_size_mismatch_is_explained_by_it(tmp_path: Path) -> None:
    """Rank 2's all_reduce #5 is twice as large; from there on equal numbers pair different
    operations, and at #9 rank 3 looks missing. The mismatch explains it: rank 2 is named,
    #9 is a note, not a hang of rank 3's (before: the report's hang named rank 3 as its
    root cause)."""
    ranks = [NcclRank(r, 4) for r in range(4)]
    for seq in range(1, 10):
        for r in ranks:
            if seq == 9 and r.rank == 3:
                continue
            created = BASE_NS + seq * STEP_NS + r.rank * 300_000
            done = None if seq == 9 else created + DONE_NS
            r.all_reduce(created, done, 2 * MIB if (seq == 5 and r.rank == 2) else MIB)
    folder = write_dumps(ranks, tmp_path / "dumps")
    last_ns = max(e["time_created_ns"] for r in ranks for e in r.entries)
    out = analyze([folder], captured_at_ns=last_ns + TIMEOUT_NS).to_dict()
    assert out["verdict"] == "mismatch" and out["culprit_ranks"] == [2]
    assert out["hangs"] == [] and out["root_cause_ranks"] == [] and out["hang"] is None
    assert any("after the mismatch at seq 5" in n and "[3]" in n for n in out["notes"])
