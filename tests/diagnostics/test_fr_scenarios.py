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
