"""The scenario corpus (fr_scenarios.py): real gloo jobs, one per class of layout and fault.

Each class is read as torch wrote it (JSON and pickle, whose gloo `pg_config` names no
group) and with an NCCL-style `pg_config` (`pgcfg/`), and must give the exact verdict and
ranks the scenario was built to produce.
"""

from __future__ import annotations

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
