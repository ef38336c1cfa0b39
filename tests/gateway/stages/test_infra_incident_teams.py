"""Issue 43, "An ack, a route and a page never cross jobs", inside an infrastructure
incident: leaf switch leaf-a dies under three nodes (the chart's cluster-wide
`IBPhysicalLinkDown{node, device, port, component="fabric"}`, no `namespace`), and two teams'
jobs train there: team-a's on gpu-node-00 and -01 (its Feishu chat, owners and on-call
roster), team-b's on gpu-node-02 (its signed bot and roster). Both are routes of their own
(spec.alerting). The infrastructure on-call is the gateway's own escalation (gus, then gil):
the shipped policy has no route for `scope: infrastructure`, so the incident's page takes
the default P0 route.

Through the real gateway (loopback HTTP), the Kubernetes API as the kmock emulator, Feishu as
the contract server (chats, custom bots, urgent_phone calls), time virtual, the static
`topology:` of docs/infrastructure.md: who is called and told, per team, is counted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.stages.test_cluster_incident_teams import (
    ACCESS,
    GLOBAL_LAYERS,
    TOKEN,
    ack_as,
    alert_id,
    bot_cards,
    create_team_jobs,
    rung,
    shown,
)
from tests.gateway.stages.test_job_alerting import (
    GLOBAL_CHAT,
    Running,
    cluster,
    feishu,
    gateway_with,
)
from tests.support.clock import Clock
from tests.support.feishu_server import FeishuContractServer
from tests.support.kube_emulator import KubeEmulator
from tests.support.webhook_factory import BASE_TIME, make_alert

__all__ = ["cluster", "feishu"]  # the fixtures this module uses from test_job_alerting

NODES = ("gpu-node-00", "gpu-node-01", "gpu-node-02")
TOPOLOGY = {
    "levels": ["leaf_switch", "rack"],
    "nodes": {node: {"leaf_switch": "leaf-a", "rack": "r1"} for node in NODES},
}
JOB_NODES = {"team-a": NODES[0], "team-b": NODES[2]}


def port_down(index: int, node: str, clock: Clock) -> dict[str, Any]:
    """The chart's cluster-wide IBPhysicalLinkDown (rules/fabric.yaml): no namespace, no job."""
    alert = make_alert(
        index,
        name="IBPhysicalLinkDown",
        labels={"node": node, "device": "mlx5_0", "port": "1", "priority": "P0",
                "component": "fabric"},
        starts_at=clock.now,
    )  # fmt: skip
    del alert["labels"]["namespace"], alert["labels"]["trainingjob"], alert["labels"]["gpu"]
    return alert


def job_alert(index: int, team: str, name: str, priority: str, clock: Clock) -> dict[str, Any]:
    """A job's alert of the shipped rules (rules/training.yaml), its namespace set by
    prometheus-operator; `TrainingJobOnFaultyNode` names the node, the hang none."""
    labels = {"namespace": team, "trainingjob": team[-1], "priority": priority,
              "component": "training", "node": JOB_NODES[team]}  # fmt: skip
    alert = make_alert(index, name=name, labels=labels, starts_at=clock.now)
    del alert["labels"]["gpu"]
    if name != "TrainingJobOnFaultyNode":
        del alert["labels"]["node"]
    return alert


@pytest.fixture
async def leaf(
    cluster: KubeEmulator, feishu: FeishuContractServer, tmp_path: Path
) -> AsyncIterator[tuple[Running, Clock]]:
    """The gateway with the topology, both teams' jobs and rosters and the proxy's people."""
    await create_team_jobs(cluster, feishu)
    clock = Clock(BASE_TIME)
    gateway = {
        "api_token": TOKEN,
        "console": {"trusted_proxies": ["127.0.0.0/8"]},
        "access": ACCESS,
    }
    async with gateway_with(
        cluster,
        feishu,
        tmp_path,
        escalation=GLOBAL_LAYERS,
        gateway=gateway,
        clock=clock,
        topology=TOPOLOGY,
    ) as (start, _):
        yield await start(), clock


async def test_a_dead_leaf_pages_each_jobs_own_roster_once_and_each_ack_is_its_own(
    leaf: tuple[Running, Clock], feishu: FeishuContractServer
) -> None:
    """The switch's incident pages the infrastructure on-call once (gus), its card naming
    the switch. Each job hit, on a route with its own roster, is paged once through it
    (team-a's carol, team-b's bella) when its job is first known hit, never again for its
    later alerts (its hang); its notice in its own chat or bot says so. team-a's ack (its
    person through the proxy) stops team-a's escalation only: 5 minutes on, team-b's second
    layer (bert) and the infrastructure's (gil) are called, team-a's (cid) is not. Before:
    gus alone was called (each job only told by its notice), and team-a's ack stopped no
    call."""
    running, clock = leaf
    await running.post(*(port_down(i, node, clock) for i, node in enumerate(NODES, start=1)))
    await running.gateway.settle()
    assert rung(feishu) == ["ou_gus"], "the switch's one page"
    clock.now += timedelta(seconds=20)
    await running.post(
        job_alert(11, "team-a", "TrainingJobOnFaultyNode", "P3", clock),
        job_alert(12, "team-b", "TrainingJobOnFaultyNode", "P3", clock),
    )
    clock.now += timedelta(seconds=40)
    await running.post(
        job_alert(13, "team-a", "TrainingJobHang", "P0", clock),
        job_alert(14, "team-b", "TrainingJobHang", "P0", clock),
    )
    await running.gateway.settle()
    assert sorted(rung(feishu)) == ["ou_bella", "ou_carol", "ou_gus"], "one page per route"
    global_cards = shown(feishu, GLOBAL_CHAT)
    a_cards, b_cards = shown(feishu, "oc_team_a"), bot_cards(feishu)
    assert [c for c in global_cards if "leaf-a down: 3 ports on 3 nodes" in c], global_cards
    assert len(a_cards) == 1 and len(b_cards) == 1, (a_cards, b_cards)
    assert "team-a/a" in a_cards[0] and "team-b" not in a_cards[0], a_cards
    assert "its on-call is paged once for it" in a_cards[0], a_cards
    assert "team-b/b" in b_cards[0] and "team-a" not in b_cards[0], b_cards
    assert "its on-call is paged once for it" in b_cards[0], b_cards
    # team-a's on-call acknowledges its job's hang through the proxy
    status, answer = await ack_as(running, await alert_id(running, f"{13:016x}"), "ann", "a-oncall")
    assert status == 200 and answer["escalation_stopped"], answer
    await running.gateway.settle()
    clock.now += timedelta(minutes=5, seconds=1)
    await running.gateway.settle()
    assert sorted(rung(feishu)) == ["ou_bella", "ou_bert", "ou_carol", "ou_gil", "ou_gus"]
    leaked = [c for c in shown(feishu, GLOBAL_CHAT) + bot_cards(feishu) if "ann" in c]
    assert not leaked, leaked
    # team-b's person may not acknowledge team-a's job
    status, _ = await ack_as(running, await alert_id(running, f"{13:016x}"), "bo", "b-oncall")
    assert status == 403
    assert feishu.rejections == []
    # what each route received in all (docs/infrastructure.md's table): the switch's card
    # and one update per job on the gateway's chat, one notice per job's own destination
    titles = [json.loads(c)["config"]["summary"]["content"] for c in shown(feishu, GLOBAL_CHAT)]
    assert len(titles) == 3 and all(t.startswith("[P0] FIRING: leaf-a down") for t in titles)
    assert (len(shown(feishu, "oc_team_a")), len(bot_cards(feishu))) == (1, 1)
    assert "ann" in shown(feishu, "oc_team_a")[0], "team-a's ack shown on its notice"
