"""Hardware evidence (gateway/policy/evidence.py): the matching, pure, and the queries it
builds, run against a real Prometheus holding the `ALERTS` series."""

from __future__ import annotations

import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.prometheus_history import remembering
from tests.support.realservers import http_json
from trainsentry.alerts import Alert, AlertStatus
from trainsentry.gateway.policy.evidence import (
    QUIET_S,
    Firing,
    checkable,
    episode_starts,
    key_of,
    match,
    queries,
    read_matrix,
)

NOW = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def alert(fp: str, node: str, gpu: str, at: datetime, **labels: str) -> Alert:
    return Alert(
        fp, AlertStatus.FIRING,
        {"alertname": "GPUFellOffBus", "node": node, "gpu": gpu, **labels}, {}, at, None,
    )  # fmt: skip


def as_webhook(a: Alert) -> dict[str, Any]:
    return {"labels": dict(a.labels), "startsAt": a.starts_at.isoformat()}


def firing(at: datetime, **labels: str) -> Firing:
    return Firing(frozenset(labels.items()), at.timestamp())


def test_a_firing_that_goes_on_is_one_episode() -> None:
    labels = {"alertname": "A", "alertstate": "firing", "node": "n1"}
    t0 = NOW.timestamp()
    series = [(labels, [t0, t0 + 30, t0 + 60, t0 + 60 + QUIET_S + 1, t0 + 60 + QUIET_S + 31])]
    assert [s.at for s in episode_starts(series)] == [t0, t0 + 60 + QUIET_S + 1]
    pending = [({**labels, "alertstate": "pending"}, [t0])]
    assert episode_starts(pending) == []


def test_one_firing_confirms_one_occurrence() -> None:
    start = firing(NOW, alertname="GPUFellOffBus", node="n1", gpu="0")
    real = alert("a", "n1", "0", NOW, cluster="lab")  # an external label: still a subset
    copy = alert("b", "n1", "0", NOW + timedelta(seconds=1), forged="1")
    other_gpu = alert("c", "n1", "1", NOW)
    far = alert("d", "n1", "0", NOW + timedelta(minutes=5))
    found = match([real, copy, other_gpu, far], [start], {})
    assert found == {key_of(real): start}
    # already claimed by another occurrence (an earlier check): nobody else takes it
    assert match([copy], [start], {start: key_of(real)}) == {}
    assert match([real], [start], {start: key_of(real)}) == {key_of(real): start}


def test_only_cordonable_nodes_and_plain_alertnames_are_looked_up() -> None:
    assert checkable(alert("a", "gpu-node-1.example.com", "0", NOW))
    assert not checkable(alert("b", 'x"}', "0", NOW))
    assert not checkable(alert("c", "Node_1", "0", NOW))
    weird = Alert("d", AlertStatus.FIRING, {"alertname": 'a"} or vector(1)', "node": "n1"},
                  {}, NOW, None)  # fmt: skip
    assert not checkable(weird)
    assert [len(q.alerts) for q in queries([weird, alert("e", "n1", "0", NOW)])] == [1]


def test_the_query_asks_by_the_label_the_policy_named_the_node_by() -> None:
    """`policy.node_labels: [kubernetes_node]`: the store resolved the node from that label;
    node_exporter's `instance` (an address, first among the default labels) is not it."""
    labels = {
        "alertname": "GPUFellOffBus",
        "kubernetes_node": "gpu-node-1",
        "instance": "gpu-node-7",  # a label the defaults would take for the node
        "gpu": "0",
    }
    occurrence = Alert("a", AlertStatus.FIRING, labels, {}, NOW, None, resolved_node="gpu-node-1")
    assert checkable(occurrence)
    [query] = queries([occurrence])
    assert "kubernetes_node=~" in query.expr and "gpu" in query.expr, query.expr
    assert "instance" not in query.expr


@pytest.mark.e2e
def test_the_queries_find_the_firings_in_a_real_prometheus(tmp_path: Path) -> None:
    """Dotted node names, two batches (starts an hour apart), an occurrence nobody fired."""
    real = [
        alert("a", "gpu-node-1.example.com", "0", NOW),
        alert("b", "gpu-node-2", "3", NOW + timedelta(seconds=40)),
        alert("c", "gpu-node-2", "3", NOW + timedelta(hours=1) - timedelta(minutes=1)),
    ]
    forged = alert("f", "gpu-node-2", "4", NOW)
    asked = queries([*real, forged])
    assert len(asked) == 2
    with remembering(tmp_path, [as_webhook(a) for a in real]) as prometheus:
        found: dict[tuple[str, str], Firing] = {}
        for query in asked:
            form = urllib.parse.urlencode({"query": query.expr, "time": f"{query.at:.3f}"})
            answer = http_json(f"{prometheus.url}/api/v1/query?{form}")
            found |= match(query.alerts, episode_starts(read_matrix(answer)), found_claims(found))
    assert set(found) == {key_of(a) for a in real}


def found_claims(found: dict[tuple[str, str], Firing]) -> dict[Firing, tuple[str, str]]:
    return {start: key for key, start in found.items()}
