"""The operator end to end against the emulator: create, update, delete, shared nodes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from operator_harness import (
    MONITORS,
    NS,
    RULES,
    TJ,
    OperatorThread,
    delete,
    node,
    patch,
    pod,
    post,
    probe_ports,
    trainingjob,
)

from tests.support.eventually import eventually
from tests.support.kube_emulator import KubeEmulator
from trainsentry.operator.reconcile import Sources

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
POD_PATH = f"/api/v1/namespaces/{NS}/pods"


def live(emu: KubeEmulator, resource: str, name: str, ns: str | None = NS) -> dict[str, Any]:
    obj = emu.get_live(resource, ns, name)
    assert obj is not None, f"{resource} {name} does not exist"
    return obj


def node_labels(emu: KubeEmulator, name: str) -> dict[str, str]:
    labels: dict[str, str] = live(emu, "v1/nodes", name, None)["metadata"].get("labels") or {}
    return labels


def phase(emu: KubeEmulator, name: str) -> str | None:
    status = live(emu, TJ, name).get("status") or {}
    return status.get("phase")


async def seed(emu: KubeEmulator, job: str, nodes: list[str], running: int | None = None) -> None:
    for index, node_name in enumerate(nodes):
        if emu.get_live("v1/nodes", None, node_name) is None:
            await post(emu, "/api/v1/nodes", node(node_name))
        state = "Running" if running is None or index < running else "Pending"
        await post(emu, POD_PATH, pod(f"{job}-{index}", job, node_name, state))


@pytest.fixture
async def operator(cluster: KubeEmulator, sources: Sources) -> Any:
    running = OperatorThread(str(cluster.url).rstrip("/"), sources)
    await running.start(cluster)
    yield running
    await running.stop()


async def test_create_renders_valid_owned_children_and_status(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "llm", ["gpu-1", "gpu-2"])
    body = trainingjob(
        "llm",
        {
            "selector": {"matchLabels": {"job": "llm"}},
            "worldSize": 2,
            "prometheus": {"ruleLabels": {"release": "kps"}},
        },
    )
    job = await post(cluster, TJ_PATH, body)
    await eventually(lambda: phase(cluster, "llm") == "Monitoring")

    uid = job["metadata"]["uid"]
    rule = live(cluster, RULES, "llm-trainsentry")
    monitor = live(cluster, MONITORS, "llm-trainsentry-probe")
    dashboards = live(cluster, "v1/configmaps", "llm-trainsentry-dashboards")
    for child in (rule, monitor, dashboards):
        [ref] = child["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["controller"] is True and ref["kind"] == "TrainingJob"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    groups = {group["name"]: group for group in rule["spec"]["groups"]}
    # fixture-gpu holds node rules only, which the job does not tune: left to the
    # cluster-wide rules, not copied (docs/alerts.md "Job scope")
    assert set(groups) == {
        "trainsentry-membership-team-a-llm",
        "fixture-kubernetes-team-a-llm",
        "fixture-training-team-a-llm",
    }
    pod_regex = groups["trainsentry-membership-team-a-llm"]["rules"][0]["expr"]
    assert 'pod=~"llm\\\\-0|llm\\\\-1"' in pod_regex
    assert monitor["spec"]["selector"] == {"matchLabels": {"job": "llm"}}
    assert probe_ports(monitor) == [9401]

    status = live(cluster, TJ, "llm")["status"]
    assert status["ranks"] == {"expected": 2, "running": 2}
    assert status["nodes"] == ["gpu-1", "gpu-2"]
    assert status["observedGeneration"] == 1
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "RulesReady": "True",
        "ScrapeReady": "True",
        "ExportersReady": "True",
    }
    [rules] = [c for c in status["conditions"] if c["type"] == "RulesReady"]
    assert rules["message"] == (
        "2 alerting rules; 2 untuned node-level rules are not copied (the cluster-wide "
        "rules alert for the job's nodes)"
    )
    assert sorted(child["kind"] for child in status["children"]) == [
        "ConfigMap",
        "PodMonitor",
        "PrometheusRule",
    ]
    for name in ("gpu-1", "gpu-2"):
        assert node_labels(cluster, name) == {
            "zone": "a",
            "trainsentry.io/monitored": "true",
            "trainsentry.io/exporter-dcgm": "true",
            "trainsentry.io/exporter-infiniband": "true",
            "trainsentry.io/exporter-node": "true",
        }
    await eventually(
        lambda: (
            {e["reason"] for e in cluster.live("v1/events", NS)}
            >= {"ChildrenCreated", "NodesLabelled", "PhaseChanged"}
        )
    )
    assert cluster.validation.checked["PrometheusRule"] >= 1
    annotations = live(cluster, TJ, "llm")["metadata"]["annotations"]
    assert set(annotations) <= {
        "trainsentry.io/last-handled-configuration",  # kopf's own
        "trainsentry.io/kopf-managed",
    }
    assert live(cluster, TJ, "llm")["metadata"]["finalizers"] == ["trainsentry.io/finalizer"]


async def test_update_thresholds_changes_the_rule(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "llm", ["gpu-1"])
    await post(
        cluster,
        TJ_PATH,
        trainingjob(
            "llm",
            {"selector": {"matchLabels": {"job": "llm"}}, "thresholds": {"gpu_temp_celsius": 85}},
        ),
    )
    await eventually(lambda: phase(cluster, "llm") == "Monitoring")

    def gpu_rule() -> dict[str, Any]:
        groups = live(cluster, RULES, "llm-trainsentry")["spec"]["groups"]
        [group] = [g for g in groups if g["name"] == "fixture-gpu-team-a-llm"]
        [rule] = [r for r in group["rules"] if r["alert"] == "GPUTemperatureHigh"]
        return rule

    assert gpu_rule()["expr"].startswith("(DCGM_FI_DEV_GPU_TEMP > 85) * on(node)")
    await patch(
        cluster,
        f"{TJ_PATH}/llm",
        {
            "spec": {
                "thresholds": {"gpu_temp_celsius": 91.5},
                "alerting": {"priorityOverrides": {"GPUTemperatureHigh": "P1"}},
            }
        },
    )
    await eventually(lambda: "> 91.5)" in gpu_rule()["expr"])
    assert gpu_rule()["annotations"]["thresholds"] == "gpu_temp_celsius=91.5"
    assert gpu_rule()["labels"]["priority"] == "P1"
    await eventually(lambda: live(cluster, TJ, "llm")["status"]["observedGeneration"] == 2)

    await patch(
        cluster,
        f"{TJ_PATH}/llm",
        {"spec": {"probe": {"port": 9500}, "dashboard": {"enabled": False}}},
    )
    await eventually(
        lambda: probe_ports(live(cluster, MONITORS, "llm-trainsentry-probe")) == [9500]
    )
    await eventually(
        lambda: cluster.get_live("v1/configmaps", NS, "llm-trainsentry-dashboards") is None
    )
    await eventually(
        lambda: (
            [c["kind"] for c in live(cluster, TJ, "llm")["status"]["children"]]
            == ["PrometheusRule", "PodMonitor"]
        )
    )

    await patch(cluster, f"{TJ_PATH}/llm", {"spec": {"thresholds": {"no_such_threshold": 1}}})
    await eventually(
        lambda: (
            {c["type"]: c["reason"] for c in live(cluster, TJ, "llm")["status"]["conditions"]}[
                "RulesReady"
            ]
            == "UnknownThreshold"
        )
    )
    await eventually(
        lambda: any(e["reason"] == "UnknownThreshold" for e in cluster.live("v1/events", NS))
    )
    await asyncio.sleep(1.5)  # three resyncs: still one warning
    assert sum(e["reason"] == "UnknownThreshold" for e in cluster.live("v1/events", NS)) == 1
    assert phase(cluster, "llm") == "Monitoring"  # a typo does not hide the running job

    # untuned again: the job's copy of the node rule goes (the cluster-wide rule covers it)
    await patch(
        cluster,
        f"{TJ_PATH}/llm",
        {
            "spec": {
                "thresholds": {"gpu_temp_celsius": None, "no_such_threshold": None},
                "alerting": {"priorityOverrides": None},
            }
        },
    )
    await eventually(
        lambda: (
            "fixture-gpu-team-a-llm"
            not in {g["name"] for g in live(cluster, RULES, "llm-trainsentry")["spec"]["groups"]}
        )
    )


async def test_removed_prometheus_labels_leave_the_children(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "llm", ["gpu-1"])
    spec = {
        "selector": {"matchLabels": {"job": "llm"}},
        "prometheus": {"ruleLabels": {"release": "kps"}},
    }
    await post(cluster, TJ_PATH, trainingjob("llm", spec))
    await eventually(lambda: phase(cluster, "llm") == "Monitoring")
    rule_path = f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/prometheusrules/llm-trainsentry"
    await patch(cluster, rule_path, {"metadata": {"labels": {"team": "a"}}})  # someone else's

    def labels(resource: str, name: str) -> dict[str, str]:
        found: dict[str, str] = live(cluster, resource, name)["metadata"]["labels"]
        return found

    owned = {
        "app.kubernetes.io/managed-by": "trainsentry-operator",
        "trainsentry.io/trainingjob": "llm",
    }
    await patch(
        cluster,
        f"{TJ_PATH}/llm",
        {"spec": {"prometheus": {"ruleLabels": {"release": None, "prometheus": "team-a"}}}},
    )
    await eventually(lambda: labels(RULES, "llm-trainsentry").get("prometheus") == "team-a")
    assert labels(RULES, "llm-trainsentry") == {**owned, "prometheus": "team-a", "team": "a"}
    await eventually(
        lambda: labels(MONITORS, "llm-trainsentry-probe") == {**owned, "prometheus": "team-a"}
    )

    await patch(cluster, f"{TJ_PATH}/llm", {"spec": {"prometheus": {"monitorLabels": {"m": "1"}}}})
    await eventually(lambda: labels(MONITORS, "llm-trainsentry-probe") == {**owned, "m": "1"})
    await patch(cluster, f"{TJ_PATH}/llm", {"spec": {"prometheus": {"monitorLabels": None}}})
    await eventually(
        lambda: labels(MONITORS, "llm-trainsentry-probe") == {**owned, "prometheus": "team-a"}
    )
    assert labels(RULES, "llm-trainsentry") == {**owned, "prometheus": "team-a", "team": "a"}


async def test_delete_cleans_up_and_keeps_labels_of_shared_nodes(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "a", ["gpu-1", "gpu-2"])
    await seed(cluster, "b", ["gpu-2", "gpu-3"])
    await post(cluster, TJ_PATH, trainingjob("a"))
    await post(
        cluster,
        TJ_PATH,
        trainingjob("b", {"selector": {"matchLabels": {"job": "b"}}, "exporters": {"dcgm": False}}),
    )
    await eventually(lambda: phase(cluster, "a") == "Monitoring" == phase(cluster, "b"))
    assert "trainsentry.io/exporter-dcgm" not in node_labels(cluster, "gpu-3")
    assert node_labels(cluster, "gpu-2")["trainsentry.io/exporter-dcgm"] == "true"  # a wants it

    await delete(cluster, f"{TJ_PATH}/a")
    await eventually(lambda: cluster.get_live(TJ, NS, "a") is None)
    for gone in ("a-trainsentry", "a-trainsentry-probe"):
        assert cluster.get_live(RULES if gone.endswith("y") else MONITORS, NS, gone) is None
    assert cluster.get_live("v1/configmaps", NS, "a-trainsentry-dashboards") is None
    assert "trainsentry.io/monitored" not in node_labels(cluster, "gpu-1")
    shared = node_labels(cluster, "gpu-2")
    assert shared["trainsentry.io/monitored"] == "true"  # b still runs there
    assert "trainsentry.io/exporter-dcgm" not in shared  # only a wanted dcgm
    assert cluster.get_live(RULES, NS, "b-trainsentry") is not None

    await delete(cluster, f"{TJ_PATH}/b")
    await eventually(lambda: cluster.get_live(TJ, NS, "b") is None)
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        assert node_labels(cluster, name) == {"zone": "a"}
        annotations = live(cluster, "v1/nodes", name, None)["metadata"].get("annotations") or {}
        assert not annotations


async def test_pods_moving_nodes_and_finishing(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "m", ["gpu-1", "gpu-2"], running=1)
    await post(cluster, TJ_PATH, trainingjob("m"))
    await eventually(lambda: phase(cluster, "m") == "Degraded")  # 1 of 2 ranks running
    await patch(cluster, f"{POD_PATH}/m-1", {"status": {"phase": "Running"}})
    await eventually(lambda: phase(cluster, "m") == "Monitoring")
    await delete(cluster, f"{POD_PATH}/m-1")
    await post(cluster, "/api/v1/nodes", node("gpu-9"))
    await post(cluster, POD_PATH, pod("m-1", "m", "gpu-9"))
    await eventually(lambda: live(cluster, TJ, "m")["status"]["nodes"] == ["gpu-1", "gpu-9"])
    await eventually(lambda: "trainsentry.io/monitored" not in node_labels(cluster, "gpu-2"))
    for name in ("m-0", "m-1"):
        await patch(cluster, f"{POD_PATH}/{name}", {"status": {"phase": "Succeeded"}})
    await eventually(lambda: phase(cluster, "m") == "Completed")
    await eventually(lambda: live(cluster, TJ, "m")["status"]["nodes"] == [])
    assert "trainsentry.io/monitored" not in node_labels(cluster, "gpu-9")
