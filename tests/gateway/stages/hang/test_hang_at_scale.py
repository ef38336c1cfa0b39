"""A hung Megatron-layout job against the real gateway: the card names the rank from the
stalled group's data only (tests/support/megatron_probes.py serves what probe/server.py
serves, and posts triggers as probe/trigger.py does).

256 ranks (TP 8 in a pod, PP 4, DP 8): rank 77 never issues its DP all_reduce; its 7 DP
peers wait in it, the TP groups of those peers wait for them, everyone else in a pipeline
recv. What the gateway must do: one card, naming rank 77 with its pod and node; dumps only
of rank 77 and the stalled group it was found in (its DP or its TP group), the suspect
first; `/status` of no more than the groups it follows from the first trigger to
ranks and probes that did not post; the stack of rank 77 only; the triggers answered
"known" after the first. bench/bench_hang_scale.py runs the same at 1,024 to 16,384 ranks.

About 30 s on the shared machine: a gateway subprocess, 256 simulated probes and the 20 s
stall threshold compressed to a 3 s lead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.megatron_probes import Layout, run_hang

pytestmark = [pytest.mark.e2e]


async def test_the_card_names_the_rank_from_the_stalled_groups_dumps_only(tmp_path: Path) -> None:
    layout = Layout(256, tp=8, pp=4)
    culprit = 77
    run = await run_hang(tmp_path, layout, culprit=culprit, lead_s=3.0, entries=200)
    # the stalled group located first is its DP group or its TP group, whichever the
    # triggers that arrived first lead to: either way one of the culprit's own groups
    group = set(layout.members(layout.dp_group(culprit)))
    group |= set(layout.members(layout.tp_group(culprit)))
    dumps = [rank for path, rank in run.asked if path == "dump"]
    statuses = [rank for path, rank in run.asked if path == "status"]
    stacks = [rank for path, rank in run.asked if path == "stack"]
    assert "gpt-w-9" in run.card["diagnosis"] and "gpu-00009" in run.card["diagnosis"]
    assert run.card["culprit_ranks"] == [culprit]
    assert run.cards == 1
    assert dumps and dumps[0] == culprit and set(dumps) <= group, dumps
    assert set(stacks) == {culprit}
    assert len(statuses) <= len(group), (statuses, run.located)  # the groups followed, no more
    assert run.triggers.answers.get(202) == 1 and run.triggers.answers.get(200, 0) > 200
    assert run.card_s < 25, run.card_s
