"""Issue 37, "One failure, one page", end to end: a node's death with real Prometheus,
Alertmanager and gateway (tests/support/node_death.py says what is real and how time is
scaled). Run with `-s` to see each scenario's timeline of what the on-call person received.

Two kinds of tests per scenario:
- the harness: Prometheus fires the alerts the scenario implies in their order, the shipped
  rules keep the GPU alert firing across the dead node's scrape gap, Alertmanager delivers to
  the gateway, and what reached Feishu and the phone is counted;
- the issue's "Done when" (at most 5 messages and one paged incident in 8 minutes, the node
  named within 90 s and the job within 2 minutes, no RESOLVED for the GPU while the node is
  dead, the hang card names the dead node's ranks; scenario 2: the GPU's incident stays open
  until the GPU returns, then one resolution). The gateway's correlation (issue 37 items
  1-6) is not built on this branch, so these are expected to fail (strict: the day they
  pass, the marker must go).

Default: every duration / 10 (about a minute and a half and three minutes; the two
scenarios run at the same time, each on its own stack: `recordings`); set
TRAINSENTRY_NODE_DEATH_SCALE=1 for the real-time run (8 and 25 minutes).
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from tests.support.node_death import (
    COMES_BACK,
    DEAD_NODE,
    DEAD_RANKS,
    JOB,
    NAMESPACE,
    NODE_DEATH,
    Recording,
    node_scoped_alerts,
    run,
    scale_from_env,
)

FACTOR = scale_from_env()
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(int(120 + 1.5 * COMES_BACK.end / FACTOR))]
CORRELATION = (
    "issue 37 items 1-6 (the gateway's correlation by failure domain) are built on another "
    "branch; on this one a node's death still reaches the person as many pages"
)
EIGHT_MINUTES = 480.0
RESOLVED = re.compile(r"resolved|RESOLVED|已恢复|Resolved")
# In Prometheus, from the XID on (scenario seconds, with room for 30 s scrapes and
# evaluations): the fault, the job's pods on its node, then the node's consequences, then
# the job's.
EXPECTED_FIRING = {
    "GPUFellOffBus": (0, 90),
    "TrainingJobOnFaultyNode": (0, 150),
    "NCCLRasDeadProcesses": (100, 200),
    "KubeNodeNotReady": (180, 270),
    "TrainingJobHang": (330, 420),
    "TrainingProbeDown": (320, 420),
}


def _keep(recording: Recording) -> None:
    print("\n" + recording.report())
    if os.environ.get("TRAINSENTRY_NODE_DEATH_RECORD"):
        out = Path(os.environ["TRAINSENTRY_NODE_DEATH_RECORD"])
        out.mkdir(parents=True, exist_ok=True)
        name = recording.timeline.name.replace(" ", "-")
        (out / f"{name}-x{FACTOR:g}.json").write_text(recording.as_json())


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Recording]:
    """Both scenarios, run at the same time, each on a stack of its own (its own exporter,
    Prometheus, Alertmanager, gateway, Feishu and phone servers: nothing is shared but the
    event loop), so the death's set-up and minute and a half pass during the comeback's:
    one wait instead of two. The stacks mostly wait between scaled scrapes and evaluations."""

    async def both() -> list[Recording]:
        return await asyncio.gather(
            run(NODE_DEATH, tmp_path_factory.mktemp("node-death"), FACTOR),
            run(COMES_BACK, tmp_path_factory.mktemp("node-comes-back"), FACTOR),
        )

    death, comeback = asyncio.run(both())
    _keep(death)
    _keep(comeback)
    return {"death": death, "comeback": comeback}


@pytest.fixture(scope="module")
def death(recordings: dict[str, Recording]) -> Recording:
    return recordings["death"]


@pytest.fixture(scope="module")
def comeback(recordings: dict[str, Recording]) -> Recording:
    return recordings["comeback"]


def _gpu_resolved(recording: Recording, until: float | None = None) -> list[float]:
    """When a message said the GPU's alert (GPUFellOffBus on the dead node) resolved."""
    return [
        m.at
        for m in recording.messages
        if (until is None or m.at < until)
        and RESOLVED.search(m.title)
        and ("GPUFellOffBus" in m.text or "fallen off the bus" in m.text or "fell off" in m.text)
    ]


def _assert_harness(recording: Recording) -> None:
    assert recording.before_start == set(), "a healthy cluster fires nothing"
    # The node died 20 s after the XID, later only while Prometheus had not scraped the XID
    # three times yet (node_death_exporter.XID_SCRAPES_BEFORE_DEATH).
    assert recording.death_at is not None and 20 <= recording.death_at <= 45, recording.death_at
    hardware = node_scoped_alerts()
    for name, (earliest, latest) in EXPECTED_FIRING.items():
        assert name in recording.fired, (name, recording.fired)
        assert earliest <= recording.fired[name] <= latest, (name, recording.fired[name])
        if name in hardware:  # the cluster-wide alert only: the job tunes no node rule
            assert name not in recording.fired_job_scoped, ("no job copy fires", name)
        else:  # the job's own (pod) rules
            assert name in recording.fired_job_scoped, ("the job's alert fires", name)
    order = sorted(EXPECTED_FIRING, key=recording.fired.__getitem__)
    assert order[0] == "GPUFellOffBus", order
    assert recording.fired["KubeNodeNotReady"] < recording.fired["TrainingJobHang"], order
    # The culprit rank's probe vanished with the node before its stall threshold.
    assert "TrainingRankStalledBehindPeers" not in recording.fired
    # A NotReady node's exporters are not alerted on (they paged before KubeNodeNotReady).
    assert not {"DCGMExporterDown", "NodeExporterDown"} & set(recording.fired)
    # Alertmanager delivered: the gateway holds the alerts, people got messages and calls.
    delivered = {item["labels"]["alertname"] for item in recording.gateway_alerts}
    assert {"GPUFellOffBus", "KubeNodeNotReady", "TrainingJobHang"} <= delivered, delivered
    assert recording.feishu() and recording.calls()


def test_node_death_harness(death: Recording) -> None:
    _assert_harness(death)
    # keep_firing_for: the GPU's alert never stops while its node is dead (it did at +67 s).
    after_fire = [
        firing for at, firing in death.gpu_alert_firing if at >= death.fired["GPUFellOffBus"]
    ]
    assert after_fire and all(after_fire), "GPUFellOffBus stopped firing in Prometheus"


# Paged incidents (escalations): one, the node's. The operator renders no job copy of a
# hardware rule the job does not tune (docs/alerts.md "Job scope"), so no tenant's copy of
# GPUFellOffBus races the cluster-wide alert to the gateway (issue 43 measured two
# escalations when it won); the job is named by its own alerts joining the node's incident
# (TrainingJobOnFaultyNode names job and node; NCCL RAS and the hang follow the job there).
PAGED_INCIDENTS = 1


def _paged(recording: Recording) -> set[str]:
    return {key.split(":")[1] for key in recording.call_keys if key.startswith("esc:")}


def test_node_death_is_one_incident_that_tells_its_story(death: Recording) -> None:
    first8 = death.within(EIGHT_MINUTES)
    # the count: Feishu messages; calls: one paged incident (its repeats only)
    assert len(first8.feishu()) <= 5, [m.line() for m in first8.messages]
    assert len(_paged(death)) <= PAGED_INCIDENTS, death.call_keys
    first = first8.messages[0]
    assert first.at <= 90 and DEAD_NODE in first.text, first.line()
    assert any(m.at <= 120 and JOB in m.text for m in first8.messages), "job named in 2 min"
    assert _gpu_resolved(death) == []
    hang = [m for m in first8.messages if "hung" in m.text or "Hang" in m.text]
    assert hang, "a hang card"
    ranks = f"{DEAD_RANKS[0]}–{DEAD_RANKS[-1]}"
    assert any(
        DEAD_NODE in m.text and (ranks in m.text or f"{DEAD_RANKS[0]}-{DEAD_RANKS[-1]}" in m.text)
        for m in hang
    )


def test_no_job_copy_of_an_untuned_hardware_rule_reaches_prometheus(death: Recording) -> None:
    """The rules Prometheus loaded from the operator's PrometheusRule for the job: its pod
    rules, no copy of a node-level (hardware) rule; and no alert of such a rule fired with
    the job's labels. The job's notice of the fault is its own TrainingJobOnFaultyNode."""
    loaded = death.job_rules(NAMESPACE, JOB)
    assert {"TrainingJobHang", "NCCLRasDeadProcesses", "TrainingJobOnFaultyNode"} <= loaded
    hardware = node_scoped_alerts()
    assert {"GPUFellOffBus", "KubeNodeNotReady", "IBPhysicalLinkDown"} <= hardware
    assert not loaded & hardware, sorted(loaded & hardware)
    assert not set(death.fired_job_scoped) & hardware, death.fired_job_scoped
    onto = [
        item["labels"]
        for item in death.gateway_alerts
        if item["labels"]["alertname"] == "TrainingJobOnFaultyNode"
    ]
    assert onto and all(
        (labels["node"], labels["namespace"], labels["trainingjob"]) == (DEAD_NODE, NAMESPACE, JOB)
        for labels in onto
    ), onto


def test_node_comes_back_harness(comeback: Recording) -> None:
    _assert_harness(comeback)
    back, gpu_back = COMES_BACK.back_at, COMES_BACK.gpu_back_at
    assert back is not None and gpu_back is not None
    # Firing from the XID through the node's death and return; it ends once keep_firing_for
    # has run out after the GPU came back (15 m after the expression last matched).
    states = comeback.gpu_alert_firing
    assert all(firing for at, firing in states if comeback.fired["GPUFellOffBus"] <= at <= gpu_back)
    assert not states[-1][1], "GPUFellOffBus resolved in the end"


def test_node_comes_back_the_incident_stays_open_until_the_gpu_returns(comeback: Recording) -> None:
    first8 = comeback.within(EIGHT_MINUTES)
    assert len(first8.feishu()) <= 5, [m.line() for m in first8.messages]
    assert len(_paged(comeback)) <= PAGED_INCIDENTS, comeback.call_keys
    gpu_back = COMES_BACK.gpu_back_at
    assert gpu_back is not None
    assert _gpu_resolved(comeback, until=gpu_back) == []
    resolved = [m for m in comeback.messages if RESOLVED.search(m.title)]
    assert len(resolved) == 1 and resolved[0].at >= gpu_back, [m.line() for m in resolved]
