"""The scenario corpus (fr_scenarios.py): real gloo jobs, one per class of layout and fault.

Each class is read as torch wrote it (JSON and pickle, whose gloo `pg_config` names no
group) and with an NCCL-style `pg_config` (`pgcfg/`), and must give the exact verdict and
ranks the scenario was built to produce.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from trainsentry.diagnostics import analyze

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

VARIANTS = ("json", "pkl", "pgcfg")


@pytest.mark.parametrize("variant", VARIANTS)
def test_tp_dp_hang_names_the_rank_that_stopped(fr_corpus: dict[str, Path], variant: str) -> None:
    """Rank 3 stops before its TP all_reduce of step 4. Its DP group is ahead of its TP
    group in sequence numbers (two DP all_reduces per step), and its local pg_id 2 is DP
    group "6" while group "2" is its TP pair: pg_status read by name made rank 3 look as if
    it had reached TP #6, and rank 2 (waiting on it) was blamed."""
    out = analyze([fr_corpus["tpdp"] / variant]).to_dict()
    assert out["verdict"] == "hang"
    assert out["hang"]["root_cause_ranks"] == [3]
    assert out["hang"]["missing_ranks"] == [3]
    tp = [h for h in out["hangs"] if h["description"] == "tp-1"]
    assert [(h["seq"], h["arrived_ranks"], h["missing_ranks"]) for h in tp] == [(4, [2], [3])]
    assert 2 in out["hang"]["victim_ranks"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_cascade_names_the_rank_that_skipped(fr_corpus: dict[str, Path], variant: str) -> None:
    """Rank 6 skips the sub-group all_reduce of step 3 and enters the world one: 4, 5 and 7
    wait for it in the sub-group, so they never reach the world collective. The waits form a
    cycle (6 waits on them in the world, they wait on 6); rank 6's own history (sub-group
    before world in step 2) says it skipped. Before, the verdict named 4, 5, 6 and 7."""
    out = analyze([fr_corpus["cascade"] / variant]).to_dict()
    assert out["verdict"] == "hang"
    assert out["root_cause_ranks"] == [6]
    assert out["victim_ranks"] == [4, 5, 7]
    assert out["skipped_ranks"] == [6]
    assert out["culprit_ranks"] == [6]
    assert out["hang"]["description"] == "sub"
    assert out["hang"]["missing_ranks"] == [6]
    world = [h for h in out["hangs"] if h["description"] == "default_pg"]
    assert [(h["seq"], h["missing_ranks"]) for h in world] == [(3, [4, 5, 7])]


def _as_split_group(source: Path, target: Path) -> Path:
    """The split scenario's dumps as `split_group` records them: both halves named "1".

    split_group needs a device bound to the default group (gloo on a CPU refuses: "No device
    associated with the default pg"), so the job made the halves with new_group ("1" and
    "2"); renaming "2" to "1" in the entries and the pg_config is the only difference."""
    target.mkdir()
    for path in sorted(source.iterdir()):
        dump = pickle.loads(path.read_bytes())
        for entry in dump["entries"]:
            if entry["process_group"][0] == "2":
                entry["process_group"] = ("1", entry["process_group"][1])
        config = dump["pg_config"]
        if "2" in config:
            config["1"] = {**config.pop("2"), "name": "1"}
        (target / path.name).write_bytes(pickle.dumps(dump))
    return target


def test_split_groups_sharing_a_name_are_told_apart(
    fr_corpus: dict[str, Path], tmp_path: Path
) -> None:
    """{0,1} all_reduce 8 floats, {2,3} 4 floats, both named "1"; rank 3 stops before the
    third. Merged by name they looked like a size mismatch between {0,1} and {2,3}; told
    apart by the membership each rank's pg_config declares, {2,3} hangs on rank 3."""
    out = analyze([_as_split_group(fr_corpus["split"] / "pgcfg", tmp_path / "split")]).to_dict()
    assert out["mismatches"] == []
    assert out["verdict"] == "hang"
    assert out["root_cause_ranks"] == [3]
    hang = out["hang"]
    assert (hang["communicator"], hang["seq"], hang["arrived_ranks"], hang["missing_ranks"]) == (
        "1{2-3}",
        3,
        [2],
        [3],
    )
    assert [h["communicator"] for h in out["hangs"]] == ["1{2-3}"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_rooted_collectives_and_uneven_all_to_all_are_not_mismatches(
    fr_corpus: dict[str, Path], variant: str
) -> None:
    """A healthy job: gather/scatter to root 0 (gloo records the non-roots' gathered or
    scattered side empty: `[]` sizes and dtypes), reduce, broadcast, and all_to_all_single
    with uneven splits (rank r sends r + 1 + j to rank j: sizes differ on every rank). They
    were called dtype and size mismatches."""
    out = analyze([fr_corpus["rooted"] / variant]).to_dict()
    assert out["mismatches"] == []
    assert out["verdict"] == "ok"
    assert out["culprit_ranks"] == []


def test_cascade_summary_says_who_skipped(
    fr_corpus: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from trainsentry.cli import main as cli_main

    assert cli_main(["analyze", str(fr_corpus["cascade"] / "json")]) == 3
    summary = " ".join(capsys.readouterr().out.split())
    assert "root cause rank(s): 6; victims: 4, 5, 7" in summary
    assert "rank(s) 6 skipped a collective and moved on" in summary


def test_group_described_by_pg_config_when_entries_say_undefined(
    fr_corpus: dict[str, Path], tmp_path: Path
) -> None:
    """A group made without `group_desc` records "undefined" in its entries; where the
    pg_config describes it (NCCL's does), the hang carries that description."""
    for path in sorted((fr_corpus["tpdp"] / "pgcfg").iterdir()):
        dump = pickle.loads(path.read_bytes())
        for entry in dump["entries"]:
            entry["process_group"] = (entry["process_group"][0], "undefined")
        (tmp_path / path.name).write_bytes(pickle.dumps(dump))
    out = analyze([tmp_path]).to_dict()
    assert {h["description"] for h in out["hangs"]} == {"tp-1", "dp-0", "dp-1"}


def test_split_group_rank_without_pg_config_joins_the_membership_that_holds_it(
    fr_corpus: dict[str, Path], tmp_path: Path
) -> None:
    """Rank 3's dump loses its pg_config: rank 2 declares {2,3} for "1", so rank 3's "1"
    entries join that group; the answer is the same."""
    folder = _as_split_group(fr_corpus["split"] / "pgcfg", tmp_path / "split")
    dump = pickle.loads((folder / "fr_rank_3").read_bytes())
    dump["pg_config"] = {}
    (folder / "fr_rank_3").write_bytes(pickle.dumps(dump))
    out = analyze([folder]).to_dict()
    assert out["mismatches"] == [] and out["root_cause_ranks"] == [3]
    assert [(h["communicator"], h["missing_ranks"]) for h in out["hangs"]] == [("1{2-3}", [3])]
