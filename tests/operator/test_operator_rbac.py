"""The operator watching named namespaces needs no cluster-wide write: every API call it makes
through a TrainingJob's whole life is allowed by the RBAC the chart renders for
`operator.namespaces` (a Role in each watched namespace, a ClusterRole with Nodes only), and
the same writes elsewhere (kube-system ConfigMaps) are not (issue 19, item 14).

RBAC is evaluated here as Kubernetes does (rbac.authorization.k8s.io/v1): a ClusterRole
bound by a ClusterRoleBinding applies to every namespace and to cluster-scoped resources; a
Role bound by a RoleBinding only inside its own namespace; a rule matches when its
apiGroups, resources (`resource/subresource`) and verbs hold the request's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
from chart.chart_helm import template
from operator_harness import NS, TJ, OperatorThread, declare_cluster, delete, node, patch, pod, post
from operator_harness import trainingjob as make_trainingjob

from tests.support.eventually import eventually
from tests.support.kube_emulator import KubeEmulator
from trainsentry.operator.reconcile import Sources

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
SERVICE_ACCOUNT = ("trainsentry", "ts-trainsentry-operator")  # chart_helm's release "ts"

Request = tuple[str, str, str, str | None]  # verb, group, resource[/sub], namespace


def _matches(rule: dict[str, Any], verb: str, group: str, resource: str) -> bool:
    return (
        group in rule["apiGroups"]
        and resource in rule["resources"]
        and verb in rule["verbs"]
        and "resourceNames" not in rule  # the calls here are checked without a name
    )


def operator_rbac(objs: list[dict[str, Any]]) -> tuple[list[Any], dict[str, list[Any]]]:
    """The rules bound to the operator's ServiceAccount: cluster-wide, and per namespace."""
    namespace, account = SERVICE_ACCOUNT
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objs}
    cluster_rules: list[Any] = []
    namespaced: dict[str, list[Any]] = {}
    for binding in objs:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if subject not in binding.get("subjects", []):
            continue
        ref = binding["roleRef"]
        if binding["kind"] == "ClusterRoleBinding":
            cluster_rules += roles[("ClusterRole", None, ref["name"])]["rules"]
        else:
            ns = binding["metadata"]["namespace"]
            role_ns = None if ref["kind"] == "ClusterRole" else ns
            namespaced.setdefault(ns, []).extend(
                roles[(ref["kind"], role_ns, ref["name"])]["rules"]
            )
    return cluster_rules, namespaced


def allowed(rbac: tuple[list[Any], dict[str, list[Any]]], request: Request) -> bool:
    verb, group, resource, namespace = request
    cluster_rules, namespaced = rbac
    rules = cluster_rules + (namespaced.get(namespace, []) if namespace else [])
    return any(_matches(rule, verb, group, resource) for rule in rules)


def operator_requests(emu: KubeEmulator) -> set[Request]:
    requests = set()
    for call, agent, namespace in zip(emu.calls, emu.agents, emu.namespaces, strict=True):
        if agent.startswith("kmock/"):
            continue  # the test's own requests
        resource = call.resource + (f"/{call.subresource}" if call.subresource else "")
        requests.add((call.verb, call.group, resource, namespace))
    return requests


async def test_namespaced_operator_runs_on_namespaced_rbac(
    sources: Sources, tmp_path: Path
) -> None:
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu)
        running = OperatorThread(str(emu.url).rstrip("/"), sources, namespaces=[NS])
        await running.start(emu)
        try:
            for index, name in enumerate(["gpu-1", "gpu-2"]):
                await post(emu, "/api/v1/nodes", node(name))
                await post(emu, f"/api/v1/namespaces/{NS}/pods", pod(f"llm-{index}", "llm", name))
            await post(emu, TJ_PATH, make_trainingjob("llm"))
            await eventually(
                lambda: (
                    (emu.get_live(TJ, NS, "llm") or {}).get("status", {}).get("phase")
                    == "Monitoring"
                )
            )
            await eventually(
                lambda: emu.get_live("v1/configmaps", NS, "llm-trainsentry-dashboards") is not None
            )
            # dashboard off: the ConfigMap is deleted; then the job goes and frees its nodes
            await patch(emu, f"{TJ_PATH}/llm", {"spec": {"dashboard": {"enabled": False}}})
            await eventually(
                lambda: emu.get_live("v1/configmaps", NS, "llm-trainsentry-dashboards") is None
            )
            await delete(emu, f"{TJ_PATH}/llm")
            await eventually(lambda: emu.get_live(TJ, NS, "llm") is None)
        finally:
            await running.stop()
        requests = operator_requests(emu)

    rbac = operator_rbac(list(template("defaults", {"operator": {"namespaces": [NS]}}, tmp_path)))
    denied = sorted((r for r in requests if not allowed(rbac, r)), key=str)
    assert not denied, f"the namespaced operator made calls its RBAC refuses: {denied}"
    verbs = {(verb, resource) for verb, _, resource, _ in requests}
    # the life above did write each kind of child, node and status
    assert {("create", "configmaps"), ("delete", "configmaps"), ("patch", "nodes")} <= verbs
    assert {("create", "prometheusrules"), ("patch", "trainingjobs/status")} <= verbs
    # nothing namespaced is granted outside the watched namespace
    for verb, group, resource in [
        ("create", "", "configmaps"),
        ("patch", "", "configmaps"),
        ("delete", "", "configmaps"),
        ("create", "monitoring.coreos.com", "prometheusrules"),
        ("patch", "trainsentry.io", "trainingjobs/status"),
    ]:
        assert not allowed(rbac, (verb, group, resource, "kube-system"))
        assert not allowed(rbac, (verb, group, resource, None))  # all namespaces at once
        assert allowed(rbac, (verb, group, resource, NS))
    # Nodes are cluster-scoped: RBAC can only grant them cluster-wide (docs/deploy.md)
    assert allowed(rbac, ("patch", "", "nodes", None))


OPERATOR_NS = SERVICE_ACCOUNT[0]  # the release namespace: the chart's dashboards go there


async def test_all_namespaces_operator_runs_on_the_default_rbac(
    cluster: KubeEmulator, sources: Sources, tmp_path: Path
) -> None:
    """The default install (every namespace watched) keeps the jobs' dashboards in its own
    namespace, so its RBAC grants no ConfigMap write anywhere else (issue 19, item 14):
    through a job's whole life every call is allowed by the chart's default ClusterRole and
    Role, and ConfigMap writes in the job's namespace or kube-system are refused."""
    emu = cluster
    mine = Sources(sources.rule_files, sources.dashboards, dashboards_namespace=OPERATOR_NS)
    name = f"{NS}.llm-trainsentry-dashboards"
    running = OperatorThread(str(emu.url).rstrip("/"), mine)
    await running.start(emu)
    try:
        for index, node_name in enumerate(["gpu-1", "gpu-2"]):
            await post(emu, "/api/v1/nodes", node(node_name))
            await post(emu, f"/api/v1/namespaces/{NS}/pods", pod(f"llm-{index}", "llm", node_name))
        await post(emu, TJ_PATH, make_trainingjob("llm"))
        await eventually(
            lambda: (
                (emu.get_live(TJ, NS, "llm") or {}).get("status", {}).get("phase") == "Monitoring"
            )
        )
        await eventually(lambda: emu.get_live("v1/configmaps", OPERATOR_NS, name) is not None)
        dashboards = emu.get_live("v1/configmaps", OPERATOR_NS, name)
        assert emu.get_live("v1/configmaps", NS, "llm-trainsentry-dashboards") is None
        labels = dashboards["metadata"]["labels"]
        assert labels["grafana_dashboard"] == "1"
        assert labels["trainsentry.io/trainingjob-namespace"] == NS
        assert labels["trainsentry.io/trainingjob"] == "llm"
        assert not dashboards["metadata"].get("ownerReferences")  # none across namespaces
        children = emu.get_live(TJ, NS, "llm")["status"]["children"]
        assert {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": name,
            "namespace": OPERATOR_NS,
        } in (children)
        # dashboard off: deleted; on again: back; the job deleted: deleted with it
        await patch(emu, f"{TJ_PATH}/llm", {"spec": {"dashboard": {"enabled": False}}})
        await eventually(lambda: emu.get_live("v1/configmaps", OPERATOR_NS, name) is None)
        await patch(emu, f"{TJ_PATH}/llm", {"spec": {"dashboard": {"enabled": True}}})
        await eventually(lambda: emu.get_live("v1/configmaps", OPERATOR_NS, name) is not None)
        await delete(emu, f"{TJ_PATH}/llm")
        await eventually(lambda: emu.get_live(TJ, NS, "llm") is None)
        assert emu.get_live("v1/configmaps", OPERATOR_NS, name) is None
    finally:
        await running.stop()
    requests = operator_requests(emu)

    rbac = operator_rbac(list(template("defaults", None, tmp_path)))
    denied = sorted((r for r in requests if not allowed(rbac, r)), key=str)
    assert not denied, f"the operator made calls the default RBAC refuses: {denied}"
    configmaps = {(verb, namespace) for verb, _, resource, namespace in requests
                  if resource == "configmaps"}  # fmt: skip
    assert {("create", OPERATOR_NS), ("delete", OPERATOR_NS)} <= configmaps
    assert {namespace for _, namespace in configmaps} == {OPERATOR_NS}
    for verb in ("create", "patch", "delete"):
        assert allowed(rbac, (verb, "", "configmaps", OPERATOR_NS))
        for elsewhere in (NS, "kube-system", None):
            assert not allowed(rbac, (verb, "", "configmaps", elsewhere))
    # what is still cluster-wide in this mode: the job's other children, next to the job
    assert allowed(rbac, ("create", "monitoring.coreos.com", "prometheusrules", NS))
    assert allowed(rbac, ("patch", "", "nodes", None))
