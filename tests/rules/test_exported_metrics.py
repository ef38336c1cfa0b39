"""Every metric a shipped rule reads is one an exporter the chart deploys serves (issue 44).

A rule that reads a name no exporter serves never fires, and its promtool test, fed the same
wrong name, still passes: `IBReceiveErrors` read `node_infiniband_port_receive_errors_total`
where node_exporter serves `node_infiniband_port_errors_received_total`. The names served
are kept in tests/rules/exported_metrics/*.txt, each file saying where its list came from
(node_exporter's collector sources, kube-state-metrics' metric docs, Prometheus' own
series); dcgm-exporter's are the counters CSV the chart mounts; the probe's and the
gateway's are what their registries serve (and their lists are checked to be current).
The rules read are the chart's (rules/*.yaml, rules/self/*.yaml) and the operator's
rendering of them for a TrainingJob.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.rules.promql_names import metric_names
from trainsentry.assets import rules_dir
from trainsentry.gateway.metrics import GatewayMetrics, PolicyMetrics
from trainsentry.operator.reconcile import load_sources
from trainsentry.operator.render import render_children
from trainsentry.operator.spec import JobIdentity, TrainingJobSpec
from trainsentry.probe.metrics import ProbeMetrics

LISTS = Path(__file__).parent / "exported_metrics"
JOB = JobIdentity(name="llama-70b", namespace="team-a", uid="44444444-1111-4222-8333-944445555666")
SPEC = TrainingJobSpec.model_validate({"workloadRef": {"kind": "PyTorchJob", "name": "llama-70b"}})


def _listed(name: str) -> set[str]:
    lines = (LISTS / name).read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def _dcgm_csv() -> set[str]:
    lines = [
        line
        for line in (rules_dir() / "dcgm-counters.csv").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return {row[0] for row in csv.reader(lines, skipinitialspace=True)}


def _served(registry: CollectorRegistry) -> set[str]:
    """The sample names a prometheus_client registry serves (text exposition)."""
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names |= {f"{family.name}_total", f"{family.name}_created"}
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count", "created")}
        else:
            names.add(family.name)
    return names


def _probe() -> set[str]:
    return _served(ProbeMetrics({"namespace": "n", "trainingjob": "j"}, world_size=8).registry)


def _gateway() -> set[str]:
    registry = CollectorRegistry()
    GatewayMetrics(registry)
    PolicyMetrics(registry)
    return _served(registry)


def _rule_groups() -> dict[str, list[dict[str, Any]]]:
    """Source -> rule groups: the chart's rule files and the operator's job rendering."""
    found = {}
    for path in [*sorted(rules_dir().glob("*.yaml")), *sorted(rules_dir().glob("self/*.yaml"))]:
        document = yaml.safe_load(path.read_text())
        if isinstance(document, dict) and "groups" in document:
            found[str(path.relative_to(rules_dir()))] = document["groups"]
    sources = load_sources(rules_dir(), Path("/nonexistent"))
    rendered = render_children(JOB, SPEC, sources.rule_files, (), [])
    rule = next(m for m in rendered.manifests if m["kind"] == "PrometheusRule")
    found["operator job rules"] = rule["spec"]["groups"]
    return found


def _read_and_recorded() -> tuple[dict[str, set[str]], set[str]]:
    read: dict[str, set[str]] = {}
    recorded = set()
    for source, groups in _rule_groups().items():
        for group in groups:
            for rule in group["rules"]:
                label = f"{source}: {rule.get('alert') or rule.get('record')}"
                for name in metric_names(str(rule["expr"])):
                    read.setdefault(name, set()).add(label)
                if "record" in rule:
                    recorded.add(rule["record"])
    return read, recorded


def served_names() -> set[str]:
    return (
        _listed("node_exporter.txt")
        | _listed("kube_state_metrics.txt")
        | _listed("prometheus.txt")
        | _listed("dcgm_exporter_aliases.txt")
        | _listed("probe.txt")
        | _listed("gateway.txt")
        | _dcgm_csv()
    )


def test_every_metric_a_shipped_rule_reads_is_served_by_a_deployed_exporter() -> None:
    read, recorded = _read_and_recorded()
    assert len(read) > 60, "the rules were read"
    missing = {
        name: sorted(where) for name, where in read.items() if name not in served_names() | recorded
    }
    assert missing == {}, "rules read metrics no deployed exporter serves"


def test_the_fabric_rules_read_node_exporters_infiniband_names() -> None:
    read, _ = _read_and_recorded()
    assert "node_infiniband_port_errors_received_total" in read
    assert "node_infiniband_port_discards_transmitted_total" in read


@pytest.mark.parametrize(("listed", "serves"), [("probe.txt", _probe), ("gateway.txt", _gateway)])
def test_our_own_lists_are_what_our_exporters_serve(listed: str, serves: Any) -> None:
    assert _listed(listed) == serves(), f"regenerate tests/rules/exported_metrics/{listed}"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (node) (rate(a_total{x="b{c}"}[5m] offset 1h)) > on(node) group_left(y) b:rec',
         {"a_total", "b:rec"}),
        ('absent(up{job="x"}) or {__name__="w"} unless max_over_time(q[1d:5m]) * 1e3',
         {"up", "w", "q"}),
        ("vector(1) and bool 2", set()),
    ],
)  # fmt: skip
def test_metric_names_of_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
