"""A fabric failure is one incident (issue 44), planned for real (SQLite and PostgreSQL, the
shipped policy with correlation, the policy worker, the outbox rows read back).

Leaf switch leaf-a under 8 nodes of team-a/llama-70b dies: all 64 ports of the 8 nodes go
Down. The cluster-wide copies of `IBPhysicalLinkDown` reach the gateway before their job
twins; two minutes later the job's NCCL RAS reports its communicators in error, later the
job hangs. One incident: its card leads with the switch, one page, one notice to the job;
the job's consequences update the incident and never open a second card or escalation.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.gateway.stages.planning.test_infra_incidents import (
    CHANNELS,
    intake,
    plan,
    rows,
    tick,
)
from tests.support.webhook_factory import BASE_TIME, make_alert
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.topology import Topology, from_settings
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload

NODES = [f"gpu-node-{i:02d}" for i in range(8)]
HCAS = [f"mlx5_{k}" for k in range(8)]
NAMESPACE, JOB = "team-a", "llama-70b"


def leaf_topology() -> Topology:
    places = {node: {"leaf_switch": "leaf-a", "rack": "r1"} for node in NODES}
    places |= {f"gpu-node-{i:02d}": {"leaf_switch": "leaf-b", "rack": "r2"} for i in (8, 9)}
    return from_settings(
        TopologySettings.model_validate({"levels": ["leaf_switch", "rack"], "nodes": places})
    )


def port_down(node: int, hca: int, *, job: bool) -> dict[str, Any]:
    """node_exporter's port series through rules/fabric.yaml: no `gpu`; the job's copy adds
    namespace and trainingjob (docs/alerts.md "Job scope")."""
    alert = make_alert(
        node * 8 + hca + (1000 if job else 0),
        name="IBPhysicalLinkDown",
        labels={
            "node": NODES[node],
            "device": HCAS[hca],
            "port": "1",
            "priority": "P0",
            "component": "fabric",
            "instance": f"10.0.{node}.1:9100",
            "job": "node-exporter",
        },
        starts_at=BASE_TIME,
    )
    labels = alert["labels"]
    del labels["gpu"]
    if job:
        labels.update(namespace=NAMESPACE, trainingjob=JOB)
    else:
        del labels["namespace"], labels["trainingjob"]
    return alert


def consequence(index: int, name: str, priority: str) -> dict[str, Any]:
    alert = make_alert(
        5000 + index,
        name=name,
        labels={"priority": priority, "component": "training", "namespace": NAMESPACE,
                "trainingjob": JOB, "pg": "0"},
        starts_at=BASE_TIME + timedelta(seconds=100),
    )  # fmt: skip
    del alert["labels"]["node"], alert["labels"]["gpu"]
    return alert


@pytest.mark.parametrize("job_twins_first", [False, True])
async def test_a_dead_leaf_is_one_incident_one_page_led_by_the_switch(
    engine: AsyncEngine, job_twins_first: bool
) -> None:
    """Whichever twin Alertmanager delivers first (the cluster-wide copy, as in the issue's
    run, or the job's), then the job's RAS errors and hang. Only the cluster-wide copies
    (trusted evidence) count towards the switch (issue 43): the job's copies that came
    first are the job's own incident (its card, its page, on its route), which its
    consequences then join; the switch's incident is the cluster's alerts' alone."""
    topo = leaf_topology()
    first, second = (True, False) if job_twins_first else (False, True)
    await intake(engine, [port_down(n, h, job=first) for n in range(8) for h in range(8)], at_s=5)
    await plan(engine, topo, at_s=6)
    await intake(engine, [port_down(n, h, job=second) for n in range(8) for h in range(8)], at_s=8)
    await plan(engine, topo, at_s=9)
    await intake(engine, [consequence(0, "NCCLRasCommunicatorErrors", "P1")], at_s=120)
    await plan(engine, topo, at_s=121)
    await intake(engine, [consequence(1, "TrainingJobHang", "P0")], at_s=400)
    await plan(engine, topo, at_s=401)
    sent = await rows(engine)

    chat = [r for r in sent if r.channel == "feishu"]
    calls = [r for r in sent if r.channel == "phone"]
    own = [r for r in chat if r.kind != "infra"]
    infra_calls = [r for r in calls if r.kind == "infra"]
    assert len(infra_calls) == 1, "one page of the switch's incident"
    events = [r.payload["event"] for r in chat if r.kind == "infra"]
    assert events.count("infra_opened") == 1
    card = next(r.payload for r in chat if r.payload["event"] == "infra_opened")
    title = card["alertname"]
    assert title.startswith("leaf-a down: 64 ports on 8 nodes"), title
    assert "gpu-node" not in title and "mlx5" not in title
    assert card["infrastructure"]["ports"] == 64
    if job_twins_first:  # the job's own incident: its word counts no port of the switch
        assert {(r.payload["job"], r.payload["alertname"]) for r in own} == {
            (f"{NAMESPACE}/{JOB}", "IBPhysicalLinkDown")
        }
        assert [r.kind for r in calls if r not in infra_calls] == ["alert"], "the job's page"
        assert events == ["infra_opened"], "its consequences are in the job's incident"
        return
    assert own == [], [r.payload["alertname"] for r in chat]
    assert len(calls) == 1, "one page, the incident's"
    assert events.count("infra_job_notice") == 1
    assert len(chat) <= 4, events
    # the job's consequence is told on the incident, once, naming the job
    update = [r.payload for r in chat if r.payload["event"] == "infra_update"]
    assert len(update) == 1 and f"{NAMESPACE}/{JOB}" in update[0]["annotations"]["summary"]
    assert update[0]["alertname"].startswith("leaf-a down")
    # the job's notice: the switch in its title, the job once, no HCA called a GPU
    notice = next(r.payload for r in chat if r.payload["event"] == "infra_job_notice")
    rendered = str(build_card("infra", parse_payload(dict(notice))))
    assert f"{NAMESPACE}/{JOB}" not in notice["alertname"]
    assert "GPU" not in rendered and "gpu-node-00" not in notice["alertname"]


def on_faulty_node(node: int) -> dict[str, Any]:
    """rules/training.yaml's TrainingJobOnFaultyNode for a node of the job (the operator
    renders no job copy of IBPhysicalLinkDown: docs/alerts.md "Job scope")."""
    alert = make_alert(
        7000 + node,
        name="TrainingJobOnFaultyNode",
        labels={"priority": "P3", "component": "training", "namespace": NAMESPACE,
                "trainingjob": JOB, "node": NODES[node]},
        starts_at=BASE_TIME + timedelta(seconds=40),
    )  # fmt: skip
    del alert["labels"]["gpu"]
    return alert


async def test_without_job_copies_the_jobs_alerts_on_its_nodes_name_it(engine: AsyncEngine) -> None:
    """Only the cluster-wide IBPhysicalLinkDown (no job twin), then the job's
    TrainingJobOnFaultyNode on its 8 nodes, its RAS errors, its hang: one incident, one page,
    one notice to the job; its placement names it without being told as what happened to
    it, so the RAS errors are the incident's one update for the job (failed before: the
    update was spent on "TrainingJobOnFaultyNode" and the RAS errors were never told)."""
    topo = leaf_topology()
    await intake(engine, [port_down(n, h, job=False) for n in range(8) for h in range(8)], at_s=5)
    await plan(engine, topo, at_s=6)
    await intake(engine, [on_faulty_node(n) for n in range(8)], at_s=40)
    await plan(engine, topo, at_s=41)
    await intake(engine, [consequence(0, "NCCLRasCommunicatorErrors", "P1")], at_s=120)
    await plan(engine, topo, at_s=121)
    await intake(engine, [consequence(1, "TrainingJobHang", "P0")], at_s=400)
    await plan(engine, topo, at_s=401)
    sent = await rows(engine)

    chat = [r for r in sent if r.channel == "feishu"]
    calls = [r for r in sent if r.channel == "phone"]
    assert [r for r in chat if r.kind != "infra"] == [], [r.payload["alertname"] for r in chat]
    assert len(calls) == 1 and calls[0].kind == "infra", "one page, the incident's"
    events = [r.payload["event"] for r in chat]
    assert events.count("infra_job_notice") == 1 and events.count("infra_update") == 1, events
    notice = next(r.payload for r in chat if r.payload["event"] == "infra_job_notice")
    assert notice["job"] == f"{NAMESPACE}/{JOB}"
    [update] = [r.payload for r in chat if r.payload["event"] == "infra_update"]
    summary = update["annotations"]["summary"]
    assert summary.startswith(f"{NAMESPACE}/{JOB} NCCL communicators in error"), summary
    shown = [r.payload.get("alertname", "") + str(r.payload.get("annotations")) for r in chat]
    assert "TrainingJobOnFaultyNode" not in str(shown), shown


def link_flapping(node: int, hca: int) -> dict[str, Any]:
    """rules/fabric.yaml's IBLinkFlapping (P1) of a port: `node_infiniband_link_downed_total`
    rose; it fires before IBPhysicalLinkDown (no `for`), which then inhibits it in
    Alertmanager (rules/alertmanager-inhibit.yaml), so only the ports whose flap was sent
    before reach the gateway."""
    alert = port_down(node, hca, job=False)
    alert["labels"].update(alertname="IBLinkFlapping", priority="P1")
    alert["fingerprint"] = f"f{node * 8 + hca:015x}"
    return alert


async def test_a_dead_leaf_whose_first_pieces_are_below_the_threshold_pages_once(
    engine: AsyncEngine,
) -> None:
    """The leaf's failure in the pieces Alertmanager sends it in (the e2e run that made a
    third call): the flaps of one node's ports first (the others were inhibited by their
    IBPhysicalLinkDown before their group's first notification), then the P0 group's first
    notification with the one node whose scrape saw its ports down first, and the other
    seven nodes one `group_interval` (1 m) later; then the job's placements, RAS errors and
    hang. Below the threshold the first pieces open no element's incident, and announced at
    once they were a P1 card of one node's flaps and a P0 card and page led by
    "IB link down on gpu-node-07 mlx5_0 port 1", whose escalation repeated beside the
    switch's. Held (`infrastructure.hold`, 90 s) they are the switch's incident's: one page,
    every card led by the switch."""
    topo = leaf_topology()
    await intake(engine, [link_flapping(3, h) for h in range(8)], at_s=26)
    await plan(engine, topo, at_s=26)
    await intake(engine, [port_down(7, h, job=False) for h in range(8)], at_s=39)
    await plan(engine, topo, at_s=39)
    for at_s in (60, 90):
        await tick(engine, topo, at_s=at_s)
    said = [r for r in await rows(engine) if r.channel != "sheet"]  # the archive has all
    assert said == [], "nothing of one node said alone yet"
    await intake(engine, [port_down(n, h, job=False) for n in range(7) for h in range(8)], at_s=99)
    await plan(engine, topo, at_s=99)
    await intake(engine, [on_faulty_node(n) for n in range(8)], at_s=130)
    await plan(engine, topo, at_s=130)
    await intake(engine, [consequence(0, "NCCLRasCommunicatorErrors", "P1")], at_s=160)
    await plan(engine, topo, at_s=160)
    await intake(engine, [consequence(1, "TrainingJobHang", "P0")], at_s=400)
    await plan(engine, topo, at_s=400)
    for at_s in (117, 130, 200, 300, 420, 480):
        await tick(engine, topo, at_s=at_s)
    sent = await rows(engine)

    chat = [r for r in sent if r.channel == "feishu"]
    assert [r.payload["alertname"] for r in chat if r.kind != "infra"] == []
    calls = [r for r in sent if r.channel == "phone"]
    assert len(calls) == 1 and calls[0].kind == "infra", "one page, the switch's"
    titles = [r.payload["alertname"] for r in chat]
    assert all(t.startswith("leaf-a down: 64 ports on 8 nodes") for t in titles), titles
    events = [r.payload["event"] for r in chat]
    assert events == ["infra_opened", "infra_job_notice", "infra_update"], events


async def test_the_page_counts_the_whole_notification_it_came_in(engine: AsyncEngine) -> None:
    """The flaps of 3 nodes' ports opened leaf-a's incident at P1; the links down of all 8
    nodes come in one notification: the page, drafted at its first P0, counts all of them
    (the e2e run's page and call said "24 ports on 3 nodes", the flaps', and so did the
    escalation's repeat 5 minutes later)."""
    topo = leaf_topology()
    await intake(engine, [link_flapping(n, h) for n in range(3) for h in range(8)], at_s=15)
    await plan(engine, topo, at_s=15)
    await intake(engine, [port_down(n, h, job=False) for n in range(8) for h in range(8)], at_s=35)
    await plan(engine, topo, at_s=35)
    sent = await rows(engine)

    titles = {r.payload["event"]: r.payload["alertname"] for r in sent if r.kind == "infra"}
    assert titles["infra_opened"] == "leaf-a down: 24 ports on 3 nodes", titles
    assert titles["infra_page"] == "leaf-a down: 64 ports on 8 nodes", titles
    [call] = [r for r in sent if r.channel == "phone"]
    assert call.payload["alertname"] == "leaf-a down: 64 ports on 8 nodes"


def rail_topology() -> Topology:
    """A rail-optimized scalable unit: HCA k of each of 16 nodes is cabled to leaf-k."""
    section = {
        "levels": ["leaf_switch", "rack"],
        "nodes": {f"gpu-node-{i:02d}": {"rack": f"r{i // 4}"} for i in range(16)},
        "rails": {"leaf_switch": {hca: f"leaf-{k}" for k, hca in enumerate(HCAS)}},
    }
    return from_settings(TopologySettings.model_validate(section))


def rail_port_down(node: int, job: str | None) -> dict[str, Any]:
    alert = port_down(0, 3, job=job is not None)
    alert["labels"]["node"] = f"gpu-node-{node:02d}"
    alert["fingerprint"] = f"{node:04x}{'j' if job else 'c'}"
    if job:
        alert["labels"].update(namespace=job.split("/")[0], trainingjob=job.split("/")[1])
    return alert


async def plan_routed(engine: AsyncEngine, topo: Topology, at_s: float) -> None:
    """Each team's alerts go to its own chat route; the incident's to the infra route."""
    policy = load_policy(
        overrides={
            "routing": {
                "routes": [
                    {"id": "infra", "labels": {"scope": "infrastructure"},
                     "channels": ["feishu", "phone"]},
                    {"id": "team-a", "namespaces": ["team-a"], "channels": ["feishu"]},
                    {"id": "team-b", "namespaces": ["team-b"], "channels": ["feishu"]},
                ]
            }
        }
    )  # fmt: skip
    planner = PolicyPlan(policy, CHANNELS, topology=lambda: topo)
    worker = PolicyWorker(engine, planner, clock=lambda: BASE_TIME + timedelta(seconds=at_s))
    await worker.drain()


async def test_a_dead_rail_leaf_is_one_incident_naming_both_jobs(engine: AsyncEngine) -> None:
    """Leaf-3 serves HCA mlx5_3 of 16 nodes of two jobs: one incident at leaf-3, each job
    told through its own route once, no per-node card."""
    topo = rail_topology()
    jobs = {i: "team-a/llama-70b" if i < 8 else "team-b/mixtral" for i in range(16)}
    await intake(engine, [rail_port_down(i, None) for i in range(16)], at_s=5)
    await plan_routed(engine, topo, at_s=6)
    await intake(engine, [rail_port_down(i, jobs[i]) for i in range(16)], at_s=8)
    await plan_routed(engine, topo, at_s=9)
    ras = [consequence(0, "NCCLRasCommunicatorErrors", "P1")]
    other = consequence(1, "NCCLRasCommunicatorErrors", "P1")
    other["labels"].update(namespace="team-b", trainingjob="mixtral")
    await intake(engine, [*ras, other], at_s=120)
    await plan_routed(engine, topo, at_s=121)
    sent = await rows(engine)

    chat = [r for r in sent if r.channel == "feishu"]
    assert [r for r in chat if r.kind != "infra"] == [], [r.payload["alertname"] for r in chat]
    calls = [r for r in sent if r.channel == "phone"]
    assert len(calls) == 1 and calls[0].kind == "infra"
    [card] = [r.payload for r in chat if r.payload["event"] == "infra_opened"]
    assert card["alertname"].startswith("leaf-3 down: 16 ports on 16 nodes"), card["alertname"]
    assert card["infrastructure"]["key"] == "leaf_switch=leaf-3"
    notices = {r.payload["job"]: r.payload["route"] for r in chat
               if r.payload["event"] == "infra_job_notice"}  # fmt: skip
    assert notices == {"team-a/llama-70b": "route:team-a", "team-b/mixtral": "route:team-b"}
    updates = [r.payload for r in chat if r.payload["event"] == "infra_update"]
    assert len(updates) == 2 and all(u["route"] == "route:infra" for u in updates)
    assert (
        "team-a/llama-70b" in updates[-1]["alertname"]
        and "team-b/mixtral" in updates[-1]["alertname"]
    )
