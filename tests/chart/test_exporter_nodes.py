"""The exporter DaemonSets run exactly on the nodes the operator labels for them.

The operator (trainsentry/operator/nodes.py) labels a node per exporter its claiming jobs
want, so a job with `spec.exporters.dcgm: false` gets no dcgm-exporter on its nodes. The
labels come from the operator's own code here, never retyped, so the chart and the operator
cannot drift apart unnoticed.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from chart.chart_helm import Manifest, one, rendered, template
from trainsentry.operator.nodes import EXPORTER_LABEL_PREFIX, EXPORTERS, labels_for
from trainsentry.operator.spec import Exporters

# Which TrainingJob exporter flags each DaemonSet of the chart serves: node-exporter carries
# the InfiniBand collector, so a job wanting only `infiniband` needs it too.
DAEMONSETS = {
    "-dcgm-exporter": {"dcgm"},
    "-node-exporter": {"node", "infiniband"},
}


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A NodeSelectorTerm (its matchExpressions are ANDed) against a node's labels."""
    assert not term.get("matchFields"), "matchFields are not modelled here"
    for expr in term.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        elif op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        else:
            pytest.fail(f"operator {op} not modelled")
        if not ok:
            return False
    return True


def schedules_on(daemonset: Manifest, labels: Mapping[str, str]) -> bool:
    """Whether the scheduler may place the DaemonSet's pod on a node with these labels
    (nodeSelector AND any one of the required node-affinity terms)."""
    pod = daemonset["spec"]["template"]["spec"]
    selector = pod.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    required = (
        (pod.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution")
    )
    if required is None:
        return True
    return any(_term_matches(term, labels) for term in required["nodeSelectorTerms"])


def test_every_exporter_a_job_can_ask_for_has_a_daemonset() -> None:
    assert set(EXPORTERS) == set(Exporters.model_fields)
    assert set().union(*DAEMONSETS.values()) == set(EXPORTERS)


WANTED = [
    frozenset(combo)
    for n in range(len(EXPORTERS) + 1)
    for combo in itertools.combinations(EXPORTERS, n)
]


@pytest.mark.parametrize("values", ["defaults", "everything-on"])
@pytest.mark.parametrize("suffix", sorted(DAEMONSETS))
@pytest.mark.parametrize("wanted", WANTED, ids=lambda w: "+".join(sorted(w)) or "none")
def test_daemonset_runs_where_the_operator_labels_its_exporter(
    values: str, suffix: str, wanted: frozenset[str]
) -> None:
    """A node claimed by a job wanting `wanted` carries labels_for(...) (the operator's
    function); the DaemonSet must run there exactly when it serves one of them."""
    daemonset = one(rendered(values), "DaemonSet", suffix)
    node_labels = {
        "kubernetes.io/hostname": "gpu-1",
        **labels_for({"job-uid": sorted(wanted)}),
    }
    expected = bool(DAEMONSETS[suffix] & wanted)
    assert schedules_on(daemonset, node_labels) is expected, node_labels


@pytest.mark.parametrize("suffix", sorted(DAEMONSETS))
def test_daemonset_stays_off_unclaimed_nodes(suffix: str) -> None:
    daemonset = one(rendered("defaults"), "DaemonSet", suffix)
    assert not schedules_on(daemonset, {})
    assert not schedules_on(daemonset, {"kubernetes.io/hostname": "cpu-1"})


def test_dcgm_exporter_selects_the_operators_dcgm_label() -> None:
    """The exact key/value the operator writes (nodes.py), not a look-alike."""
    pod = one(rendered("defaults"), "DaemonSet", "-dcgm-exporter")["spec"]["template"]["spec"]
    written = labels_for({"uid": ["dcgm"]})
    assert pod["nodeSelector"] == {
        key: value for key, value in written.items() if key.startswith(EXPORTER_LABEL_PREFIX)
    }


def test_exporters_node_selector_overrides_the_operator_labels(tmp_path: Path) -> None:
    """exporters.nodeSelector, when set, places every exporter DaemonSet instead."""
    selector = {"pool": "gpu"}
    objs = template(overrides={"exporters": {"nodeSelector": selector}}, tmp=tmp_path)
    for suffix in DAEMONSETS:
        daemonset = one(objs, "DaemonSet", suffix)
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == selector
        assert schedules_on(daemonset, selector)
        assert not schedules_on(daemonset, labels_for({"uid": list(EXPORTERS)}))
