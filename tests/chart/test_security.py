"""Security defaults on every pod, and NetworkPolicies that leave only the intended paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chart.chart_helm import NAMESPACE, VALUES_SETS, find, one, pod_specs, rendered, template
from chart.netpol import Pod, allowed, workload_pod

# dcgm-exporter runs as root to reach the kubelet's root-owned pod-resources socket
# (docs/deploy.md); it still gets no capabilities, no privilege escalation, no host namespaces.
ROOT_ALLOWED = ("-dcgm-exporter",)


def _workloads(values: str) -> list[tuple[str, dict[str, Any]]]:
    specs = list(pod_specs(rendered(values)))
    assert specs
    return specs


@pytest.mark.parametrize("values", VALUES_SETS)
def test_every_container_is_locked_down(values: str) -> None:
    for name, pod in _workloads(values):
        pod_ctx = pod.get("securityContext", {})
        assert pod_ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        assert not pod.get("hostPID") and not pod.get("hostIPC"), name
        as_root = name.endswith(ROOT_ALLOWED)
        if not as_root:
            assert pod_ctx.get("runAsNonRoot") is True and pod_ctx.get("runAsUser", 0) > 0, name
        for container in pod.get("initContainers", []) + pod["containers"]:
            ctx = container["securityContext"]
            where = f"{name}/{container['name']}"
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx.get("privileged", False) is False, where
            assert ctx["capabilities"]["drop"] == ["ALL"], where
            added = set(ctx["capabilities"].get("add", []))
            assert added <= ({"SYS_ADMIN"} if as_root else set()), where
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where


@pytest.mark.parametrize("values", VALUES_SETS)
def test_host_paths_are_read_only_and_few(values: str) -> None:
    for name, pod in _workloads(values):
        host_volumes = {
            v["name"]: v["hostPath"]["path"] for v in pod.get("volumes", []) if "hostPath" in v
        }
        if "exporter" not in name:
            assert not host_volumes, name
            assert not pod.get("hostNetwork"), name
            continue
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] in host_volumes:
                    assert mount.get("readOnly") is True, f"{name}: {mount}"


def test_capabilities_are_added_only_on_request() -> None:
    dcgm = one(rendered("defaults"), "DaemonSet", "-dcgm-exporter")
    assert (
        "add"
        not in dcgm["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
    )


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


def _policies_for(objs: Any, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [p for p in find(objs, "NetworkPolicy") if _selects(p, labels)]


@pytest.mark.parametrize("values", ["defaults", "ha-postgres", "everything-on"])
def test_every_pod_off_the_host_network_is_covered_by_a_network_policy(values: str) -> None:
    objs = rendered(values)
    for obj in objs:
        if obj["kind"] not in ("Deployment", "DaemonSet", "CronJob"):
            continue
        spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
        if spec["template"]["spec"].get("hostNetwork"):
            continue
        labels = spec["template"]["metadata"]["labels"]
        assert _policies_for(objs, labels), f"no NetworkPolicy selects {obj['metadata']['name']}"


def _peers(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return [peer for rule in policy["spec"].get("ingress", []) for peer in rule["from"]]


def pod_of(obj: dict[str, Any], namespace: str = NAMESPACE) -> Pod:
    return workload_pod(obj, namespace)


ALERTMANAGER = Pod("monitoring", {"app.kubernetes.io/name": "alertmanager"})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
JOBS_HERE = {"trainsentry.io/trainingjobs": "true"}  # the operator's namespace label
TRAINING = Pod("team-a", {"trainsentry.io/trainingjob": "llama", "job": "llama"}, JOBS_HERE)
UNLABELLED = Pod("team-a", {"job": "llama"}, JOBS_HERE)
INGRESS = Pod("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (ALERTMANAGER, True),
        (PROMETHEUS, True),
        (TRAINING, True),  # hang triggers, from a namespace holding a TrainingJob
        (Pod("other-team", {"trainsentry.io/trainingjob": "x"}, JOBS_HERE), True),
        # Issue 43 finding 8: a pod labelling itself, in a namespace holding no TrainingJob
        # (kube-system included), was let through.
        (Pod("kube-system", {"trainsentry.io/trainingjob": "x"}), False),
        (Pod("no-jobs-here", {"trainsentry.io/trainingjob": "x"}), False),
        (UNLABELLED, False),
        (INGRESS, False),  # only through networkPolicy.gatewayExtraFrom
        (Pod("monitoring", {"app.kubernetes.io/name": "grafana"}), False),
        (Pod(NAMESPACE, {"app.kubernetes.io/component": "report"}), False),
    ],
)
def test_the_gateway_takes_alertmanager_prometheus_and_labelled_training_pods_only(
    source: Pod, expected: bool
) -> None:
    objs = rendered("defaults")
    policies = find(objs, "NetworkPolicy")
    gateway = pod_of(one(objs, "Deployment", "-gateway"))
    port = one(objs, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in port["ports"]}
    assert allowed(policies, source, gateway, ports["http"]) is expected
    # the trigger port: the training pods only
    training = expected and source not in (ALERTMANAGER, PROMETHEUS)
    assert allowed(policies, source, gateway, ports["triggers"]) is training
    assert not allowed(policies, source, gateway, 9999)  # no other port, for anyone


def test_with_operator_namespaces_hang_triggers_come_from_those_only() -> None:
    objs = rendered("operator-namespaces")  # operator.namespaces: [team-a, team-b]
    gateway = pod_of(one(objs, "Deployment", "-gateway"))
    policies = find(objs, "NetworkPolicy")
    labelled = {"trainsentry.io/trainingjob": "x"}
    assert allowed(policies, Pod("team-b", labelled), gateway, 9095)
    assert not allowed(policies, Pod("team-c", labelled, JOBS_HERE), gateway, 9095)


def test_extra_peers_reach_the_gateway_when_listed() -> None:
    objs = rendered("everything-on")  # gatewayExtraFrom: the ingress-nginx namespace
    gateway = pod_of(one(objs, "Deployment", "-gateway"))
    assert allowed(find(objs, "NetworkPolicy"), INGRESS, gateway, 9095)


def test_operator_takes_only_its_webhook_port_and_report_nothing(tmp_path: Path) -> None:
    objs = rendered("defaults")
    policies = find(objs, "NetworkPolicy")
    operator = one(objs, "Deployment", "-operator")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    apiserver = Pod("", ip="10.0.0.1")  # the control plane: no pod selector names it
    assert allowed(policies, apiserver, pod_of(operator), ports["webhook"])
    assert not allowed(policies, TRAINING, pod_of(operator), ports["health"])
    report = pod_of(one(objs, "CronJob", "-report"))
    assert not allowed(policies, PROMETHEUS, report, 9095)
    values = {"operator": {"webhook": {"enabled": False}}}
    off = find(template("defaults", values, tmp_path), "NetworkPolicy")
    assert not allowed(off, apiserver, pod_of(operator), ports["webhook"])
    # networkPolicy.apiServer: the webhook port from those addresses only.
    only = {"networkPolicy": {"apiServer": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]}}
    (tmp_path / "narrowed").mkdir()
    narrowed = find(template("defaults", only, tmp_path / "narrowed"), "NetworkPolicy")
    assert allowed(narrowed, apiserver, pod_of(operator), ports["webhook"])
    assert not allowed(narrowed, Pod("", ip="10.0.0.2"), pod_of(operator), ports["webhook"])
    assert not allowed(narrowed, TRAINING, pod_of(operator), ports["webhook"])


def test_exporters_admit_only_prometheus() -> None:
    objs = rendered("everything-on")  # node-exporter off the host network there
    for suffix in ("-dcgm-exporter", "-node-exporter"):
        ds = one(objs, "DaemonSet", suffix)
        (policy,) = _policies_for(objs, ds["spec"]["template"]["metadata"]["labels"])
        apps = [p["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for p in _peers(policy)]
        assert apps == ["prometheus"]


def test_secrets_stay_out_of_config_maps_and_env_values() -> None:
    objs = rendered("everything-on")
    secret_values = [
        "s3cret",
        "app-s3cret",
        "mail-s3cret",
        "given-webhook-token",
        "trainsentry:secret@",
    ]
    for cm in find(objs, "ConfigMap"):
        text = str(cm["data"])
        assert not [s for s in secret_values if s in text], cm["metadata"]["name"]
    for name, pod in pod_specs(objs):
        for container in pod["containers"]:
            env = {e["name"]: e for e in container.get("env", [])}
            for var in ("TRAINSENTRY_WEBHOOK_TOKEN", "TRAINSENTRY_API_TOKEN", "TRAINSENTRY_DB"):
                if var in env:  # the DB URL of PostgreSQL holds a password
                    assert "secretKeyRef" in env[var].get("valueFrom", {}), f"{name}: {var}"
            values = " ".join(str(e.get("value", "")) for e in env.values())
            assert not [s for s in secret_values if s in values], name
