"""A job's part of a cluster-wide incident (issue 43, "An ack, a route and a page never cross
jobs"), pure: a node's fault (the chart's cluster-wide GPUFellOffBus, no `namespace`) hits
jobs of several teams. A job whose route is its own (its spec.alerting, or a policy route of
its namespace) gets its own incident of that failure, on its own route, paged once; a job
that takes the gateway's own route joins the node's incident as before (one card, one page:
issue 37). The alerts are the shipped rules' (rules/training.yaml): a job's
`TrainingJobOnFaultyNode{namespace, trainingjob, node}` (P3), its `TrainingJobHang` (P0)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.gateway.policy.factory import at
from tests.gateway.policy.planned import decide
from tests.gateway.policy.test_correlation import GPU, change
from trainsentry.alerts import AlertChange, JobRef, NotificationDraft, Priority
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.incident import CLUSTER_REALM, IncidentBook, IncidentState
from trainsentry.gateway.policy.route import JOB_CHANNEL, JobRoute, routed_apart
from trainsentry.gateway.policy.rules import Policy, load_policy
from trainsentry.gateway.stages.planning.incidents import resolved_pages
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload

POLICY = load_policy()
CHANNELS = {"feishu_bot", "phone", "console"}
TEAM_A = JobRef("team-a", "llm")
ROUTES = {TEAM_A: JobRoute(feishu=True, owners=("ou_alice",), roster=True)}
NAMESPACE_ROUTE = {
    "routing": {
        "routes": [{"id": "team-c", "namespaces": ["team-c"], "channels": ["feishu", "phone"]}]
    }
}
KIND_ROUTE = {"routing": {"routes": [{"id": "hw", "labels": {"component": "gpu"}, "channels": []}]}}


def labels(namespace: str, job: str, **more: str) -> dict[str, str]:
    return {"namespace": namespace, "trainingjob": job, "component": "training", **more}


@pytest.mark.parametrize(
    ("overrides", "job_routes", "alert", "apart"),
    [
        ({}, ROUTES, labels("team-a", "llm"), True),  # its spec.alerting
        ({}, {TEAM_A: JobRoute(owners=("ou_alice",))}, labels("team-a", "llm"), True),
        ({}, {TEAM_A: JobRoute(roster=True)}, labels("team-a", "llm"), True),
        ({}, ROUTES, labels("team-b", "bert"), False),  # another job's route is not its
        ({}, {}, labels("team-a", "llm"), False),  # the gateway's own route
        (NAMESPACE_ROUTE, {}, labels("team-c", "x"), True),  # its namespace's route
        (NAMESPACE_ROUTE, {}, labels("team-b", "bert"), False),
        (KIND_ROUTE, {}, labels("team-b", "bert", component="gpu"), False),  # by kind only
        ({}, ROUTES, {"component": "gpu", "node": "n"}, False),  # the cluster's own alert
    ],
)
def test_a_job_is_routed_apart_by_its_own_route_only(
    overrides: dict[str, object],
    job_routes: Mapping[JobRef, JobRoute],
    alert: dict[str, str],
    apart: bool,
) -> None:
    policy = load_policy(overrides=overrides) if overrides else POLICY
    assert routed_apart(alert, policy, configured=CHANNELS, job_routes=job_routes) is apart


class Cluster:
    """The planner over one book of incidents, with the jobs' routes."""

    def __init__(self, policy: Policy = POLICY) -> None:
        self.policy = policy
        self.book = IncidentBook(policy)
        self.fps: dict[str, object] = {}
        self.drafts: list[NotificationDraft] = []

    def send(self, change: AlertChange) -> None:
        result = decide(
            change,
            fingerprint_state=self.fps.get(change.alert.fingerprint),  # type: ignore[arg-type]
            storm_state=None,
            distinct_nodes_in_window=1,
            policy=self.policy,
            now=change.at,
            channels=CHANNELS,
            job_routes=ROUTES,
            incidents=self.book,
        )
        self.fps[change.alert.fingerprint] = result.fingerprint_state
        self.drafts += result.drafts

    def incident_of(self, change: AlertChange) -> IncidentState:
        return self.book.by_id[self.book.members[change.alert_id]]

    def pages(self) -> list[NotificationDraft]:
        return [d for d in self.drafts if d.channel == "phone"]


def on_faulty_node(when: float, namespace: str, job: str) -> AlertChange:
    job_labels = labels(namespace, job, priority="P3", node=GPU["node"])
    return change(when, "TrainingJobOnFaultyNode", job_labels, started=when)


def hang(when: float, namespace: str, job: str) -> AlertChange:
    return change(when, "TrainingJobHang", labels(namespace, job, priority="P0"), started=when)


def test_a_job_of_its_own_route_gets_its_part_of_the_nodes_incident() -> None:
    """team-a (its own chat, owners, roster) and team-b (the gateway's route) both train on
    the node: team-a's alerts are its part of the node's incident (its realm, its route, its
    page following its roster); team-b's join the node's incident (one page, as before)."""
    gw = Cluster()
    fault = change(0, "GPUFellOffBus", GPU)
    gw.send(fault)
    node = gw.incident_of(fault)
    sent = [
        on_faulty_node(10, "team-a", "llm"),
        on_faulty_node(11, "team-b", "bert"),
        hang(60, "team-a", "llm"),
        hang(61, "team-b", "bert"),
    ]
    for one in sent:
        gw.send(one)
    part = gw.incident_of(sent[0])
    assert gw.incident_of(sent[2]) is part, "the job's hang follows its part"
    assert part is not node and part.part_of == node.id
    assert part.realm == "trainingjob:team-a/llm" and node.realm == CLUSTER_REALM
    assert part.jobs == ["team-a/llm"] and part.priority is Priority.P0
    assert {gw.incident_of(one).id for one in sent[1::2]} == {node.id}
    assert node.jobs == ["team-b/bert"], "the node's card names team-a only in its story"
    steps = {(s["name"], s["job"]) for s in node.story.values()}
    assert ("TrainingJobOnFaultyNode", "trainingjob:team-a/llm") in steps, "the job hit"
    assert ("TrainingJobHang", "trainingjob:team-a/llm") not in steps, "its hang is its own"
    assert "GPUFellOffBus" in {s["name"] for s in part.story.values()}, "what hit the job"
    assert "trainingjob:team-b/bert" not in {s["job"] for s in part.story.values()}
    pages = gw.pages()
    assert sorted(p.alert_id for p in pages) == sorted([fault.alert_id, part.lead_alert_id])
    [own_page] = [p for p in pages if p.alert_id == part.lead_alert_id]
    assert own_page.payload["job_route"]["roster"] is True
    cards = [d for d in gw.drafts if d.group_key == f"incident:{part.id}" and d.channel != "phone"]
    assert {d.channel for d in cards} == {JOB_CHANNEL, "console"}, "team-a's route only"
    node_cards = [d for d in gw.drafts if d.group_key == f"incident:{node.id}"]
    assert all("job_route" not in d.payload for d in node_cards)


def test_the_nodes_resolution_leaves_a_parts_alerts_firing_in_the_part() -> None:
    """The cluster's evidence resolves (a hardware fault's resolution is believed after
    `correlation.confirm_resolved`): the node's incident resolves, whatever team-a's part
    still has firing; the part stays open on it."""
    gw = Cluster()
    fault = change(0, "GPUFellOffBus", GPU)
    placed, hung = on_faulty_node(10, "team-a", "llm"), hang(60, "team-a", "llm")
    for one in (fault, placed, hung):
        gw.send(one)
    gw.send(change(100, "GPUFellOffBus", GPU, resolved=True))
    node = gw.incident_of(fault)
    assert node.status == "firing" and node.unknown, "held until the node proves alive"
    later = at(101 + POLICY.correlation.confirm_resolved)
    gw.book.changed = {}
    gw.book.wake([node])
    decide_tick([], [], policy=POLICY, now=later, channels=CHANNELS, incidents=gw.book)
    assert node.status == "resolved" and node.firing == 0
    assert gw.incident_of(hung).status == "firing"


def test_a_joined_alert_outliving_the_evidence_leaves_the_incident_capturing_nothing() -> None:
    """team-b (the gateway's route) joined the node's incident; the cluster's evidence
    resolves while team-b's alert fires on: the incident is spent (resolved, no failure
    domain's nor key's any more), so the node's next fault opens an incident of its own,
    which pages."""
    gw = Cluster()
    fault = change(0, "GPUFellOffBus", GPU)
    joined = on_faulty_node(10, "team-b", "bert")
    for one in (fault, joined):
        gw.send(one)
    node = gw.incident_of(fault)
    assert gw.incident_of(joined) is node and node.strangers == 1
    gw.send(change(100, "GPUFellOffBus", GPU, resolved=True))
    confirmed = 101 + POLICY.correlation.confirm_resolved
    gw.book.changed = {}
    gw.book.wake([node])
    decide_tick([], [], policy=POLICY, now=at(confirmed), channels=CHANNELS, incidents=gw.book)
    assert node.status == "resolved" and node.firing == node.strangers == 0
    assert node.key.endswith(f"|spent={node.id}")
    pages = len(gw.pages())
    again = change(confirmed + 5, "GPUFellOffBus", {**GPU, "gpu": "5"}, started=confirmed + 5)
    gw.send(again)
    assert gw.incident_of(again) is not node
    assert len(gw.pages()) == pages + 1, "the node's next fault pages"


def test_a_spent_incident_resolves_and_ends_its_escalation() -> None:
    """Issue 43: team-b (the gateway's route) hangs on the node; the node's incident paged
    (nobody acknowledged it). The cluster's evidence resolves while team-b's hang fires on:
    the incident is spent: RESOLVED on its card (saying why), its escalation ended, and
    team-b's later resolve changes nothing (no second RESOLVED, no page)."""
    gw = Cluster()
    fault = change(0, "GPUFellOffBus", GPU)
    joined, hung = on_faulty_node(10, "team-b", "bert"), hang(60, "team-b", "bert")
    for one in (fault, joined, hung):
        gw.send(one)
    node = gw.incident_of(fault)
    assert gw.incident_of(hung) is node and node.paged and node.page_alert_id == fault.alert_id
    gw.send(change(100, "GPUFellOffBus", GPU, resolved=True))
    confirmed = at(101 + POLICY.correlation.confirm_resolved)
    gw.book.changed = {}
    gw.book.wake([node])
    tick = decide_tick([], [], policy=POLICY, now=confirmed, channels=CHANNELS, incidents=gw.book)
    assert node.status == "resolved" and node.resolved_at == confirmed
    assert "2 alerts of the jobs it hit fired on" in node.spent, node.spent
    assert resolved_pages(gw.book) == [fault.alert_id], "its escalation ends"
    [card] = [d for d in tick.drafts if d.channel == "feishu_bot"]
    assert card.payload["status"] == "resolved" and card.payload["incident"]["spent"]
    assert "Spent" in str(build_card("alert", parse_payload(dict(card.payload))))
    before = len(gw.drafts)
    gw.send(change(200, "TrainingJobHang", labels("team-b", "bert", priority="P0"),
                   started=60, resolved=True))  # fmt: skip
    assert gw.drafts[before:] == [], "a job's alert the spent incident left changes nothing"
    assert node.status == "resolved"
