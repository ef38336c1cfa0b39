"""Issue 43 finding 1 on real parts: the real Alertmanager with the shipped
rules/alertmanager-inhibit.yaml (the file the chart's AlertmanagerConfig is made from) in
front of the real gateway process. Alerts are posted to Alertmanager's API with the labels
Prometheus would give them on a cluster set up as docs/alerts.md "Trusted evidence" says:
a team's own PrometheusRule's alert carries its namespace (prometheus-operator's
`enforcedNamespaceLabel`), the chart's cluster-wide rules' alerts carry none.

Team-a's decoy `KubeNodeNotReady{namespace="team-a", node="gpu-node-17", priority="P3"}`
must not mute team-b's `GPUFellOffBus` P0 on that node; the cluster-wide one still does, and
a job's own NotReady still mutes its own job's GPU alerts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.gateway_process import start_gateway
from tests.support.realservers import (
    RunningServer,
    http_json,
    logs_on_error,
    start_alertmanager,
    wait_for,
)
from trainsentry.assets import rules_dir

pytestmark = pytest.mark.e2e
TOKEN = "inhibit-tenancy-token"
NODE = "gpu-node-17"


def alertmanager_config(gateway_url: str) -> dict[str, Any]:
    """The shipped snippet, the receiver pointed at the gateway, waits cut to 1 s."""
    config: dict[str, Any] = yaml.safe_load((rules_dir() / "alertmanager-inhibit.yaml").read_text())
    webhook = config["receivers"][0]["webhook_configs"][0]
    webhook["url"] = f"{gateway_url}/api/v1/alertmanager"
    webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials": TOKEN}}
    for route in [config["route"], *config["route"].get("routes", [])]:
        route.update(group_wait="1s", group_interval="1s")
    return config


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, ...]]:
    tmp: Path = tmp_path_factory.mktemp("inhibit-tenancy")
    with contextlib.ExitStack() as stack:
        gateway = stack.enter_context(
            start_gateway(tmp, f"sqlite:///{tmp / 'gateway.db'}", token=TOKEN)
        )
        alertmanager = stack.enter_context(
            start_alertmanager(tmp, alertmanager_config(gateway.url))
        )
        yield gateway, alertmanager


def post(alertmanager: RunningServer, *alerts: dict[str, str]) -> None:
    """Fires `alerts` (label sets) in Alertmanager, as Prometheus does."""
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    body = [{"labels": labels, "startsAt": now, "annotations": {}} for labels in alerts]
    http_json(f"{alertmanager.url}/api/v2/alerts", body)


def at_gateway(gateway: RunningServer, name: str, namespace: str) -> bool:
    items = http_json(f"{gateway.url}/api/v1/alerts?status=firing", token=TOKEN)["items"]
    return any(
        i["labels"]["alertname"] == name and i["labels"].get("namespace", "") == namespace
        for i in items
    )


def inhibited(alertmanager: RunningServer, name: str, namespace: str) -> bool:
    """Alertmanager's own word: the alert is active in it and suppressed by inhibition."""
    for alert in http_json(f"{alertmanager.url}/api/v2/alerts"):
        labels = alert["labels"]
        if labels["alertname"] == name and labels.get("namespace", "") == namespace:
            return bool(alert["status"]["inhibitedBy"])
    raise AssertionError(f"{name} of {namespace!r} is not in Alertmanager")


def gpu(namespace: str, job: str, node: str = NODE) -> dict[str, str]:
    labels = {
        "alertname": "GPUFellOffBus",
        "priority": "P0",
        "component": "gpu",
        "node": node,
        "gpu": "3",
        "xid": "79",
    }
    return {**labels, "namespace": namespace, "trainingjob": job} if namespace else labels


def not_ready(namespace: str, job: str, node: str = NODE, **extra: str) -> dict[str, str]:
    labels = {"alertname": "KubeNodeNotReady", "component": "kubernetes", "node": node}
    scoped = {**labels, "namespace": namespace, "trainingjob": job} if namespace else labels
    return {"priority": "P0", **scoped, **extra}


def test_a_teams_decoy_mutes_no_other_teams_p0(servers: tuple[RunningServer, ...]) -> None:
    gateway, alertmanager = servers
    with logs_on_error(gateway, alertmanager):
        post(alertmanager, not_ready("team-a", "decoy", priority="P3"))
        wait_for(lambda: at_gateway(gateway, "KubeNodeNotReady", "team-a"), 20, "the decoy")
        post(alertmanager, gpu("team-b", "llm"))
        wait_for(lambda: at_gateway(gateway, "GPUFellOffBus", "team-b"), 20, "team-b's P0")
        assert not inhibited(alertmanager, "GPUFellOffBus", "team-b")


def test_trusted_cluster_wide_evidence_and_a_jobs_own_still_inhibit(
    servers: tuple[RunningServer, ...],
) -> None:
    gateway, alertmanager = servers
    other = "gpu-node-18"
    with logs_on_error(gateway, alertmanager):
        # the chart's cluster-wide NotReady (no namespace) mutes every job's GPU alert there
        post(alertmanager, not_ready("", "", node=other))
        wait_for(lambda: at_gateway(gateway, "KubeNodeNotReady", ""), 20, "the trusted one")
        post(alertmanager, gpu("team-c", "llm", node=other))
        # a job's own NotReady mutes its own job's GPU alerts of the node
        third = "gpu-node-19"
        post(alertmanager, not_ready("team-d", "llm", node=third))
        wait_for(lambda: at_gateway(gateway, "KubeNodeNotReady", "team-d"), 20, "team-d's own")
        post(alertmanager, gpu("team-d", "llm", node=third))
        wait_for(
            lambda: (
                inhibited(alertmanager, "GPUFellOffBus", "team-c")
                and inhibited(alertmanager, "GPUFellOffBus", "team-d")
            ),
            20,
            "both GPU alerts inhibited",
        )
        time.sleep(3)  # several group intervals: an inhibited alert is never sent
        assert not at_gateway(gateway, "GPUFellOffBus", "team-c")
        assert not at_gateway(gateway, "GPUFellOffBus", "team-d")
