"""Correlation (issue 37), pure: a node's alerts and its jobs' consequences are one incident
whose cause is chosen by CAUSE_ORDER, one page; twins are one alert; a resolution while the
node is dead is unknown; per-rank alerts fold; the story line; the setting that turns it off.

Each test failed before correlation (on the issue 34 incidents): see the commit message."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import timedelta

import pytest

from tests.gateway.policy.factory import at
from tests.gateway.policy.planned import DecideResult, decide
from trainsentry.alerts import Alert, AlertChange, AlertStatus, ChangeKind, NotificationDraft
from trainsentry.gateway.policy.classify import classify
from trainsentry.gateway.policy.correlate import (
    CONSEQUENCE,
    EXPORTER_DOWN,
    FAULT,
    FOREIGN,
    NODE_DOWN,
    rank,
)
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.incident import FIRING, RESOLVED, IncidentBook, IncidentState
from trainsentry.gateway.policy.incident_cards import incident_block, incident_payload
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy
from trainsentry.gateway.policy.story import ranks_text, story_line
from trainsentry.gateway.policy.twins import twin_identity

POLICY = load_policy()
OFF = merge_policy(POLICY, {"correlation": {"enabled": False}})
NODE = "gpu-node-05"
JOB = {"namespace": "ml", "trainingjob": "llama-70b"}
GPU = {"priority": "P0", "component": "gpu", "node": NODE, "gpu": "3", "xid": "79"}
CHANNELS = {"feishu_bot", "phone"}


def change(
    when: float,
    name: str,
    labels: Mapping[str, str],
    *,
    resolved: bool = False,
    started: float = 0.0,
    group: str | None = None,
) -> AlertChange:
    """A change of the alert `name` with exactly `labels`, in its own Alertmanager group
    (the shipped route groups by alertname, namespace, trainingjob and node)."""
    full = {"alertname": name, **labels}
    fingerprint = "|".join(f"{k}={v}" for k, v in sorted(full.items()))
    status = AlertStatus.RESOLVED if resolved else AlertStatus.FIRING
    alert = Alert(
        fingerprint=fingerprint,
        status=status,
        labels=full,
        annotations={"summary": name},
        starts_at=at(started),
        ends_at=at(when) if resolved else None,
    )
    keys = ("alertname", "namespace", "trainingjob", "node")
    group_key = group or "{}:{" + ",".join(f"{k}={full.get(k, '')}" for k in keys) + "}"
    alert_id = 1 + abs(hash((fingerprint, started))) % 10**9
    kind = ChangeKind.RESOLVED if resolved else ChangeKind.FIRING
    return AlertChange(alert_id, kind, alert, at(when), group_key)


class Gateway:
    """decide() with the fingerprints' states and one book of incidents across calls."""

    def __init__(self, policy: Policy = POLICY) -> None:
        self.policy = policy
        self.book = IncidentBook(policy)
        self.fps: dict[str, object] = {}
        self.drafts: list[NotificationDraft] = []

    def send(self, change: AlertChange, nodes: int = 1) -> DecideResult:
        """`nodes`: the distinct nodes of the alert's job and name in the blast window."""
        result = decide(
            change,
            fingerprint_state=self.fps.get(change.alert.fingerprint),  # type: ignore[arg-type]
            storm_state=None,
            distinct_nodes_in_window=nodes,
            policy=self.policy,
            now=change.at,
            channels=CHANNELS,
            incidents=self.book,
        )
        self.fps[change.alert.fingerprint] = result.fingerprint_state
        self.drafts += result.drafts
        return result

    def tick(self, when: float) -> None:
        """The ticker: incidents whose follow-up or confirmation is due."""
        due = [s for s in self.book.by_id.values() if s.due_at is not None and s.due_at <= at(when)]
        book = self.book
        book.changed = {}
        book.wake(due)
        result = decide_tick(
            [], [], policy=self.policy, now=at(when), channels=CHANNELS, incidents=book
        )
        self.drafts += result.drafts

    def pages(self) -> list[NotificationDraft]:
        return [d for d in self.drafts if d.channel == "phone"]

    def cards(self) -> list[NotificationDraft]:
        return [d for d in self.drafts if d.channel == "feishu_bot"]

    def incident_of(self, change: AlertChange) -> IncidentState:
        return self.book.by_id[self.book.members[change.alert_id]]


def gpu(when: float, *, job: bool, resolved: bool = False, started: float = 0.0) -> AlertChange:
    labels = {**GPU, **JOB} if job else GPU
    return change(when, "GPUFellOffBus", labels, resolved=resolved, started=started)


def node_alert(
    when: float,
    name: str,
    *,
    resolved: bool = False,
    job: bool = False,
    started: float | None = None,
) -> AlertChange:
    """`started`: the occurrence's startsAt (default `when`); a resolve names the one that
    fired (a resolve of an occurrence never seen firing resolves nothing)."""
    labels = {
        "KubeNodeNotReady": {"priority": "P0", "component": "kubernetes"},
        "NodeExporterDown": {"priority": "P1", "component": "node"},
        "DCGMExporterDown": {"priority": "P1", "component": "gpu"},
    }[name]
    extra = JOB if job else {}
    start = when if started is None else started
    return change(when, name, {**labels, "node": NODE, **extra}, resolved=resolved, started=start)


def job_alert(when: float, name: str, priority: str, *, resolved: bool = False) -> AlertChange:
    labels = {**JOB, "priority": priority, "component": "training"}
    return change(when, name, labels, resolved=resolved, started=100.0)


def probe(when: float, rank_no: int, *, node: str = NODE, resolved: bool = False) -> AlertChange:
    labels = {
        **JOB,
        "priority": "P2",
        "component": "training",
        "node": node,
        "pod": f"llama-70b-worker-{rank_no}",
        "rank": str(rank_no),
    }
    return change(when, "TrainingProbeDown", labels, resolved=resolved, started=300.0)


def node_death(gw: Gateway) -> list[AlertChange]:
    """The issue's scenario, its times in seconds after the XID."""
    sent = [
        gpu(0, job=False),
        gpu(0.5, job=True),
        gpu(67, job=False, resolved=True),
        gpu(67, job=True, resolved=True),
        job_alert(80, "NCCLRasDeadProcesses", "P0"),
        node_alert(161, "NodeExporterDown"),
        node_alert(161, "DCGMExporterDown"),
        node_alert(180, "KubeNodeNotReady"),
        node_alert(180, "KubeNodeNotReady", job=True),
        job_alert(200, "NCCLRasMissingRanks", "P1"),
        *(probe(320, r) for r in range(40, 48)),
        job_alert(337, "TrainingJobHang", "P0"),
    ]
    for one in sent:
        gw.send(one)
        gw.tick(one.at.timestamp() - at(0).timestamp())
    return sent


def placement(when: float, node: str = NODE) -> AlertChange:
    """rules/training.yaml's TrainingJobOnFaultyNode: the job has pods on a node where a
    cluster-wide P0 hardware alert fires (the operator copies no untuned hardware rule)."""
    labels = {**JOB, "priority": "P3", "component": "training", "node": node}
    return change(when, "TrainingJobOnFaultyNode", labels, started=when)


def test_without_job_copies_the_jobs_own_alert_on_the_node_names_it_and_leads_its_alerts_in() -> (
    None
):
    """docs/alerts.md "Job scope": no job copy of GPUFellOffBus. The job's placement alert
    (job and node) joins the node's incident and names the job at once; the job's alerts
    that name no node (NCCL RAS, its hang) follow it there: one incident, one page."""
    gw = Gateway()
    sent = [
        gpu(0, job=False),
        placement(30),
        job_alert(80, "NCCLRasDeadProcesses", "P0"),
        node_alert(180, "KubeNodeNotReady"),
        *(probe(320, r) for r in range(40, 48)),
        job_alert(337, "TrainingJobHang", "P0"),
    ]
    for one in sent[:2]:
        gw.send(one)
    assert len(gw.cards()) == 2, "the job hit is told at once"
    assert gw.cards()[1].payload["incident"]["jobs"] == ["ml/llama-70b"]
    for one in sent[2:]:
        gw.send(one)
    assert len({gw.book.members[c.alert_id] for c in sent}) == 1
    assert len(gw.pages()) == 1
    state = gw.incident_of(sent[0])
    assert state.cause.startswith("GPUFellOffBus") and state.realm == ""
    story = incident_block(state, POLICY)["story"]
    assert " → ml/llama-70b: runs on the node +30 s → " in story, story
    assert "ml/llama-70b hung: ranks 40–47" in story

    # without it, nothing tells the gateway where the job runs before its probes go down:
    # its NCCL RAS alert opens an incident of its own, and pages again
    gw = Gateway()
    gw.send(gpu(0, job=False))
    ras = job_alert(80, "NCCLRasDeadProcesses", "P0")
    gw.send(ras)
    assert len(gw.book.by_id) == 2 and gw.incident_of(ras).cause.startswith("NCCLRas")
    assert len(gw.pages()) == 2


def test_a_placement_before_its_nodes_fault_anchors_none_of_the_jobs_alerts() -> None:
    """Alertmanager flushes a fault of a node it learnt late a group interval later, so the
    job's placement on that node can come first (the dead-leaf run: placements of 8 nodes in
    one webhook, 4 nodes' port alerts still on their way). Processed first, it opened an
    incident the job's NCCL and hang alerts then followed: a second page. Now it stays an
    alert of its own (P3: no card) and the job's alerts follow the placement that joined
    its node's fault."""
    gw = Gateway()
    gw.send(gpu(0, job=False))
    early = placement(30, node="gpu-node-09")  # its node's fault is not at the gateway yet
    gw.send(early, nodes=8)  # on 8 nodes of the job: the blast radius would make it P2
    gw.send(placement(30), nodes=8)
    ras = job_alert(80, "NCCLRasDeadProcesses", "P0")
    hang = job_alert(337, "TrainingJobHang", "P0")
    gw.send(ras)
    gw.send(hang)
    fault = gw.incident_of(gpu(0, job=False))
    assert gw.incident_of(ras) is fault and gw.incident_of(hang) is fault
    stray = gw.incident_of(early)
    assert stray is not fault and stray.priority.value == "P3" and not stray.domain
    assert len(gw.pages()) == 1
    assert not [d for d in gw.cards() if d.payload["alertname"] == "TrainingJobOnFaultyNode"]


def test_a_placement_takes_the_job_from_an_incident_its_nccl_alert_opened_first() -> None:
    """Under load the job's NCCL RAS errors (no node) can come before its placement: they
    open an incident of no node. The placement joins the node's fault and takes the job's
    later alerts with it: the hang joins the fault's incident, which paged; no second page."""
    gw = Gateway()
    ras = job_alert(0, "NCCLRasCommunicatorErrors", "P1")
    gw.send(ras)
    gw.send(gpu(5, job=False))
    gw.send(placement(30))
    hang = job_alert(337, "TrainingJobHang", "P0")
    gw.send(hang)
    fault = gw.incident_of(gpu(5, job=False))
    assert gw.incident_of(ras) is not fault and gw.incident_of(hang) is fault
    assert len(gw.pages()) == 1 and fault.jobs == ["ml/llama-70b"]


def test_cause_order_ranks_faults_then_notready_then_exporters_then_consequences() -> None:
    def level(c: AlertChange) -> int:
        return rank(c.alert, classify(c.alert, POLICY, distinct_nodes_in_window=1), POLICY)

    assert level(gpu(0, job=False)) == FAULT
    assert level(node_alert(0, "KubeNodeNotReady")) == NODE_DOWN
    assert level(node_alert(0, "DCGMExporterDown")) == EXPORTER_DOWN
    assert level(probe(0, 1)) == CONSEQUENCE
    assert level(job_alert(0, "TrainingJobHang", "P0")) == CONSEQUENCE
    disk = change(
        0, "NodeFilesystemSpaceLow", {"priority": "P1", "component": "node", "node": NODE}
    )
    hot = change(0, "GPUTemperatureHigh", {"priority": "P2", "component": "gpu", "node": NODE})
    assert level(disk) == FOREIGN and level(hot) == FOREIGN, "no hardware fault, no domain"


def test_a_dead_node_is_one_incident_with_one_page_and_its_cause_first() -> None:
    gw = Gateway()
    sent = node_death(gw)
    incidents = {gw.book.members[c.alert_id] for c in sent}
    assert len(incidents) == 1, "every alert of the node and its job's consequences: one"
    assert len(gw.pages()) == 1, "consequences never page again"
    [state] = [gw.book.by_id[i] for i in incidents]
    assert state.cause.startswith("GPUFellOffBus") and state.status == FIRING
    block = incident_block(state, POLICY)
    assert block["alerts"] == 15, (
        "twins count once: GPU, RAS x2, exporters x2, NotReady, 8 probes, hang"
    )
    story = block["story"]
    assert story.startswith(f"{NODE}: GPU 3 fell off the bus (XID 79) ")
    assert " → node NotReady +180 s" in story
    assert "8 probes of ml/llama-70b on gpu-node-05 down +320 s" in story
    assert "ml/llama-70b hung: ranks 40–47 (pods llama-70b-worker-40" in story
    assert block["culprits"].startswith("ml/llama-70b: ranks 40–47 (pods llama-70b-worker-40")
    assert block["culprits"].endswith("on gpu-node-05 gone")
    assert block["jobs"] == ["ml/llama-70b"]


def test_the_bot_learns_at_once_which_job_is_hit_and_a_better_cause() -> None:
    """A bot channel cannot update its card: a follow-up waits `follow_up_interval`. The
    first job hit and a better cause are told at once (a new card), each once; other
    consequences wait for the follow-up. Failed before: the job's twin 10 s after the
    cluster-wide GPU alert was told only 300 s later (tests/e2e/test_node_death.py)."""
    gw = Gateway()
    gw.send(gpu(0, job=False))
    assert len(gw.cards()) == 1 and "jobs" not in gw.cards()[0].payload["incident"]
    gw.send(gpu(10, job=True))  # the twin names the job
    assert len(gw.cards()) == 2, "the first job hit is told at once"
    assert gw.cards()[1].payload["incident"]["jobs"] == ["ml/llama-70b"]
    gw.send(job_alert(80, "NCCLRasDeadProcesses", "P0"))
    gw.send(node_alert(180, "KubeNodeNotReady"))  # a worse cause than the GPU: no new card
    gw.send(probe(190, 40))
    assert len(gw.cards()) == 2, "consequences wait for the follow-up"
    gw.send(job_alert(200, "TrainingJobHang", "P0"))
    assert len(gw.cards()) == 3, "the job hung: told at once, with its culprits"
    assert "llama-70b-worker-40" in gw.cards()[2].payload["incident"]["culprits"]

    gw = Gateway()
    gw.send(job_alert(0, "TrainingJobHang", "P0"))
    gw.send(probe(1, 40))
    assert len(gw.cards()) == 2, "the hang's card, then its job's node named"
    gw.send(gpu(2, job=True))
    assert len(gw.cards()) == 3, "a better cause is told at once"
    assert gw.cards()[2].payload["alertname"] == "GPUFellOffBus"
    assert len(gw.pages()) == 1


def test_without_correlation_the_node_death_is_many_incidents_and_pages() -> None:
    gw = Gateway(OFF)
    sent = node_death(gw)
    assert len({gw.book.members[c.alert_id] for c in sent}) >= 6
    assert len(gw.pages()) >= 3
    # the twins are still one alert: the job's copy joined the cluster-wide GPU alert
    assert gw.book.members[sent[0].alert_id] == gw.book.members[sent[1].alert_id]


def test_a_consequence_first_opens_the_incident_and_is_demoted_when_its_cause_comes() -> None:
    gw = Gateway()
    hang = job_alert(0, "TrainingJobHang", "P0")
    gw.send(hang)
    gw.send(probe(1, 40))
    gw.send(gpu(2, job=True))
    gw.send(node_alert(3, "KubeNodeNotReady", job=True))
    state = gw.incident_of(hang)
    assert len(gw.book.by_id) == 1
    assert state.cause.startswith("GPUFellOffBus"), "the better cause leads the card"
    assert state.lead_labels["alertname"] == "GPUFellOffBus"
    assert len(gw.pages()) == 1, "the hang paged; its cause does not page again"
    assert incident_payload(state, POLICY, "r")["alertname"] == "GPUFellOffBus", "its card"
    # trusted cluster-wide evidence never joins a job's incident (issue 43): a job's
    # incident of the node may be a decoy; the cluster's NotReady opens the cluster's own
    cluster = node_alert(4, "KubeNodeNotReady")
    gw.send(cluster)
    assert gw.incident_of(cluster) is not state and state.lead_labels["alertname"] == (
        "GPUFellOffBus"
    )


def test_a_second_node_of_the_job_is_a_failure_domain_of_its_own() -> None:
    gw = Gateway()
    first = gpu(0, job=True)
    gw.send(first)
    other = change(5, "GPUFellOffBus", {**GPU, **JOB, "node": "gpu-node-09"})
    gw.send(other)
    assert gw.incident_of(first) is not gw.incident_of(other)
    assert len(gw.pages()) == 2


def test_a_job_level_consequence_after_the_window_opens_its_own_incident() -> None:
    gw = Gateway(merge_policy(POLICY, {"correlation": {"window": 60}}))
    first = gpu(0, job=True)
    gw.send(first)
    late = job_alert(120, "NCCLRasDeadProcesses", "P0")
    gw.send(late)
    assert gw.incident_of(first) is not gw.incident_of(late)


def test_a_gpu_resolved_while_its_node_is_dead_is_unknown_until_the_node_is_back() -> None:
    gw = Gateway()
    node_death(gw)
    gw.tick(900)  # long after the confirmation: the node's targets are still down
    [state] = gw.book.by_id.values()
    assert state.status == FIRING and state.unknown
    assert (
        "unknown while DCGMExporterDown, KubeNodeNotReady, NodeExporterDown fire"
        in incident_block(state, POLICY)["unknown"]
    )
    assert not [d for d in gw.cards() if d.payload["status"] == "resolved"]
    # the node comes back, the job's alerts resolve; the GPU is still missing: it fires again
    for name, fired in (("NodeExporterDown", 161), ("DCGMExporterDown", 161)):
        gw.send(node_alert(1000, name, resolved=True, started=fired))
    gw.send(node_alert(1000, "KubeNodeNotReady", resolved=True, started=180))
    gw.send(node_alert(1000, "KubeNodeNotReady", resolved=True, job=True, started=180))
    for name, prio in (("NCCLRasDeadProcesses", "P0"), ("NCCLRasMissingRanks", "P1")):
        gw.send(job_alert(1001, name, prio, resolved=True))
    gw.send(job_alert(1001, "TrainingJobHang", "P0", resolved=True))
    for r in range(40, 48):
        gw.send(probe(1001, r, resolved=True))
    gw.send(gpu(1010, job=False, started=1010))
    gw.send(gpu(1010, job=True, started=1010))
    gw.tick(1010 + POLICY.correlation.confirm_resolved + 1)
    assert state.status == FIRING and not state.unknown, "open on the GPU that fires again"
    assert state.firing == 1
    # the GPU returns: resolved once its node proved alive for the confirmation time
    gw.send(gpu(2000, job=False, resolved=True, started=1010))
    gw.send(gpu(2000, job=True, resolved=True, started=1010))
    assert state.status == FIRING
    gw.tick(2000 + POLICY.correlation.confirm_resolved + 1)
    assert state.status == RESOLVED
    resolved = [d for d in gw.cards() if d.payload["status"] == "resolved"]
    assert len(resolved) == 1
    assert len(gw.pages()) == 1


def test_a_fault_resolved_with_its_node_alive_resolves_after_the_confirmation() -> None:
    gw = Gateway()
    gw.send(gpu(0, job=False))
    gw.send(gpu(30, job=False, resolved=True))
    [state] = gw.book.by_id.values()
    assert state.status == FIRING, "not believed yet"
    gw.tick(30 + POLICY.correlation.confirm_resolved - 1)
    assert state.status == FIRING
    gw.tick(30 + POLICY.correlation.confirm_resolved)
    assert state.status == RESOLVED and len(gw.cards()) == 2


def test_with_correlation_off_a_resolution_counts_at_once() -> None:
    gw = Gateway(OFF)
    gw.send(gpu(0, job=False))
    gw.send(gpu(30, job=False, resolved=True))
    [state] = gw.book.by_id.values()
    assert state.status == RESOLVED


@pytest.mark.parametrize("policy", [OFF, POLICY], ids=["uncorrelated", "correlated"])
def test_twins_are_one_alert_when_the_cluster_wide_one_comes_first(policy: Policy) -> None:
    gw = Gateway(policy)
    first, second = gpu(0, job=False), gpu(0.2, job=True)
    assert twin_identity(first.alert) == twin_identity(second.alert)
    gw.send(first)
    gw.send(second)
    state = gw.incident_of(first)
    assert gw.incident_of(second) is state
    assert incident_block(state, policy)["alerts"] == 1
    assert len(gw.pages()) == 1  # correlated, the job named is shown at once: a second card
    assert len(gw.cards()) == (1 if policy is OFF else 2)
    assert state.job == "ml/llama-70b", "the copy with the job names it"
    gw.send(gpu(10, job=True, resolved=True))
    assert state.status == FIRING, "the cluster-wide copy still fires"
    gw.send(gpu(11, job=False, resolved=True))
    assert state.status == (RESOLVED if policy is OFF else FIRING)  # correlated: confirmed later


@pytest.mark.parametrize("policy", [OFF, POLICY], ids=["uncorrelated", "correlated"])
def test_a_job_copy_that_never_resolves_keeps_no_cluster_incident_open(policy: Policy) -> None:
    """Issue 43: any team can raise a copy of a cluster-wide alert (the same labels, its own
    namespace and job) and never resolve it. The cluster-wide alert speaks for the one
    alert: its resolve resolves it, and the incident, whatever the copy does; the copy's
    resolve later changes nothing. Failed before: the incident stayed open on the copy."""
    gw = Gateway(policy)
    cluster, copy = gpu(0, job=False), gpu(0.2, job=True)
    gw.send(cluster)
    gw.send(copy)
    state = gw.incident_of(cluster)
    assert gw.incident_of(copy) is state
    gw.send(gpu(10, job=False, resolved=True))
    gw.tick(10 + policy.correlation.confirm_resolved)  # correlated: a fault is confirmed later
    assert state.status == RESOLVED, "the team's copy keeps it open no more"
    resolved_cards = len(gw.cards())
    gw.send(gpu(20 + policy.correlation.confirm_resolved, job=True, resolved=True))
    assert state.status == RESOLVED and state.firing == 0
    assert len(gw.cards()) == resolved_cards, "the copy's resolve says nothing"
    again = gpu(2000, job=False, started=2000)  # the GPU falls off again: a new incident
    gw.send(again)
    assert gw.incident_of(again) is not state and gw.incident_of(again).status == FIRING


def test_a_job_copy_that_joined_the_nodes_incident_first_keeps_it_open_no_more() -> None:
    """Issue 43, the other order: the node's cluster incident is open (NotReady), a team's
    copy of `GPUFellOffBus` joins it as one of the jobs hit, then the cluster-wide alert
    joins as its twin. When the cluster-wide alerts resolve, the incident resolves though
    the team's copy never does. Failed before: it stayed open on the copy."""
    gw = Gateway()
    notready, copy, cluster = node_alert(0, "KubeNodeNotReady"), gpu(1, job=True), gpu(2, job=False)
    for one in (notready, copy, cluster):
        gw.send(one)
    state = gw.incident_of(notready)
    assert gw.incident_of(copy) is state and gw.incident_of(cluster) is state
    gw.send(gpu(60, job=False, resolved=True))
    gw.send(node_alert(61, "KubeNodeNotReady", resolved=True, started=0))
    gw.tick(61 + POLICY.correlation.confirm_resolved)
    assert state.status == RESOLVED


@pytest.mark.parametrize("policy", [OFF, POLICY], ids=["uncorrelated", "correlated"])
def test_the_cluster_wide_alert_never_joins_a_jobs_copy(policy: Policy) -> None:
    """Issue 43: a job's copy that came first may be a tenant's decoy (any team can raise
    `GPUFellOffBus{node=...}` with its own namespace); the trusted cluster-wide alert opens
    the cluster's incident instead of folding into the job's, and the job's stays its own."""
    gw = Gateway(policy)
    first, second = gpu(0, job=True), gpu(0.2, job=False)
    gw.send(first)
    gw.send(second)
    job, cluster = gw.incident_of(first), gw.incident_of(second)
    assert job is not cluster
    assert job.realm == "trainingjob:ml/llama-70b" and cluster.realm == ""
    assert cluster.jobs == [] and job.jobs == ["ml/llama-70b"]
    assert len(gw.pages()) == 2, "the job's and the cluster's, each through its own route"
    gw.send(gpu(11, job=True, resolved=True))
    assert cluster.status == FIRING, "the job's copy resolves nothing of the cluster's"


def test_twins_differ_by_gpu_and_alertname() -> None:
    one = gpu(0, job=False).alert
    other_gpu = change(0, "GPUFellOffBus", {**GPU, "gpu": "4"}).alert
    other_name = change(0, "GPUMissing", GPU).alert
    assert len({twin_identity(a) for a in (one, other_gpu, other_name)}) == 3
    assert twin_identity(job_alert(0, "TrainingJobHang", "P0").alert) == ""


def test_per_rank_probes_in_separate_groups_fold_into_one_card() -> None:
    gw = Gateway()
    sent = [
        change(
            1 + r * 0.1,
            "TrainingProbeDown",
            probe(0, r).alert.labels,
            group=f"{{}}:{{instance=10.0.0.{r}}}",
        )
        for r in range(40, 48)
    ]
    for one in sent:
        gw.send(one)
    assert len({gw.book.members[c.alert_id] for c in sent}) == 1
    state = gw.incident_of(sent[0])
    assert "8 probes of ml/llama-70b on gpu-node-05 down" in incident_block(state, POLICY)["story"]
    assert len(gw.cards()) == 1


def test_ranks_text_runs() -> None:
    assert ranks_text(["42", "40", "41", "47", "45", "46"]) == "40–42, 45–47"
    assert ranks_text(["a", "b"]) == "a, b"


def test_story_line_orders_steps_with_delays() -> None:
    base = at(0)
    story = {
        "b": {
            "at": (base + timedelta(seconds=60)).isoformat(),
            "name": "KubeNodeNotReady",
            "rank": NODE_DOWN,
            "node": NODE,
            "gpu": "",
            "xid": "",
            "job": "",
            "count": 1,
            "pods": [],
            "ranks": [],
        },
        "a": {
            "at": base.isoformat(),
            "name": "GPUFellOffBus",
            "rank": FAULT,
            "node": NODE,
            "gpu": "3",
            "xid": "79",
            "job": "",
            "count": 1,
            "pods": [],
            "ranks": [],
        },
    }
    line = story_line(f"node={NODE}", story)
    assert line == f"{NODE}: GPU 3 fell off the bus (XID 79) {base:%H:%M:%S} → node NotReady +60 s"


def test_property_every_alert_in_one_incident_and_one_page_per_incident() -> None:
    """Seeded random webhook sequences with node deaths: every alert is in exactly one
    incident, and at most one escalation is started per incident."""
    for seed in range(60):
        rng = random.Random(seed)
        gw = Gateway(POLICY if seed % 4 else OFF)
        pool: list[AlertChange] = []
        for step in range(rng.randint(5, 40)):
            when = step * rng.choice((1, 5, 30))
            node = f"gpu-node-0{rng.randint(1, 3)}"
            kind = rng.randrange(6)
            if kind == 0:
                c = change(
                    when,
                    "GPUFellOffBus",
                    {**GPU, "node": node, **(JOB if rng.random() < 0.5 else {})},
                )
            elif kind == 1:
                c = change(
                    when,
                    "KubeNodeNotReady",
                    {"priority": "P0", "component": "kubernetes", "node": node},
                )
            elif kind == 2:
                c = change(
                    when, "DCGMExporterDown", {"priority": "P1", "component": "gpu", "node": node}
                )
            elif kind == 3:
                c = probe(when, rng.randint(0, 15), node=node)
            elif kind == 4:
                c = job_alert(when, rng.choice(("TrainingJobHang", "NCCLRasDeadProcesses")), "P0")
            else:
                if not pool:
                    continue
                old = rng.choice(pool)
                c = AlertChange(
                    old.alert_id,
                    ChangeKind.RESOLVED,
                    Alert(
                        old.alert.fingerprint,
                        AlertStatus.RESOLVED,
                        old.alert.labels,
                        {},
                        old.alert.starts_at,
                        at(when),
                    ),
                    at(when),
                    old.group_key,
                )
            if c.kind is ChangeKind.FIRING:
                pool.append(c)
            gw.send(c)
            if rng.random() < 0.3:
                gw.tick(when + rng.choice((1, 400)))
        ids = {c.alert_id for c in pool}
        assert ids <= set(gw.book.members), f"seed {seed}: an alert in no incident"
        pages: dict[str, int] = {}
        for d in gw.pages():
            pages[d.group_key] = pages.get(d.group_key, 0) + 1
        assert all(n == 1 for n in pages.values()), f"seed {seed}: {pages}"
        for state in gw.book.by_id.values():
            assert state.firing >= 0
            assert state.status == RESOLVED or state.firing > 0 or not state.total


def test_a_cluster_wide_alert_names_no_job_until_a_training_job_joins() -> None:
    """Prometheus gives every series its scrape `job` ("dcgm-exporter"), which is no
    TrainingJob: the node-death run's first card said "— dcgm-exporter" and its call "on job
    dcgm-exporter". The payload's `job` is a TrainingJob's `namespace/name` or absent."""
    gw = Gateway()
    scrape = {**GPU, "job": "dcgm-exporter", "instance": "10.0.5.1:9400"}
    first = change(0, "GPUFellOffBus", scrape)
    gw.send(first)
    assert "job" not in incident_payload(gw.incident_of(first), POLICY, "r")
    assert gw.pages() and all("job" not in d.payload for d in gw.drafts)
    gw.send(change(5, "GPUFellOffBus", {**scrape, **JOB}))  # the job-scoped copy
    assert incident_payload(gw.incident_of(first), POLICY, "r")["job"] == "ml/llama-70b"
