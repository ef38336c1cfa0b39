"""Infrastructure incidents in the pure policy (gateway/policy/infra.py through `decide` and
`decide_tick`): a flapping alert's held resolve stays folded when the timer releases it,
and the incident still closes when its alerts resolve."""

from __future__ import annotations

from trainsentry.alerts import AlertChange, NotificationDraft
from trainsentry.gateway.policy.decide import decide, decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.infra import InfraFold, InfraState, Sighting
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import StormState

from .factory import at, fire, resolve

POLICY = load_policy()
PLACE = {"leaf_switch": "leaf-7"}
SEEN = {"leaf_switch=leaf-7": Sighting(frozenset({"n0", "n1", "n2"}), frozenset({"team-a/llm"}))}


def labels(node: str) -> dict[str, str]:
    return {"alertname": "IBLinkFlapping", "node": node, "component": "fabric", "priority": "P1"}


class Run:
    """Feeds changes through `decide` as the planner does, keeping every state."""

    def __init__(self) -> None:
        self.fps: dict[str, FingerprintState] = {}
        self.storm: StormState | None = None
        self.infra: dict[str, InfraState] = {}
        self.drafts: list[NotificationDraft] = []

    def __call__(self, change: AlertChange, now: float) -> None:
        fold = InfraFold(POLICY, PLACE, self.infra, SEEN, change.alert.labels)
        result = decide(
            change,
            fingerprint_state=self.fps.get(change.alert.fingerprint),
            storm_state=self.storm,
            distinct_nodes_in_window=1,
            policy=POLICY,
            now=at(now),
            channels={"feishu", "phone"},
            place=PLACE,
            infra=fold,
        )
        self.fps[change.alert.fingerprint] = result.fingerprint_state
        self.storm = result.storm_state
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
        run(resolve(t, t - 10, fingerprint="a", alert_id=1), t)
        run(fire(t + 5, labels=labels("n0"), fingerprint="a", alert_id=1), t + 5)
        t += 10
    run(resolve(t, t - 5, fingerprint="a", alert_id=1), t)
    assert run.fps["a"].hold_until is not None, "the last resolve is held (flapping)"
    run.tick(t + POLICY.dedup.flap_hold + 1)  # the timer releases it
    assert [e for e in run.events() if e[0] == "alert"] == [], "no card of its own, ever"
    assert run.infra["leaf_switch=leaf-7"].open, "b still fires"
    run(resolve(t + 700, 1, fingerprint="b", alert_id=2), t + 700)
    assert run.events()[-1] == ("infra", "infra_resolved")
    assert not run.infra["leaf_switch=leaf-7"].open
    assert run.events().count(("infra", "infra_opened")) == 1
