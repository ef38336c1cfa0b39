"""The hold (gateway/policy/infra_hold.py, issue 44) through the production path (`fold_into`
+ `flush`, the ticker's `decide_tick`): a trusted hardware alert of a node under a
topology element whose incident is not open waits `infrastructure.hold` before its own card
and page; the element's incident opening meanwhile takes it, and then it never speaks alone.

The alerts are rules/fabric.yaml's as node_exporter's infiniband collector labels them
(`device`, `port`), cluster-wide (no namespace: trusted evidence)."""

from __future__ import annotations

from dataclasses import replace

from tests.gateway.policy.planned import plan_change
from trainsentry.alerts import AlertChange, NotificationDraft
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.incident import IncidentBook
from trainsentry.gateway.policy.infra import InfraFold, InfraState, Sighting
from trainsentry.gateway.policy.rules import Policy, load_policy
from trainsentry.gateway.policy.storm import StormState, job_key
from trainsentry.gateway.policy.storm_fold import StormFold

from .factory import at, fire

POLICY = load_policy()
HOLD = POLICY.infrastructure.hold
PLACE = {"leaf_switch": "leaf-a"}
LEAF = "leaf_switch=leaf-a"
CHANNELS = {"feishu", "phone"}


def link_down(node: str, device: str = "mlx5_0") -> dict[str, str]:
    """The chart's cluster-wide alert (the factory's namespace and job emptied)."""
    return {"alertname": "IBPhysicalLinkDown", "node": node, "device": device, "port": "1",
            "priority": "P0", "component": "fabric", "job": "node-exporter",
            "namespace": "", "trainingjob": ""}  # fmt: skip


class Run:
    """Changes planned one batch each, as the planner plans them, with the ticker between;
    `seen` stands in for the store's sightings under leaf-a (its nodes so far)."""

    def __init__(self, policy: Policy = POLICY) -> None:
        self.policy = policy
        self.book = IncidentBook(policy)
        self.fps: dict[str, FingerprintState] = {}
        self.storms: dict[str, StormState] = {}
        self.infra: dict[str, InfraState] = {}
        self.nodes: set[str] = set()
        self.drafts: list[NotificationDraft] = []

    def __call__(self, change: AlertChange, now: float) -> None:
        self.nodes.add(change.alert.node)
        seen = {LEAF: Sighting(frozenset(self.nodes))}
        fold = InfraFold(self.policy, PLACE, self.infra, seen, change.alert.labels)
        key = job_key(change.alert.labels)
        storm = StormFold.of(self.storms.get(key) or StormState.new(change.alert.labels))
        result = plan_change(
            storm,
            change,
            fingerprint_state=self.fps.get(change.alert.fingerprint),
            distinct_nodes_in_window=1,
            policy=self.policy,
            now=at(now),
            channels=CHANNELS,
            place=PLACE,
            infra=fold,
            incidents=self.book,
        )
        self.storms[key] = storm.freeze()
        self.fps[change.alert.fingerprint] = result.fingerprint_state
        self.infra.update(result.infra_states)
        self.drafts += result.drafts

    def tick(self, now: float) -> None:
        """The ticker: the incidents whose `due_at` passed are woken (as the store's
        `due_incidents` finds them)."""
        due = [s for s in self.book.by_id.values() if s.due_at and s.due_at <= at(now)]
        self.book.wake(due)
        result = decide_tick(
            [],
            [],
            policy=self.policy,
            now=at(now),
            channels=CHANNELS,
            incidents=self.book,
            infra_open={key for key, state in self.infra.items() if state.open},
        )
        self.drafts += result.drafts

    def said(self) -> list[tuple[str, str, str]]:
        return [(d.channel, d.kind, d.payload.get("event", "")) for d in self.drafts]


def test_a_lone_nodes_link_down_waits_for_its_switch_then_pages_on_its_own() -> None:
    """One node's port down, and no other node under leaf-a follows: its card and page wait
    the hold, then go as they would have at once (before: at once)."""
    run = Run()
    run(fire(0, labels=link_down("n0"), fingerprint="a", alert_id=1), 0)
    run.tick(HOLD - 1)
    assert run.said() == [], "nothing yet: its switch may be failing"
    run.tick(HOLD)
    assert run.said() == [("feishu", "alert", "firing"), ("phone", "alert", "firing")]
    assert run.drafts[0].payload["alertname"] == "IBPhysicalLinkDown"
    run.tick(HOLD + 1)
    assert len(run.drafts) == 2, "said once"


def test_its_switchs_incident_opening_in_the_hold_takes_it_and_it_never_speaks_alone() -> None:
    """The P0 group's first notification held one node's ports; the other nodes' came a
    group_interval later and opened leaf-a's incident: one card, one page, the switch's;
    the first node's incident is quiet, and its later alerts fold into the switch's."""
    run = Run()
    run(fire(0, labels=link_down("n0"), fingerprint="a", alert_id=1), 0)
    run.tick(30)
    for i, node in enumerate(("n1", "n2"), start=2):
        run(fire(60, labels=link_down(node), fingerprint=node, alert_id=i), 60)
    assert run.infra[LEAF].open
    run.tick(HOLD)
    run.tick(HOLD + 60)
    run(fire(100, labels=link_down("n0", "mlx5_1"), fingerprint="a1", alert_id=5), 100)
    said = run.said()
    assert [s for s in said if s[1] != "infra"] == [], said
    assert said == [("feishu", "infra", "infra_opened"), ("phone", "infra", "infra_opened")]
    assert run.infra[LEAF].nodes == ("n0", "n1", "n2")
    assert "a1" in run.infra[LEAF].firing, "its later alert folded into the switch's"


def test_held_when_its_switchs_incident_opened_from_others_it_joins_it_at_the_end() -> None:
    """leaf-a's incident opened from other alerts than this incident's (another group):
    when the hold ends it is quiet, and remembers the element that speaks for it."""
    run = Run()
    flaps = {**link_down("n0"), "alertname": "IBLinkFlapping", "priority": "P1"}
    run(fire(0, labels=flaps, fingerprint="f", alert_id=1), 0)
    [held] = list(run.book.by_id.values())
    assert held.held and held.announced
    opened = replace(InfraState.new("leaf_switch", "leaf-a"), open=True, episode="e")
    run.infra[LEAF] = opened
    run.tick(HOLD)
    assert run.said() == []
    assert not held.held and not held.announced and held.infra == LEAF


def test_a_hold_of_zero_says_it_at_once() -> None:
    policy = load_policy(overrides={"infrastructure": {"hold": 0}})
    run = Run(policy)
    run(fire(0, labels=link_down("n0"), fingerprint="a", alert_id=1), 0)
    assert run.said() == [("feishu", "alert", "firing"), ("phone", "alert", "firing")]


def test_a_teams_own_link_down_is_never_held() -> None:
    """A team's alert (its namespace) is no evidence against the switch (issue 43): its own
    incident's card goes at once."""
    run = Run()
    labels = {**link_down("n0"), "namespace": "team-a", "trainingjob": "llm"}
    run(fire(0, labels=labels, fingerprint="t", alert_id=1), 0)
    assert ("feishu", "alert", "firing") in run.said()


def test_a_gpu_off_the_bus_is_no_switchs_doing_and_pages_at_once() -> None:
    """`infrastructure.hold_components` (fabric): a GPU fell off the bus (dcgm-exporter's
    XID 79, the chart's cluster-wide rule) on a node under leaf-a pages at once; with `gpu`
    among the held components it would wait the hold too."""
    fell = {**link_down("n0"), "alertname": "GPUFellOffBus", "component": "gpu", "gpu": "3",
            "job": "dcgm-exporter", "device": "", "port": ""}  # fmt: skip
    run = Run()
    run(fire(0, labels=fell, fingerprint="g", alert_id=1), 0)
    assert ("phone", "alert", "firing") in run.said(), run.said()
    held = load_policy(overrides={"infrastructure": {"hold_components": ["fabric", "gpu"]}})
    run = Run(held)
    run(fire(0, labels=fell, fingerprint="g", alert_id=1), 0)
    assert run.said() == []
