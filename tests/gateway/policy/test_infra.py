"""Infrastructure incidents in the pure policy (gateway/policy/infra.py through `decide` and
`decide_tick`): a flapping alert's held resolve stays folded when the timer releases it,
and the incident still closes when its alerts resolve."""

from __future__ import annotations

from dataclasses import replace

from tests.gateway.policy.planned import decide
from trainsentry.alerts import AlertChange, NotificationDraft
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.policy.classify import classify
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.infra import InfraFold, InfraState, Sighting, sightings
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import StormState, job_key
from trainsentry.gateway.policy.topology import from_settings
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload

from .factory import at, fire, resolve

POLICY = load_policy()
PLACE = {"leaf_switch": "leaf-7"}
SEEN = {"leaf_switch=leaf-7": Sighting(frozenset({"n0", "n1", "n2"}), frozenset({"team-a/llm"}))}


def labels(node: str, namespace: str = "") -> dict[str, str]:
    """A chart's cluster-wide alert (no namespace: trusted evidence), or a team's own."""
    return {"alertname": "IBLinkFlapping", "node": node, "component": "fabric", "priority": "P1",
            "namespace": namespace, "trainingjob": ""}  # fmt: skip


class Run:
    """Feeds changes through `decide` as the planner does, keeping every state."""

    def __init__(self) -> None:
        self.fps: dict[str, FingerprintState] = {}
        self.storms: dict[str, StormState] = {}  # per job (storm.job_key)
        self.infra: dict[str, InfraState] = {}
        self.drafts: list[NotificationDraft] = []

    def __call__(self, change: AlertChange, now: float) -> None:
        fold = InfraFold(POLICY, PLACE, self.infra, SEEN, change.alert.labels)
        result = decide(
            change,
            fingerprint_state=self.fps.get(change.alert.fingerprint),
            storm_state=self.storms.get(job_key(change.alert.labels)),
            distinct_nodes_in_window=1,
            policy=POLICY,
            now=at(now),
            channels={"feishu", "phone"},
            place=PLACE,
            infra=fold,
        )
        self.fps[change.alert.fingerprint] = result.fingerprint_state
        if result.storm_state is not None:
            self.storms[job_key(change.alert.labels)] = result.storm_state
        self.infra.update(result.infra_states)
        self.drafts += result.drafts

    def tick(self, now: float) -> None:
        result = decide_tick(
            list(self.fps.values()), [], policy=POLICY, now=at(now), channels={"feishu", "phone"}
        )
        self.fps.update(result.fingerprint_states)
        self.drafts += result.drafts

    def events(self) -> list[tuple[str, str]]:
        return [(d.kind, d.payload.get("event", "")) for d in self.drafts if d.channel == "feishu"]


def test_a_flapping_alerts_held_resolve_stays_folded_and_the_incident_closes() -> None:
    run = Run()
    run(fire(0, labels=labels("n0"), fingerprint="a", alert_id=1), 0)
    run(fire(1, labels=labels("n1"), fingerprint="b", alert_id=2), 1)
    assert run.infra["leaf_switch=leaf-7"].open
    # "a" flaps: fire/resolve until dedup holds its resolves
    t = 10.0
    for _ in range(4):
        run(resolve(t, t - 10, fingerprint="a", alert_id=1, labels=labels("n0")), t)
        run(fire(t + 5, labels=labels("n0"), fingerprint="a", alert_id=1), t + 5)
        t += 10
    run(resolve(t, t - 5, fingerprint="a", alert_id=1, labels=labels("n0")), t)
    assert run.fps["a"].hold_until is not None, "the last resolve is held (flapping)"
    run.tick(t + POLICY.dedup.flap_hold + 1)  # the timer releases it
    assert [e for e in run.events() if e[0] == "alert"] == [], "no card of its own, ever"
    assert run.infra["leaf_switch=leaf-7"].open, "b still fires"
    run(resolve(t + 700, 1, fingerprint="b", alert_id=2, labels=labels("n1")), t + 700)
    assert run.events()[-1] == ("infra", "infra_resolved")
    assert not run.infra["leaf_switch=leaf-7"].open
    assert run.events().count(("infra", "infra_opened")) == 1


def _consequence(fold: InfraFold, key: str, name: str, priority: str, when: float) -> bool:
    labels = {"alertname": name, "priority": priority, "component": "training",
              "namespace": "team-a", "trainingjob": "llm"}  # fmt: skip
    alert = fire(when, labels=labels, fingerprint=f"{name}{when}", alert_id=9).alert
    classification = classify(alert, POLICY, distinct_nodes_in_window=1)
    return fold.fold_consequence(key, alert, 9, classification, at(when))


def test_a_consequence_is_told_once_per_job_the_strongest_kept_and_pages_only_once() -> None:
    """Issue 44 (infra.py `fold_consequence`): the job's consequences update the open
    incident; the first is told (`infra_update`), a later stronger one replaces its words
    without another update, a P0 pages only when the incident had not paged, and a closed
    incident takes nothing."""
    state = replace(InfraState.new("leaf_switch", "leaf-7"), open=True, episode="e")
    fold = InfraFold(POLICY, {}, {state.key: state}, {}, {"namespace": "team-a"})
    assert _consequence(fold, state.key, "NCCLRasCommunicatorErrors", "P1", 1)
    assert _consequence(fold, state.key, "TrainingJobHang", "P0", 2)
    kinds = [m.kind.value for m in fold.messages]
    assert kinds == ["infra_job_notice", "infra_update", "infra_page"], kinds
    after = fold.states[state.key]
    assert after.consequences == {"team-a/llm": "TrainingJobHang"} and after.paged
    assert "team-a/llm NCCL communicators in error" in fold.messages[1].payload["alertname"]
    assert "team-a/llm hung in a collective" in fold.messages[2].payload["alertname"]
    assert _consequence(fold, state.key, "TrainingJobHang", "P0", 3)
    assert _consequence(fold, state.key, "NCCLRasMissingRanks", "P1", 4)
    assert len(fold.messages) == 3, "no second page, no second update"
    assert fold.states[state.key].consequences == {"team-a/llm": "TrainingJobHang"}, "kept"
    shut = InfraFold(POLICY, {}, {state.key: replace(after, open=False)}, {}, {})
    assert not _consequence(shut, state.key, "TrainingJobHang", "P0", 5)


def test_a_teams_hardware_alerts_count_no_node_and_keep_no_incident_open() -> None:
    """Issue 43: a team's rules can raise hardware alerts for any node (prometheus-operator
    gives each its namespace). Only trusted evidence counts towards an element's threshold
    or folds into its incident; a team's alert stays in its own job's incident (its own
    card), and one that never resolves keeps no element's incident open. Failed before:
    the forged alerts made an incident of leaf-7, and the team's alert was folded into the
    open one (no card of its own) and kept it open."""
    nodes = ("n0", "n1", "n2", "n3")
    topology = from_settings(
        TopologySettings.model_validate(
            {"levels": ["leaf_switch"], "nodes": {n: {"leaf_switch": "leaf-7"} for n in nodes}}
        )
    )
    forged = [fire(0, labels=labels(n, "team-a"), fingerprint=n).alert for n in nodes]
    assert sightings(forged, topology, POLICY) == {}, "the team's alerts count no node"
    cluster = [fire(0, labels=labels(n), fingerprint=f"c{n}").alert for n in nodes]
    assert sightings([*forged, *cluster], topology, POLICY)["leaf_switch=leaf-7"].nodes == set(
        nodes
    )

    run = Run()
    run(fire(0, labels=labels("n0"), fingerprint="a", alert_id=1), 0)
    assert run.infra["leaf_switch=leaf-7"].open
    run(fire(1, labels=labels("n3", "team-a"), fingerprint="t", alert_id=3), 1)
    state = run.infra["leaf_switch=leaf-7"]
    assert set(state.firing) == {"a"} and "n3" not in state.nodes, "not folded"
    assert ("alert", "firing") in run.events(), "the team's alert has its own card"
    run(resolve(5, 0, fingerprint="a", alert_id=1, labels=labels("n0")), 5)
    assert not run.infra["leaf_switch=leaf-7"].open, "the team's alert keeps it open no more"
    assert run.events()[-1] == ("infra", "infra_resolved")


def test_the_cards_words_say_what_they_count_once() -> None:
    """Issue 44, "Words that are right", on the e2e run's cards: the reason said "8 nodes
    ... reported hardware faults within 12s" (they had come over 100 s) and then the likely
    cause, which the card's last line says again; the card raised to P0 said "opened" again;
    the job's notice said the job "lost nodes" and that "its hardware alerts" (the cluster's)
    were followed, with bare counts "(5 nodes, 1 job)"; and the footer of a card tied to no
    alert read "alert ?"."""
    p1 = {**labels("n0"), "device": "mlx5_0", "port": "1"}
    state = replace(InfraState.new("leaf_switch", "leaf-7"), open=True, episode="e")
    fold = InfraFold(POLICY, PLACE, {state.key: state}, SEEN, {"namespace": "team-a"})
    alert = fire(1, labels=p1, fingerprint="a", alert_id=1).alert
    fold.fold_firing(alert, 1, classify(alert, POLICY, distinct_nodes_in_window=1), at(1))
    p0 = {**p1, "alertname": "IBPhysicalLinkDown", "priority": "P0", "node": "n1"}
    alert = fire(2, labels=p0, fingerprint="b", alert_id=2).alert
    fold.fold_firing(alert, 2, classify(alert, POLICY, distinct_nodes_in_window=1), at(2))
    assert _consequence(fold, state.key, "TrainingJobOnFaultyNode", "P3", 3)
    by_kind = {m.kind.value: m.payload for m in fold.messages}
    page, notice = by_kind["infra_page"], by_kind["infra_job_notice"]
    summary = page["annotations"]["summary"]
    assert summary == (
        "Infrastructure incident at leaf_switch leaf-7 raised to P0: hardware alerts on "
        "3 nodes of 1 job"
    ), summary
    assert page["reason"] == (
        "Hardware alerts on 3 nodes under leaf_switch leaf-7; 3 within 120 s make one incident."
    )
    said = notice["annotations"]["summary"]
    assert said.startswith("team-a/llm is hit by the failure at leaf_switch leaf-7: "), said
    assert "(so far: hardware alerts on 3 nodes, 1 job hit)" in said, said
    for payload in (page, notice):
        drawn = str(build_card("infra", parse_payload(dict(payload))))
        assert drawn.count("the switch or its cabling") == 1, drawn
        assert "alert ?" not in drawn and "GPU" not in drawn, drawn
    assert "alert 2" in str(build_card("infra", parse_payload(dict(page)))), "the page's alert"
    drawn = str(build_card("infra", parse_payload(dict(notice))))
    assert "infrastructure incident leaf_switch=leaf-7" in drawn, drawn
