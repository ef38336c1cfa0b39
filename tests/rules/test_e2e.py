"""End to end on real parts: fixture exporter -> Prometheus (the rules, rendered for one
TrainingJob as the operator does) -> Alertmanager (the shipped routes and inhibit rules) ->
the real gateway process; plus every dashboard query against that Prometheus.

One stack per module (about 15 s to start and settle).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rules import fixture_exporter as fx
from rules.jobscope import membership_group, render_for_job
from tests.support.gateway_process import start_gateway
from tests.support.realservers import (
    REPO_MODULE_ENV,
    RunningServer,
    http_json,
    logs_on_error,
    repo_module_argv,
    start_alertmanager,
    start_prometheus,
    start_server,
    wait_for,
)
from trainsentry.assets import dashboards_dir, rules_dir

pytestmark = pytest.mark.e2e

TOKEN = "rules-e2e-token"
RULE_FILES = ("gpu.yaml", "fabric.yaml", "node.yaml", "kubernetes.yaml")
NODE1, NODE2 = fx.NODES
FAULTS = {
    "xid": [{"node": NODE1, "gpu": "3", "code": 79}],
    "ib_down": [{"node": NODE2, "device": "mlx5_1", "port": "1"}],
    "gpu_temp": [{"node": NODE2, "gpu": "0", "celsius": 97}],
}
# alertname -> (priority, identifying labels) expected at the gateway
EXPECTED = {
    "GPUFellOffBus": ("P0", {"node": NODE1, "gpu": "3", "xid": "79"}),
    "IBPhysicalLinkDown": ("P0", {"node": NODE2, "device": "mlx5_1", "port": "1"}),
    "GPUTemperatureCritical": ("P1", {"node": NODE2, "gpu": "0"}),
}
# A scrape that times out on a loaded CI machine must not fire these within the test.
SLOW_FOR = {"DCGMExporterDown": "5m", "NodeExporterDown": "5m"}
# Firing in Prometheus, suppressed by rules/alertmanager-inhibit.yaml.
INHIBITED = {"IBPortNotActive", "GPUTemperatureHigh"}


@dataclass
class Stack:
    exporter: RunningServer
    gateway: RunningServer
    alertmanager: RunningServer
    prometheus: RunningServer

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        answer = http_json(url)
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def firing_in_prometheus(self) -> set[str]:
        return {r["metric"]["alertname"] for r in self.query('ALERTS{alertstate="firing"}')}

    def gateway_alerts(self) -> list[dict[str, Any]]:
        url = f"{self.gateway.url}/api/v1/alerts?status=firing"
        items: list[dict[str, Any]] = http_json(url, token=TOKEN)["items"]
        return items

    def inject_faults(self) -> None:
        http_json(f"{self.exporter.url}/faults", FAULTS)


def alertmanager_config(gateway_url: str) -> dict[str, Any]:
    """The shipped snippet, with the receiver pointed at the test gateway and waits cut to 1 s."""
    config: dict[str, Any] = yaml.safe_load((rules_dir() / "alertmanager-inhibit.yaml").read_text())
    webhook = config["receivers"][0]["webhook_configs"][0]
    webhook["url"] = f"{gateway_url}/api/v1/alertmanager"
    webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials": TOKEN}}
    for route in [config["route"], *config["route"].get("routes", [])]:
        route.update(group_wait="1s", group_interval="1s")
    return config


def prometheus_config(exporter: str, alertmanager: str, gateway: str) -> dict[str, Any]:
    def per_node(kind: str) -> list[dict[str, Any]]:
        return [
            {
                "targets": [exporter],
                "labels": {"node": n, "__metrics_path__": f"/{kind}/{n}/metrics"},
            }
            for n in fx.NODES
        ]

    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": "dcgm-exporter", "static_configs": per_node("dcgm")},
            {"job_name": "node-exporter", "static_configs": per_node("node")},
            {
                "job_name": "kube-state-metrics",
                "honor_labels": True,
                "metrics_path": "/ksm/metrics",
                "static_configs": [{"targets": [exporter]}],
            },
            {
                "job_name": "trainsentry-probe",
                "honor_labels": True,
                "metrics_path": "/probe/metrics",
                "static_configs": [{"targets": [exporter]}],
            },
            {"job_name": "trainsentry-gateway", "static_configs": [{"targets": [gateway]}]},
        ],
    }


def _cut_for(document: dict[str, Any]) -> dict[str, Any]:
    """`for:` cut to 1 s, except the exporter-down alerts (SLOW_FOR)."""
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" in rule and "for" in rule:
                rule["for"] = SLOW_FOR.get(rule["alert"], "1s")
    return document


def job_rule_files(directory: Path) -> list[Path]:
    """The rule files as installed: the chart's cluster-wide `rules/*.yaml` and what the
    operator renders for TrainingJob team-a/llm (its pod rules; it tunes no node rule, so
    the cluster-wide hardware rules alone cover its nodes: docs/alerts.md "Job scope");
    `for:` cut to 1 s, except the exporter-down alerts."""
    paths = []
    for name in RULE_FILES:
        document = yaml.safe_load((rules_dir() / name).read_text())
        cluster = directory / f"cluster-{name}"
        cluster.write_text(yaml.safe_dump(_cut_for(copy.deepcopy(document)), sort_keys=False))
        rendered = render_for_job(document, fx.NAMESPACE, fx.JOB)
        path = directory / f"{fx.JOB}-{name}"
        path.write_text(yaml.safe_dump(_cut_for(rendered), sort_keys=False))
        paths += [cluster, path]
    membership = directory / "membership.yaml"
    group = membership_group(fx.NAMESPACE, fx.JOB, f"{fx.JOB}-worker-.*")
    membership.write_text(yaml.safe_dump({"groups": [group]}, sort_keys=False))
    return [membership, *paths]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("rules-e2e")
    with contextlib.ExitStack() as servers:
        exporter = servers.enter_context(
            start_server(
                tmp,
                "exporter",
                lambda port, _wd: repo_module_argv(
                    "tests.rules.fixture_exporter", "--port", str(port)
                ),
                env=REPO_MODULE_ENV,
            )
        )
        gateway = servers.enter_context(
            start_gateway(tmp, f"sqlite:///{tmp / 'gateway.db'}", token=TOKEN)
        )
        alertmanager = servers.enter_context(
            start_alertmanager(tmp, alertmanager_config(gateway.url))
        )
        rule_dir = tmp / "rendered"
        rule_dir.mkdir()
        prometheus = servers.enter_context(
            start_prometheus(
                tmp,
                prometheus_config(exporter.address, alertmanager.address, gateway.address),
                job_rule_files(rule_dir),
            )
        )
        built = Stack(exporter, gateway, alertmanager, prometheus)
        with logs_on_error(prometheus, alertmanager, gateway, exporter):
            wait_for(lambda: len(built.query("up == 1")) == 7, 30, "all seven targets up")
            wait_for(
                lambda: len(built.query("trainsentry:job_node:info")) == 2,
                30,
                "membership recording rules",
            )
        yield built


def test_healthy_cluster_is_quiet_then_faults_reach_the_gateway(stack: Stack) -> None:
    with logs_on_error(stack.prometheus, stack.alertmanager, stack.gateway):
        # Healthy: after several evaluations with 1 s `for:` windows nothing fires.
        time.sleep(4)
        assert stack.firing_in_prometheus() == set()
        assert stack.gateway_alerts() == []

        stack.inject_faults()

        def arrived() -> list[dict[str, Any]] | None:
            items = stack.gateway_alerts()
            names = {i["labels"]["alertname"] for i in items}
            return items if set(EXPECTED) <= names else None

        wait_for(arrived, 45, f"{sorted(EXPECTED)} at the gateway")
        # Inhibited alerts fire in Prometheus but must never reach the gateway.
        wait_for(lambda: stack.firing_in_prometheus() >= INHIBITED, 15, "inhibited alerts firing")
        time.sleep(3)
        items = stack.gateway_alerts()
        by_name = {i["labels"]["alertname"]: i for i in items}
        assert set(by_name) == set(EXPECTED), sorted(by_name)
        for name, (priority, labels) in EXPECTED.items():
            item = by_name[name]
            assert item["priority"] == priority, (name, item["priority"])
            assert item["status"] == "firing"
            assert item["labels"]["priority"] == priority
            # the cluster-wide rule's alert (trusted evidence); the job has no copy of it
            assert "namespace" not in item["labels"] and "trainingjob" not in item["labels"]
            for key, value in labels.items():
                assert item["labels"][key] == value, (name, key)


_VARIABLE_QUERY = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")


def _substitute(expr: str) -> str:
    values = {
        "$namespace": fx.NAMESPACE,
        "$job": fx.JOB,
        "$node": ".*",
        "$instance": ".*",
        "$__rate_interval": "1m",
    }
    for name, value in values.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def _dashboard_exprs(board: dict[str, Any]) -> list[tuple[str, str]]:
    found = [
        (f"panel {p['title']!r}", t["expr"]) for p in board["panels"] for t in p.get("targets", [])
    ]
    found += [(f"annotation {a['name']!r}", a["expr"]) for a in board["annotations"]["list"]]
    return found


@pytest.mark.parametrize(
    "dashboard", ["cluster-health.json", "trainingjob.json", "trainsentry-gateway.json"]
)
def test_every_dashboard_query_returns_data(stack: Stack, dashboard: str) -> None:
    board = json.loads((dashboards_dir() / dashboard).read_text())
    # alert panels and annotations need firing alerts on the job's nodes: the cluster-wide
    # hardware alerts (the job has no copy of them), joined to the job's membership
    stack.inject_faults()
    on_job_nodes = (
        'ALERTS{alertstate="firing", namespace=""} * on(node) group_left(namespace, trainingjob)'
        f' trainsentry:job_node:info{{trainingjob="{fx.JOB}"}}'
    )
    wait_for(lambda: stack.query(on_job_nodes), 45, "hardware alerts on the job's nodes firing")
    # The gateway's panels have data once its first notifications went out and were scraped.
    wait_for(
        lambda: stack.query("trainsentry_notifications_sent_total"), 45, "gateway sends scraped"
    )
    empty = []
    for where, expr in _dashboard_exprs(board):
        if not stack.query(_substitute(expr)):
            empty.append((where, expr))
    assert empty == [], empty
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = _VARIABLE_QUERY.match(variable["query"]["query"])
        assert match, variable["query"]
        series = stack.query(_substitute(match["selector"]))
        values = {s["metric"].get(match["label"]) for s in series} - {None}
        assert values, variable["name"]
