"""Issue 44, "A fabric failure is one incident", end to end: a leaf switch under 8 nodes of
a 12-node job dies while another team's job trains on 2 other nodes, with real Prometheus
(shipped and job-rendered rules), Alertmanager (shipped routes), the gateway with
docs/channels.md's Feishu bot groups, a bot per job and the escalation, and
docs/infrastructure.md's `topology:` (tests/support/fabric_death.py says what is real).
Run with `-s` to see the timeline of what the on-call person received.

Default: every duration / 10; TRAINSENTRY_NODE_DEATH_SCALE=1 for the real-time run (8
minutes). Why it takes about 100 s: the issue's 8 minutes are 48 s at that scale, and the
stack (Prometheus with 142 targets, Alertmanager, the gateway) needs its scrapes up and a
few healthy evaluations first; one scenario, one module-scoped run.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support.fabric_death import (
    LEAF_DEATH,
    LEAF_PARTS,
    OTHER,
    RAIL_DEATH,
    RAIL_PARTS,
    job_hook,
    rail_topology_section,
    run,
)
from tests.support.node_death import (
    JOB,
    NAMESPACE,
    Recording,
    node_scoped_alerts,
    scale_from_env,
)

FACTOR = scale_from_env()
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(int(150 + 1.5 * LEAF_DEATH.end / FACTOR))]
EIGHT_MINUTES, TWO_MINUTES = 480.0, 120.0


@pytest.fixture(scope="module")
def leaf(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    recording = asyncio.run(run(Path(tmp_path_factory.mktemp("leaf-death")), FACTOR))
    print("\n" + recording.report())
    return recording


def test_a_dead_leaf_switch_is_one_incident_that_pages_once(leaf: Recording) -> None:
    assert leaf.before_start == set(), "a healthy cluster fires nothing"
    for name in ("IBPhysicalLinkDown", "NCCLRasCommunicatorErrors", "TrainingJobOnFaultyNode"):
        assert name in leaf.fired, (name, leaf.fired)
    # the job tunes no fabric rule: only the cluster-wide IB alerts fire, no job copy
    hardware = node_scoped_alerts()
    assert not set(leaf.fired_job_scoped) & hardware, leaf.fired_job_scoped
    for part in LEAF_PARTS:
        loaded = leaf.job_rules(part.namespace, part.job)
        assert "NCCLRasCommunicatorErrors" in loaded and not loaded & hardware, sorted(loaded)
    assert not {"KubeNodeNotReady", "GPUFellOffBus"} & set(leaf.fired), "nodes and GPUs fine"
    first8 = leaf.within(EIGHT_MINUTES)
    lines = [m.line() for m in first8.messages]
    assert len(first8.feishu()) <= 5, lines
    assert len(first8.calls()) <= 2, lines
    paged = {key.split(":")[1] for key in leaf.call_keys if key.startswith("esc:")}
    assert len(paged) <= 1, leaf.call_keys
    # every card leads with the switch: none is one alert's (a node's port), none names a node
    assert all(m.title.split(": ", 1)[-1].startswith("leaf-a") for m in first8.feishu()), lines
    assert not [m for m in first8.feishu() if "gpu-node" in m.title or "mlx5" in m.title], lines
    assert any(m.at <= TWO_MINUTES and "leaf-a" in m.title for m in first8.feishu()), lines
    assert any(f"{NAMESPACE}/{JOB}" in m.text for m in first8.feishu()), "the job is named"
    # team-a is told through its own bot (its notice), once
    own = [m for m in first8.feishu() if m.channel == f"feishu:{job_hook(LEAF_PARTS[0])}"]
    assert len(own) == 1 and f"{NAMESPACE}/{JOB}" in own[0].text, lines


def test_a_dead_leaf_switch_leaves_the_other_team_alone(leaf: Recording) -> None:
    """team-b/bert trains on two nodes under leaf-b: no card or notice names it, its own bot
    gets nothing, and none of its alerts reaches the gateway."""
    other = f"{OTHER.namespace}/{OTHER.job}"
    assert len(leaf.job_rules(OTHER.namespace, OTHER.job)) > 10, "its rules are loaded"
    assert not [m.line() for m in leaf.messages if other in m.text or OTHER.job in m.title]
    assert not [m for m in leaf.messages if m.channel == f"feishu:{job_hook(OTHER)}"]
    assert not [a for a in leaf.gateway_alerts if a["labels"].get("namespace") == OTHER.namespace]
    assert not [a for a in leaf.gateway_alerts if a["labels"].get("node") in OTHER.nodes]


# The rail variant takes 70-140 s more and its message count moved with the machine's load
# (5-6 messages); the planning test (tests/gateway/stages/planning/test_fabric_incident.py)
# checks its logic on every run. CI runs it only with TRAINSENTRY_FULL_E2E=1.
FULL_E2E = os.environ.get("TRAINSENTRY_FULL_E2E") == "1"


@pytest.fixture(scope="module")
def rail(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    if not FULL_E2E:
        pytest.skip("the rail-optimized end-to-end run needs TRAINSENTRY_FULL_E2E=1")
    recording = asyncio.run(
        run(
            Path(tmp_path_factory.mktemp("rail-death")),
            FACTOR,
            RAIL_DEATH,
            RAIL_PARTS,
            rail_topology_section(),
        )
    )
    print("\n" + recording.report())
    return recording


def test_a_dead_rail_leaf_is_one_incident_naming_both_jobs(rail: Recording) -> None:
    """Rail-optimized: leaf-3 serves HCA mlx5_3 of 16 nodes of two jobs (team-a on 8,
    team-b on 8); it dies. One incident named by the leaf, each job told, no per-node card."""
    assert "IBPhysicalLinkDown" in rail.fired
    first8 = rail.within(EIGHT_MINUTES)
    lines = [m.line() for m in first8.messages]
    assert all(m.title.split(": ", 1)[-1].startswith("leaf-3") for m in first8.feishu()), lines
    assert any("leaf-3 down: 16 ports on 16 nodes" in m.title for m in first8.feishu()), lines
    paged = {key.split(":")[1] for key in rail.call_keys if key.startswith("esc:")}
    assert len(paged) == 1, rail.call_keys
    for part in RAIL_PARTS:  # each job's notice through its own route (its bot), once
        job = f"{part.namespace}/{part.job}"
        own = [m for m in first8.feishu() if m.channel == f"feishu:{job_hook(part)}"]
        assert len(own) == 1 and own[0].title.endswith(f"— {job}"), (job, lines)
        assert not [m for m in first8.feishu() if m.title.endswith(f"— {job}") and m not in own]
