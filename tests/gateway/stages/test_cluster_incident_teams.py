"""Issue 43, "An ack, a route and a page never cross jobs", inside one cluster-wide incident:
a GPU of gpu-node-17 falls off the bus (the chart's cluster-wide rule: no `namespace`), and
two teams' jobs train on that node. Each team has its own route (spec.alerting: team-a its
Feishu chat, owners and on-call roster; team-b its signed bot and roster), and people sign
in through the trusted proxy (gateway.access: a team acts on its own namespace).

Through the real gateway (loopback HTTP), the Kubernetes API as the kmock emulator, Feishu
as the contract server (chats, custom bots, urgent_phone calls), time virtual: what each
team receives is counted.

The alerts are what the shipped rules raise (rules/training.yaml): the cluster's
`GPUFellOffBus{node, gpu, xid, component="gpu"}` without a namespace; per job, what
prometheus-operator's `enforcedNamespaceLabel` gives the job's namespace to:
`TrainingJobOnFaultyNode{namespace, trainingjob, node}` (P3: the job runs on a node with a
P0 hardware alert) and then `TrainingJobHang{namespace, trainingjob}` (P0)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.stages.test_job_alerting import (
    GLOBAL_CHAT,
    Running,
    cluster,
    create,
    create_bot_secret,
    feishu,
    gateway_with,
    tj_path,
    trainingjob,
)
from tests.support.clock import Clock
from tests.support.feishu_server import FeishuContractServer
from tests.support.kube_emulator import KubeEmulator
from tests.support.webhook_factory import make_alert

__all__ = ["cluster", "feishu"]  # the fixtures this module uses from test_job_alerting

TOKEN = "cluster-incident-token"
NODE = "gpu-node-17"
ROSTERS = {
    "team-a": "layers:\n  - {name: a1, members: [{name: carol, feishu_open_id: ou_carol}]}\n"
    "  - {name: a2, members: [{name: cid, feishu_open_id: ou_cid}]}\n",
    "team-b": "layers:\n  - {name: b1, members: [{name: bella, feishu_open_id: ou_bella}]}\n"
    "  - {name: b2, members: [{name: bert, feishu_open_id: ou_bert}]}\n",
}
GLOBAL_LAYERS = [
    {"name": "g1", "members": [{"name": "gus", "feishu_open_id": "ou_gus"}]},
    {"name": "g2", "members": [{"name": "gil", "feishu_open_id": "ou_gil"}]},
]
# A hardware fault's resolution is believed a minute after it came (the shipped 5 minutes
# are the escalation's ack timeout too: the test tells the two apart).
POLICY = "correlation: {confirm_resolved: 60}\n"
ACCESS = {
    "teams": {
        "team-a": {"namespaces": ["team-a"], "groups": ["a-oncall"]},
        "team-b": {"namespaces": ["team-b"], "groups": ["b-oncall"]},
    },
    "admin_groups": ["sre"],
}


def gpu_fell_off(status: str = "firing") -> dict[str, Any]:
    """The chart's cluster-wide GPUFellOffBus (no namespace, no job)."""
    alert = make_alert(
        1,
        status=status,
        name="GPUFellOffBus",
        labels={"node": NODE, "gpu": "3", "xid": "79", "component": "gpu", "priority": "P0"},
    )
    del alert["labels"]["namespace"], alert["labels"]["trainingjob"]
    return alert


def job_alert(index: int, team: str, name: str, priority: str, node: bool) -> dict[str, Any]:
    job = "a" if team == "team-a" else "b"
    labels = {"namespace": team, "trainingjob": job, "priority": priority}
    alert = make_alert(index, name=name, labels={**labels, "component": "training", "node": NODE})
    del alert["labels"]["gpu"]
    if not node:
        del alert["labels"]["node"]
    return alert


def on_faulty_node(index: int, team: str) -> dict[str, Any]:
    return job_alert(index, team, "TrainingJobOnFaultyNode", "P3", node=True)


def hang(index: int, team: str) -> dict[str, Any]:
    return job_alert(index, team, "TrainingJobHang", "P0", node=False)


async def create_team_jobs(cluster: KubeEmulator, feishu: FeishuContractServer) -> None:
    """Both teams' rosters (a ConfigMap each) and TrainingJobs: team-a's job `a` with its
    owner, its own chat and roster; team-b's job `b` with its own bot and roster."""
    for team in ("team-a", "team-b"):
        await create(
            cluster,
            f"/api/v1/namespaces/{team}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "oncall"},
             "data": {"roster.yaml": ROSTERS[team]}},
        )  # fmt: skip
    await create_bot_secret(cluster, feishu)
    roster = {"onCallRosterRef": {"name": "oncall", "key": "roster.yaml"}}
    team_a = {"owners": ["ou_bob"], "feishu": {"chatId": "oc_team_a"}, **roster}
    await create(cluster, tj_path("team-a"), trainingjob("team-a", "a", team_a))
    bot = {"webhookSecretRef": {"name": "bot", "key": "url", "secretKey": "sign"}}
    await create(cluster, tj_path("team-b"), trainingjob("team-b", "b", {"feishu": bot, **roster}))


@pytest.fixture
async def teams(
    cluster: KubeEmulator, feishu: FeishuContractServer, tmp_path: Path
) -> AsyncIterator[tuple[Running, Clock]]:
    """The gateway with both teams' jobs, rosters and the proxy's people."""
    await create_team_jobs(cluster, feishu)
    clock = Clock()
    gateway = {
        "api_token": TOKEN,
        "console": {"trusted_proxies": ["127.0.0.0/8"]},
        "access": ACCESS,
    }
    async with gateway_with(
        cluster, feishu, tmp_path, POLICY, escalation=GLOBAL_LAYERS, gateway=gateway, clock=clock
    ) as (start, _):
        yield await start(), clock


def rung(feishu: FeishuContractServer) -> list[str]:
    return [user for _, users in feishu.urgent_calls for user in users]


def bot_cards(feishu: FeishuContractServer) -> list[str]:
    return [json.dumps(body["card"]) for _, body in feishu.accepted.get("team-b", [])]


def texts(cards: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(card) for card in cards]


def shown(feishu: FeishuContractServer, chat: str) -> list[str]:
    """Each card of the chat as it reads now (its last redraw in place, else as sent)."""
    return [
        json.dumps(m["updates"][-1] if m["updates"] else json.loads(m["content"]))
        for m in feishu.messages.values()
        if m["receive_id"] == chat and m["msg_type"] == "interactive"
    ]


async def alert_id(running: Running, fingerprint: str) -> int:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        async with session.get(running.server.make_url("/api/v1/alerts?limit=1000")) as r:
            items = (await r.json())["items"]
    [found] = [item["id"] for item in items if item["fingerprint"] == fingerprint]
    return int(found)


async def ack_as(running: Running, alert: int, name: str, groups: str) -> tuple[int, Any]:
    """An ack by a person the trusted proxy let through (oauth2-proxy's headers)."""
    headers = {"X-Forwarded-User": name, "X-Forwarded-Groups": groups}
    async with aiohttp.ClientSession(headers=headers) as session:
        url = running.server.make_url(f"/api/v1/alerts/{alert}/ack")
        async with session.post(url, json={"by": name}) as r:
            return r.status, await r.json()


async def api_get(running: Running, path: str) -> Any:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        async with session.get(running.server.make_url(path)) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def incident(running: Running, incident_id: int) -> dict[str, Any]:
    return dict(await api_get(running, f"/api/v1/incidents/{incident_id}"))


async def incident_holding(running: Running, fingerprint: str) -> dict[str, Any]:
    """The incident (GET /api/v1/incidents/{id}) an alert of `fingerprint` is in."""
    listed = await api_get(running, "/api/v1/incidents?limit=1000")
    for item in listed["items"]:
        detail = await incident(running, item["id"])
        if any(a["fingerprint"] == fingerprint for a in detail["alerts"]):
            return detail
    raise AssertionError(f"no incident holds {fingerprint}")


async def test_each_team_is_paged_told_and_acks_through_its_own_route(
    teams: tuple[Running, Clock], feishu: FeishuContractServer
) -> None:
    """The node's fault pages the cluster's on-call (gus) on the gateway's chat; each job it
    hits is paged through its own route, once (team-a's roster: carol; team-b's: bella),
    its card in its own chat or bot only, naming its own job and never the other's. The ack
    of team-a's person (through the proxy) covers team-a's job: carol's escalation stops,
    and team-b's and the cluster's go on (bert and gil are called 5 minutes later)."""
    running, clock = teams
    await running.post(gpu_fell_off())
    assert rung(feishu) == ["ou_gus"]
    await running.post(on_faulty_node(2, "team-a"), on_faulty_node(3, "team-b"))
    clock.now += timedelta(seconds=30)
    await running.post(hang(4, "team-a"), hang(5, "team-b"))
    await running.gateway.settle()
    assert sorted(rung(feishu)) == ["ou_bella", "ou_carol", "ou_gus"], "each route paged once"
    a_cards = shown(feishu, "oc_team_a")
    b_cards = bot_cards(feishu)
    global_cards = shown(feishu, GLOBAL_CHAT)
    counted = (len(a_cards), len(b_cards), len(global_cards))
    assert counted == (1, 1, 1), "one card per route (the app's redrawn in place)"
    assert a_cards and all("team-a/a" in c and "team-b" not in c for c in a_cards), a_cards
    assert "team-a/a hung" in a_cards[-1] and "GPU 3 fell off the bus" in a_cards[-1]
    assert "<at id=ou_bob></at>" in a_cards[-1], "team-a's owners on its P0 card"
    assert b_cards and all("team-b/b" in c and "team-a" not in c for c in b_cards), b_cards
    assert "team-b/b hung" in b_cards[-1] and "GPU 3 fell off the bus" in b_cards[-1]
    assert global_cards and all(" hung" not in c for c in global_cards), "no job's hang"
    assert all("ou_bob" not in c for c in global_cards + b_cards), "team-a's owners elsewhere"
    # team-a's on-call acknowledges its job's hang through the proxy
    hang_a = await alert_id(running, f"{4:016x}")
    status, answer = await ack_as(running, hang_a, "ann", "a-oncall")
    assert status == 200 and answer["escalation_stopped"], answer
    acked = await incident(running, answer["incident_id"])
    assert {a["namespace"] for a in acked["alerts"]} == {"team-a"}, "only team-a's alerts"
    await running.gateway.settle()
    # team-b and the cluster are still paged: their escalations go on, team-a's does not
    clock.now += timedelta(minutes=5, seconds=1)
    await running.gateway.settle()
    assert sorted(rung(feishu)) == ["ou_bella", "ou_bert", "ou_carol", "ou_gil", "ou_gus"]
    for fingerprint in (f"{1:016x}", f"{5:016x}"):
        held = await incident_holding(running, fingerprint)
        assert held["acked_by"] is None, held
    assert all("ann" not in c for c in bot_cards(feishu)), "team-a's ack is not team-b's"
    # team-b's person may not acknowledge team-a's job, nor team-a's the cluster's node
    status, _ = await ack_as(running, await alert_id(running, f"{4:016x}"), "bo", "b-oncall")
    assert status == 403
    status, _ = await ack_as(running, await alert_id(running, f"{1:016x}"), "ann", "a-oncall")
    assert status == 403
    assert feishu.rejections == []


async def test_a_teams_alert_keeps_no_cluster_incident_open(
    teams: tuple[Running, Clock], feishu: FeishuContractServer
) -> None:
    """Issue 43: team-a's own alerts about the node (its job on the faulty node, its hang)
    fire on; the GPU comes back and the cluster's evidence resolves (believed once the node
    proved alive, `correlation.confirm_resolved` later: here a minute). The cluster's
    incident resolves:
    its RESOLVED card, its escalation ends (gil is never called). Team-a's alerts are in
    its own job's incident, firing, on its route; they keep nothing of the cluster's open."""
    running, clock = teams
    await running.post(gpu_fell_off(), on_faulty_node(2, "team-a"))
    await running.post(hang(4, "team-a"))
    cluster_incident = (await incident_holding(running, f"{1:016x}"))["id"]
    clock.now += timedelta(seconds=10)
    await running.post(gpu_fell_off("resolved"))
    clock.now += timedelta(seconds=61)  # the fault's resolution is confirmed
    await running.gateway.settle()
    closed = await incident(running, cluster_incident)
    assert closed["status"] == "resolved", closed
    assert {a["namespace"] for a in closed["alerts"]} == {""}, "only the cluster's alerts"
    [card] = shown(feishu, GLOBAL_CHAT)
    assert "RESOLVED" in card and "GPUFellOffBus" in card, card
    mine = await incident_holding(running, f"{4:016x}")
    assert mine["status"] == "firing" and mine["id"] != cluster_incident
    assert sorted(rung(feishu)) == ["ou_carol", "ou_gus"], "each route paged once"
    clock.now += timedelta(minutes=10)
    await running.gateway.settle()
    assert sorted(rung(feishu)) == ["ou_carol", "ou_cid", "ou_gus"], (
        "the cluster's escalation ended with its incident (no gil); team-a's goes on (cid)"
    )


async def test_a_teams_alert_that_outlives_the_clusters_evidence_captures_no_later_fault(
    teams: tuple[Running, Clock], feishu: FeishuContractServer
) -> None:
    """Issue 43: a job of the gateway's own route (team-a's `decoy`: no TrainingJob, no
    route of its own) joins the node's incident with its own `KubeNodeNotReady` on the node
    and keeps it firing. The platform acknowledges the incident; the GPU comes back (its
    resolution believed `correlation.confirm_resolved` later). The decoy keeps the incident
    open, yet the incident captures nothing more: the node's next fault is an incident of
    its own and pages (before, it joined the acknowledged incident: no call)."""
    running, clock = teams
    await running.post(gpu_fell_off())
    decoy = make_alert(
        2,
        name="KubeNodeNotReady",
        labels={"namespace": "team-a", "trainingjob": "decoy", "node": NODE,
                "priority": "P3", "component": "kubernetes"},
    )  # fmt: skip
    del decoy["labels"]["gpu"]
    await running.post(decoy)
    first = await incident_holding(running, f"{1:016x}")
    assert {a["fingerprint"] for a in first["alerts"]} == {f"{1:016x}", f"{2:016x}"}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        url = running.server.make_url(f"/api/v1/incidents/{first['id']}/ack")
        async with session.post(url, json={"by": "platform"}) as r:
            assert r.status == 200, await r.text()
    clock.now += timedelta(seconds=10)
    await running.post(gpu_fell_off("resolved"))
    clock.now += timedelta(seconds=61)
    await running.gateway.settle()
    assert rung(feishu) == ["ou_gus"]
    again = make_alert(
        6,
        name="GPUFellOffBus",
        labels={"node": NODE, "gpu": "5", "xid": "79", "component": "gpu", "priority": "P0"},
    )
    del again["labels"]["namespace"], again["labels"]["trainingjob"]
    await running.post(again)
    second = await incident_holding(running, f"{6:016x}")
    assert second["id"] != first["id"] and second["acked_by"] is None, second
    assert rung(feishu) == ["ou_gus", "ou_gus"], "the node's next fault pages"


async def test_a_spent_cluster_incident_shows_resolved_and_stops_paging(
    teams: tuple[Running, Clock], feishu: FeishuContractServer
) -> None:
    """Issue 43: a job of the gateway's own route (team-a's `solo`: no TrainingJob, so no
    route of its own) runs on the node and hangs; its alerts join the node's incident, which
    paged gus. Nobody acknowledges it. The GPU comes back (believed a minute later) while the
    job's alerts fire on: the incident is spent. The incident API and the console show it
    resolved, saying why, the gateway's chat gets its RESOLVED card, and its escalation ends:
    gil (the second layer, 5 minutes on) is never called. Before: it showed firing and its
    escalation went on (gil was called)."""
    running, clock = teams
    await running.post(gpu_fell_off())
    solo = {"namespace": "team-a", "trainingjob": "solo", "component": "training"}
    placed = make_alert(
        7, name="TrainingJobOnFaultyNode", labels={**solo, "node": NODE, "priority": "P3"}
    )
    hung = make_alert(8, name="TrainingJobHang", labels={**solo, "priority": "P0"})
    for alert in (placed, hung):
        del alert["labels"]["gpu"]
    del hung["labels"]["node"]
    await running.post(placed)
    await running.post(hung)
    first = await incident_holding(running, f"{1:016x}")
    fingerprints = {a["fingerprint"] for a in first["alerts"]}
    assert fingerprints == {f"{1:016x}", f"{7:016x}", f"{8:016x}"}, "the job joined it"
    assert rung(feishu) == ["ou_gus"]
    clock.now += timedelta(seconds=10)
    await running.post(gpu_fell_off("resolved"))
    clock.now += timedelta(seconds=61)  # the fault's resolution is confirmed
    await running.gateway.settle()
    spent = await incident(running, first["id"])
    assert spent["status"] == "resolved" and spent["resolved_at"], spent
    assert "2 alerts of the jobs it hit fired on" in spent["note"], spent
    headers = {"X-Forwarded-User": "sam", "X-Forwarded-Groups": "sre"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(running.server.make_url(f"/ui/incidents/{first['id']}")) as r:
            assert r.status == 200
            page = await r.text()
    assert 'class="status s-resolved"' in page and "fired on" in page
    [card] = shown(feishu, GLOBAL_CHAT)
    assert "RESOLVED" in card and "Spent" in card, card
    clock.now += timedelta(minutes=10)
    await running.gateway.settle()
    assert rung(feishu) == ["ou_gus"], "its escalation ended with it: gil is never called"
    over = make_alert(8, status="resolved", name="TrainingJobHang", labels=hung["labels"])
    del over["labels"]["gpu"], over["labels"]["node"]
    await running.post(over)  # the job's hang resolves later: nothing of the incident moves
    await running.gateway.settle()
    assert (await incident(running, first["id"]))["status"] == "resolved"
    assert feishu.rejections == []
