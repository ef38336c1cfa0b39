"""The cordon decisions (gateway/policy/cordon.py), pure, with the time as a parameter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainsentry.alerts import Alert, AlertStatus
from trainsentry.config.remediation import CordonSettings
from trainsentry.gateway.policy.cordon import (
    NodeDecision,
    Status,
    blocked,
    candidates,
    counted_faults,
    share_nodes,
)
from trainsentry.gateway.policy.rules import load_policy

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
POLICY = load_policy()
SETTINGS = CordonSettings(threshold=15, max_job_share=0.5, max_per_hour=2)


def fell(node: str, days_ago: float, job: str | None = None, namespace: str = "ml") -> Alert:
    """`GPUFellOffBus` of `node` as the chart's cluster-wide rule raises it (no namespace:
    trusted evidence), or with `job` as a job's rule in `namespace` raises it."""
    labels = {"alertname": "GPUFellOffBus", "node": node}
    if job is not None:
        labels |= {"namespace": namespace, "trainingjob": job}
    return Alert(
        fingerprint=f"{node}-{days_ago}-{job}",
        status=AlertStatus.FIRING,
        labels=labels,
        annotations={},
        starts_at=NOW - timedelta(days=days_ago),
        ends_at=None,
    )


LEMON = [fell("n17", 0.1), fell("n17", 0.2), fell("n17", 0.3)]


def test_a_teams_own_hardware_alerts_recommend_no_cordon() -> None:
    """Issue 43: a team's rules can raise `GPUFellOffBus{node=...}` for any node (and
    Prometheus confirms they fired: its rule did fire them); only trusted evidence counts,
    so a team cannot get another team's node cordoned. Failed before: n17 recommended."""
    forged = [fell("n17", d, "decoy", namespace="team-a") for d in (0.1, 0.2, 0.3, 0.4, 0.5)]
    assert candidates(forged, POLICY, SETTINGS, {}, NOW) == []
    assert counted_faults(forged, POLICY, {}, NOW) == []
    [found] = candidates([*forged, *LEMON], POLICY, SETTINGS, {}, NOW)
    assert found.health.faults == {"fell_off_bus": 3}, "the cluster's own faults alone"


def test_the_threshold_and_decay_decide_and_a_decision_resets_the_count() -> None:
    [found] = candidates([*LEMON, fell("n17", 0.1, "big")], POLICY, SETTINGS, {}, NOW)
    assert found.health.node == "n17" and found.jobs == ("ml/big",), "its job's copy names it"
    # a week later the same faults weigh half: below the threshold
    assert candidates(LEMON, POLICY, SETTINGS, {}, NOW + timedelta(days=7)) == []
    # recommended or cordoned: never again; dismissed: only faults after the dismissal count
    for status in Status:
        decided = {"n17": NodeDecision(status, NOW - timedelta(hours=1))}
        assert candidates(LEMON, POLICY, SETTINGS, decided, NOW) == []
    old = {"n17": NodeDecision(Status.DISMISSED, NOW - timedelta(days=1))}
    assert [c.health.node for c in candidates(LEMON, POLICY, SETTINGS, old, NOW)] == ["n17"]
    off = CordonSettings(cordon="off", threshold=15)
    assert candidates(LEMON, POLICY, off, {}, NOW) == []


def test_the_jobs_on_a_node_are_the_clusters() -> None:
    listed = {"ml/big": ["n0", "n1", "n2", "n3"], "ml/small": ["n0", "n9"], "ml/empty": []}
    # listed jobs count with exactly their listed nodes, whatever the alerts name
    assert share_nodes("n0", listed, []) == {
        "ml/big": {"n0", "n1", "n2", "n3"},
        "ml/small": {"n0", "n9"},
    }
    assert share_nodes("n1", listed, ["ml/small"]) == {"ml/big": {"n0", "n1", "n2", "n3"}}
    # a job the alerts name that the cluster lists no nodes for: the node alone (1 of 1)
    assert share_nodes("n5", listed, ["ml/ghost", "ml/empty"]) == {
        "ml/ghost": {"n5"},
        "ml/empty": {"n5"},
    }
    # jobs not read at all: refused, unless any share is allowed
    reason = blocked("n5", SETTINGS, {}, None, NOW, automatic=False)
    assert reason is not None and "could not be listed" in reason
    assert blocked("n5", CordonSettings(max_job_share=1), {}, None, NOW, automatic=False) is None


def test_the_guards() -> None:
    listed = {"ml/big": ["n0", "n1", "n2", "n3"], "ml/small": ["n0"]}
    jobs = {**share_nodes("n0", listed, []), **share_nodes("n3", listed, [])}
    assert jobs == {"ml/big": {"n0", "n1", "n2", "n3"}, "ml/small": {"n0"}}
    # share: n0 is small's only node
    reason = blocked("n0", SETTINGS, {}, jobs, NOW, automatic=False)
    assert reason is not None and "ml/small" in reason
    assert blocked("n1", SETTINGS, {}, jobs, NOW, automatic=False) is None
    # big has 4 nodes: a second cordon is half of it (allowed), a third is not
    one = {"n1": NodeDecision(Status.CORDONED, NOW - timedelta(days=2))}
    assert blocked("n2", SETTINGS, one, jobs, NOW, automatic=False) is None
    two = {**one, "n2": NodeDecision(Status.CORDONED, NOW - timedelta(days=2))}
    reason = blocked("n3", SETTINGS, two, jobs, NOW, automatic=False)
    assert reason is not None and "3 of its 4 nodes" in reason
    # rate: two cordons within the hour; an hour later the limit is free again
    recent = {
        "x1": NodeDecision(Status.CORDONED, NOW - timedelta(minutes=10)),
        "x2": NodeDecision(Status.CORDONED, NOW - timedelta(minutes=50)),
    }
    reason = blocked("n1", SETTINGS, recent, jobs, NOW, automatic=False)
    assert reason is not None and "max_per_hour" in reason
    later = NOW + timedelta(minutes=11)
    assert blocked("n1", SETTINGS, recent, jobs, later, automatic=False) is None
    # an infrastructure incident stops only the automatic cordon
    covered = ["leaf_switch=leaf-7"]
    reason = blocked("n1", SETTINGS, {}, jobs, NOW, automatic=True, incident_elements=covered)
    assert reason is not None and "leaf-7" in reason
    assert (
        blocked("n1", SETTINGS, {}, jobs, NOW, automatic=False, incident_elements=covered) is None
    )
