"""Idempotence and recovery: API faults, hand-deleted children, restarts, discovery, lastAlert."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kmock
import kopf
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration
from operator_harness import (
    MONITORS,
    NS,
    ROOT,
    RULES,
    TJ,
    OperatorThread,
    declare_cluster,
    delete,
    node,
    patch,
    pod,
    post,
    trainingjob,
)

from tests.support.dump_probes import addresses as probe_addresses
from tests.support.dump_probes import start_dump_probes
from tests.support.eventually import eventually
from tests.support.gateway_process import close_in_process
from tests.support.kube_emulator import KubeEmulator
from trainsentry.kube.client import Kube, KubeError, RetryPolicy
from trainsentry.kube.names import InvalidName
from trainsentry.operator.login import login_handler
from trainsentry.operator.nodes import CLAIM_PREFIX
from trainsentry.operator.reconcile import ClaimLedger, Sources, reconcile
from trainsentry.operator.status import patch_last_alert

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
POD_PATH = f"/api/v1/namespaces/{NS}/pods"
DATA = Path(__file__).resolve().parent / "data"


def status_of(emu: KubeEmulator, name: str) -> dict[str, Any]:
    obj = emu.get_live(TJ, NS, name)
    return (obj or {}).get("status") or {}


def labels_of(emu: KubeEmulator, name: str) -> dict[str, str]:
    obj = emu.get_live("v1/nodes", None, name) or {}
    return (obj.get("metadata") or {}).get("labels") or {}


async def seed(
    emu: KubeEmulator, job: str, nodes: list[str], labels: dict[str, str] | None = None
) -> None:
    for index, node_name in enumerate(nodes):
        if emu.get_live("v1/nodes", None, node_name) is None:
            await post(emu, "/api/v1/nodes", node(node_name))
        await post(emu, POD_PATH, pod(f"{job}-{index}", job, node_name, labels=labels))


@pytest.fixture
async def operator(cluster: KubeEmulator, sources: Sources) -> AsyncIterator[OperatorThread]:
    running = OperatorThread(str(cluster.url).rstrip("/"), sources)
    await running.start(cluster)
    yield running
    await running.stop()


async def test_api_errors_are_retried(cluster: KubeEmulator, operator: OperatorThread) -> None:
    await seed(cluster, "f", ["gpu-1", "gpu-2"])
    cluster.inject_fault("create", "prometheusrules", 500, times=3)
    cluster.inject_fault("create", "podmonitors", 429, times=2)
    cluster.inject_fault("patch", "nodes", 409, times=2)
    cluster.inject_fault("patch", "trainingjobs", 500, times=2, subresource="status")
    await post(cluster, TJ_PATH, trainingjob("f"))
    await eventually(lambda: status_of(cluster, "f").get("phase") == "Monitoring")
    assert all(fault.times == 0 for fault in cluster.faults)
    assert len(cluster.live(RULES, NS)) == 1 and len(cluster.live(MONITORS, NS)) == 1
    assert labels_of(cluster, "gpu-2")["trainsentry.io/monitored"] == "true"

    cluster.inject_fault("get", "prometheusrules", 500, times=50)  # outlasts one reconcile
    await eventually(
        lambda: any(e["reason"] == "ReconcileFailed" for e in cluster.live("v1/events", NS))
    )
    cluster.faults.clear()


async def test_hand_deleted_child_comes_back(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "h", ["gpu-1", "gpu-2"])
    await post(cluster, TJ_PATH, trainingjob("h"))
    await eventually(lambda: status_of(cluster, "h").get("phase") == "Monitoring")
    old = cluster.get_live(MONITORS, NS, "h-trainsentry-probe")
    assert old is not None
    await delete(
        cluster, f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors/h-trainsentry-probe"
    )
    await eventually(lambda: cluster.get_live(MONITORS, NS, "h-trainsentry-probe") is not None)
    new = cluster.get_live(MONITORS, NS, "h-trainsentry-probe")
    assert new is not None and new["metadata"]["uid"] != old["metadata"]["uid"]
    await patch(
        cluster,
        f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/prometheusrules/h-trainsentry",
        {"spec": {"groups": []}},
    )  # hand-edited
    await eventually(
        lambda: len(cluster.get_live(RULES, NS, "h-trainsentry")["spec"]["groups"]) == 3
    )
    dashboards = cluster.get_live("v1/configmaps", NS, "h-trainsentry-dashboards")
    assert dashboards is not None
    await patch(
        cluster,
        f"/api/v1/namespaces/{NS}/configmaps/h-trainsentry-dashboards",
        {"data": {"extra.json": "{}"}, "metadata": {"labels": {"team": "x"}}},
    )
    await eventually(
        lambda: (
            cluster.get_live("v1/configmaps", NS, "h-trainsentry-dashboards")["data"]
            == dashboards["data"]
        )
    )
    restored = cluster.get_live("v1/configmaps", NS, "h-trainsentry-dashboards")
    assert restored["metadata"]["labels"]["team"] == "x"  # foreign labels are left alone


def _kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: emu\n"
        f"clusters: [{{name: emu, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: tester, user: {token: not-a-secret}}]\n"
        "contexts: [{name: emu, context: {cluster: emu, user: tester}}]\n"
    )
    return path


def _start_cli(kubeconfig: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainsentry",
            "operator",
            "--kubeconfig",
            str(kubeconfig),
            "--resync",
            "0.5",
            "--rules-dir",
            str(DATA / "rules"),
            "--dashboards-dir",
            str(DATA / "dashboards"),
            *extra,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.e2e  # runs the operator as a process
async def test_restart_mid_reconcile_readopts_without_duplicates(
    cluster: KubeEmulator, tmp_path: Path
) -> None:
    """The real CLI process is killed while a reconcile is stuck half-way, then restarted."""
    kubeconfig = _kubeconfig(tmp_path, str(cluster.url).rstrip("/"))
    await seed(cluster, "r", ["gpu-1", "gpu-2"])
    cluster.inject_fault("create", "podmonitors", 500, times=10_000)  # stuck after the rule
    first = _start_cli(kubeconfig)
    try:
        await post(cluster, TJ_PATH, trainingjob("r"))
        await eventually(
            lambda: cluster.get_live(RULES, NS, "r-trainsentry") is not None, within=60
        )  # a cold interpreter start is slow on a busy machine
        await eventually(lambda: cluster.faults[0].times < 10_000 - 2)
    finally:
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait, 30)
    rule_uid = cluster.get_live(RULES, NS, "r-trainsentry")["metadata"]["uid"]
    assert cluster.get_live(MONITORS, NS, "r-trainsentry-probe") is None
    assert not status_of(cluster, "r")

    cluster.faults.clear()
    second = _start_cli(kubeconfig)
    try:
        await eventually(lambda: status_of(cluster, "r").get("phase") == "Monitoring", within=60)
    finally:
        second.send_signal(signal.SIGINT)
        _, stderr = await asyncio.to_thread(second.communicate, None, 30)
    assert second.returncode == 0, stderr.decode()[-2000:]
    assert cluster.get_live(RULES, NS, "r-trainsentry")["metadata"]["uid"] == rule_uid
    assert len(cluster.live(RULES, NS)) == 1 and len(cluster.live(MONITORS, NS)) == 1
    assert labels_of(cluster, "gpu-1")["trainsentry.io/monitored"] == "true"


@pytest.mark.e2e  # runs the operator as a process
async def test_context_option_points_the_whole_operator_at_that_cluster(
    cluster: KubeEmulator, tmp_path: Path
) -> None:
    """`--context staging` with another current-context: the operator watches and writes in
    staging only, and never calls the current-context cluster."""
    staging = str(cluster.url).rstrip("/")
    async with KubeEmulator() as other_emu, kmock.Server(other_emu):
        declare_cluster(other_emu)
        other = str(other_emu.url).rstrip("/")
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: current\n"
            f"clusters: [{{name: current, cluster: {{server: '{other}'}}}},"
            f" {{name: staging, cluster: {{server: '{staging}'}}}}]\n"
            "users: [{name: tester, user: {token: not-a-secret}}]\n"
            "contexts: [{name: current, context: {cluster: current, user: tester}},"
            " {name: staging, context: {cluster: staging, user: tester}}]\n"
        )
        await seed(cluster, "ctx", ["gpu-1", "gpu-2"])
        await post(cluster, TJ_PATH, trainingjob("ctx"))
        await seed(other_emu, "elsewhere", ["gpu-9"])
        await post(other_emu, TJ_PATH, trainingjob("elsewhere"))
        process = _start_cli(kubeconfig, "--context", "staging")
        try:
            await eventually(
                lambda: status_of(cluster, "ctx").get("phase") == "Monitoring", within=60
            )
        finally:
            process.send_signal(signal.SIGINT)
            _, stderr = await asyncio.to_thread(process.communicate, None, 30)
        assert process.returncode == 0, stderr.decode()[-2000:]
        assert other_emu.recorded_calls(exclude_agent="kmock/") == set()
        assert (other_emu.get_live(TJ, NS, "elsewhere") or {}).get("status") is None
    assert cluster.get_live(RULES, NS, "elsewhere-trainsentry") is None
    assert cluster.get_live(MONITORS, NS, "ctx-trainsentry-probe") is not None


async def test_login_handler_takes_the_chosen_contexts_server_and_credentials(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n"
        "clusters: [{name: a, cluster: {server: 'https://a.example:6443'}},"
        " {name: b, cluster: {server: 'https://b.example:6443', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: ua, user: {token: token-a}},"
        " {name: ub, user: {username: bob, password: pw}}]\n"
        "contexts: [{name: a, context: {cluster: a, user: ua}},"
        " {name: b, context: {cluster: b, user: ub}}]\n"
    )
    settings = kopf.OperatorSettings()
    chosen = await login_handler(str(kubeconfig), "b")(settings=settings)
    assert chosen.server == "https://b.example:6443" and chosen.insecure is True
    assert chosen.as_http_headers() == {"Authorization": "Basic Ym9iOnB3"}  # bob:pw
    current = await login_handler(str(kubeconfig), None)(settings=settings)
    assert current.server == "https://a.example:6443" and current.insecure is False
    assert current.as_http_headers() == {"Authorization": "Bearer token-a"}


def _claims(emu: KubeEmulator, node_name: str) -> list[str]:
    meta = (emu.get_live("v1/nodes", None, node_name) or {}).get("metadata") or {}
    return [key for key in meta.get("annotations") or {} if key.startswith(CLAIM_PREFIX)]


@pytest.mark.parametrize("same_process", [False, True])
async def test_claim_is_released_after_a_lost_status_write(
    cluster: KubeEmulator, sources: Sources, same_process: bool
) -> None:
    """gpu-1 is claimed, then the status write fails for good: a later reconcile finds the
    claim although the status never named gpu-1, and releases it once the pod has moved to
    gpu-2. A fresh process (no ledger kept) lists the nodes to find it; the same process
    knows it from its ClaimLedger and lists the nodes only once, at its start."""
    ledger = ClaimLedger() if same_process else None
    await seed(cluster, "lost", ["gpu-1"])
    await post(cluster, "/api/v1/nodes", node("gpu-2"))
    await post(cluster, TJ_PATH, trainingjob("lost"))
    cluster.inject_fault("patch", "trainingjobs", 500, times=100, subresource="status")
    config = Configuration(host=str(cluster.url).rstrip("/"))
    async with ApiClient(configuration=config) as api:
        kube = Kube(api, RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01))

        def emit(kind: str, reason: str, message: str) -> None:
            pass

        with pytest.raises(KubeError):
            await reconcile(kube, cluster.get_live(TJ, NS, "lost"), sources, emit, claims=ledger)
        assert _claims(cluster, "gpu-1") and not status_of(cluster, "lost")

        cluster.faults.clear()
        await delete(cluster, f"{POD_PATH}/lost-0")
        await post(cluster, POD_PATH, pod("lost-1", "lost", "gpu-2"))
        phase = await reconcile(
            kube, cluster.get_live(TJ, NS, "lost"), sources, emit, claims=ledger
        )
    assert phase and status_of(cluster, "lost")["nodes"] == ["gpu-2"]
    node_lists = [c for c in cluster.calls if c.verb == "list" and c.resource == "nodes"]
    assert len(node_lists) == (1 if same_process else 2)
    assert _claims(cluster, "gpu-2")
    assert not _claims(cluster, "gpu-1"), "the claim on gpu-1 leaked"
    assert "trainsentry.io/monitored" not in labels_of(cluster, "gpu-1")


async def test_restart_of_the_operator_thread_changes_nothing(
    cluster: KubeEmulator, sources: Sources
) -> None:
    await seed(cluster, "s", ["gpu-1", "gpu-2"])
    first = OperatorThread(str(cluster.url).rstrip("/"), sources, resync=30)
    await first.start(cluster)
    await post(cluster, TJ_PATH, trainingjob("s"))
    await eventually(lambda: status_of(cluster, "s").get("phase") == "Monitoring")
    await first.stop()
    versions = {
        res: cluster.get_live(res, NS, name)["metadata"]["resourceVersion"]
        for res, name in [
            (RULES, "s-trainsentry"),
            (MONITORS, "s-trainsentry-probe"),
            ("v1/configmaps", "s-trainsentry-dashboards"),
        ]
    }
    node_version = cluster.get_live("v1/nodes", None, "gpu-1")["metadata"]["resourceVersion"]
    second = OperatorThread(str(cluster.url).rstrip("/"), sources, resync=30)
    writes_before = len(cluster.calls)
    await second.start(cluster)
    await eventually(
        lambda: any(
            c.verb == "get" and c.resource == "configmaps" for c in cluster.calls[writes_before:]
        )
    )
    await asyncio.sleep(0.5)
    await second.stop()
    for res, version in versions.items():
        name = {RULES: "s-trainsentry", MONITORS: "s-trainsentry-probe"}.get(
            res, "s-trainsentry-dashboards"
        )
        assert cluster.get_live(res, NS, name)["metadata"]["resourceVersion"] == version
    assert (
        cluster.get_live("v1/nodes", None, "gpu-1")["metadata"]["resourceVersion"] == node_version
    )


async def test_discovery_of_annotated_pytorchjob(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    label = "training.kubeflow.org/job-name"
    await seed(cluster, "ptj", ["gpu-1", "gpu-2"], labels={label: "ptj"})
    base = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
    replicas = {"Master": {"replicas": 1}, "Worker": {"replicas": 1}}
    await post(
        cluster,
        base,
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "plain"},
            "spec": {"pytorchReplicaSpecs": replicas},
        },
    )
    ptj = await post(
        cluster,
        base,
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "ptj", "annotations": {"trainsentry.io/monitor": "true"}},
            "spec": {"nprocPerNode": "4", "pytorchReplicaSpecs": replicas},
        },
    )
    await eventually(lambda: status_of(cluster, "ptj").get("phase") == "Monitoring")
    job = cluster.get_live(TJ, NS, "ptj")
    assert job is not None and job["spec"]["worldSize"] == 8
    assert job["spec"]["workloadRef"] == {
        "kind": "PyTorchJob",
        "name": "ptj",
        "apiVersion": "kubeflow.org/v1",
    }
    assert job["metadata"]["ownerReferences"][0]["uid"] == ptj["metadata"]["uid"]
    assert status_of(cluster, "ptj")["ranks"] == {"expected": 8, "running": 8}  # 2 pods x 4
    assert cluster.get_live(TJ, NS, "plain") is None
    monitor = cluster.get_live(MONITORS, NS, "ptj-trainsentry-probe")
    assert monitor is not None and monitor["spec"]["selector"] == {"matchLabels": {label: "ptj"}}

    await delete(cluster, f"{base}/ptj")  # the TrainingJob goes by garbage collection
    await eventually(lambda: cluster.get_live(TJ, NS, "ptj") is None)
    await eventually(lambda: "trainsentry.io/monitored" not in labels_of(cluster, "gpu-1"))


async def test_last_alert_from_the_gateway_sets_the_phase(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    await seed(cluster, "g", ["gpu-1", "gpu-2"])
    await post(cluster, TJ_PATH, trainingjob("g"))
    await eventually(lambda: status_of(cluster, "g").get("phase") == "Monitoring")
    at = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    async with ApiClient(Configuration(host=str(cluster.url).rstrip("/"))) as api:
        assert await patch_last_alert(api, NS, "g", "CollectiveHang", "P0", at) is True
        await eventually(lambda: status_of(cluster, "g").get("phase") == "Hung")
        assert status_of(cluster, "g")["lastAlert"] == {
            "name": "CollectiveHang",
            "priority": "P0",
            "at": "2026-11-22T03:00:00Z",
            "status": "firing",
        }
        await patch_last_alert(api, NS, "g", "CollectiveHang", "P0", at, status="resolved")
        await eventually(lambda: status_of(cluster, "g").get("phase") == "Monitoring")
        await patch_last_alert(api, NS, "g", "GPUXidCritical", "P1", at)
        await eventually(lambda: status_of(cluster, "g").get("phase") == "Degraded")
        assert await patch_last_alert(api, NS, "nope", "X", "P3", at) is False
        # the job comes from alert labels: one that is no name is refused before a request
        # (the operator runs beside: only the paths these would have become are looked for)
        sent = len(cluster.requests)
        for namespace, name in ((NS, "../../../../../../api/v1/nodes/gpu-1"), ("..", "g")):
            with pytest.raises(InvalidName):
                await patch_last_alert(api, namespace, name, "X", "P3", at)
        astray = ("/api/v1/nodes/gpu-1/status", "/apis/trainsentry.io/v1alpha1/trainingjobs/g")
        assert not [p for p in cluster.sent_paths()[sent:] if p.startswith(astray)]
    assert status_of(cluster, "g")["ranks"] == {"expected": 2, "running": 2}


async def test_invalid_spec_is_reported_not_retried(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    # The API server's CEL rule would refuse this; the operator must cope if it gets one.
    await post(
        cluster,
        TJ_PATH,
        trainingjob(
            "bad",
            {
                "selector": {"matchLabels": {"job": "bad"}},
                "workloadRef": {"kind": "PyTorchJob", "name": "bad"},
            },
        ),
    )
    await eventually(lambda: status_of(cluster, "bad").get("conditions"))
    conditions = {
        c["type"]: (c["status"], c["reason"]) for c in status_of(cluster, "bad")["conditions"]
    }
    assert conditions == {
        kind: ("False", "InvalidSpec") for kind in ("RulesReady", "ScrapeReady", "ExportersReady")
    }
    assert status_of(cluster, "bad")["phase"] == "Pending"
    assert cluster.get_live(RULES, NS, "bad-trainsentry") is None
    await eventually(
        lambda: any(e["reason"] == "InvalidSpec" for e in cluster.live("v1/events", NS))
    )
    await asyncio.sleep(1.5)  # three resyncs
    assert sum(e["reason"] == "InvalidSpec" for e in cluster.live("v1/events", NS)) == 1


async def test_overlong_name_is_refused_and_reported(
    cluster: KubeEmulator, operator: OperatorThread
) -> None:
    name = "pretrain-" + "x" * 61  # 70 characters: a valid object name, too long for a label
    async with cluster.post(TJ_PATH, json=trainingjob(name)) as resp:
        assert resp.status == 422, await resp.text()  # the CRD bounds the name
    # An API server without that bound (the object predates the CRD upgrade): the operator
    # must report it once, not retry creating children the API server refuses forever.
    strict = cluster.validator
    assert strict is not None

    def without_name_bound(obj: dict[str, Any]) -> None:
        if obj.get("kind") == "TrainingJob":
            obj = {**obj, "metadata": {**obj["metadata"], "name": "short"}}
        strict(obj)

    cluster.validator = without_name_bound
    try:
        await seed(cluster, "long", ["gpu-1"])
        await post(
            cluster, TJ_PATH, trainingjob(name, {"selector": {"matchLabels": {"job": "long"}}})
        )
        await eventually(lambda: status_of(cluster, name).get("conditions"))
        assert status_of(cluster, name)["phase"] == "Pending"
        conditions = status_of(cluster, name)["conditions"]
        assert {c["reason"] for c in conditions} == {"InvalidName"}
        assert "63" in conditions[0]["message"]
        await asyncio.sleep(1.5)  # three resyncs
        reasons = [e["reason"] for e in cluster.live("v1/events", NS)]
        assert reasons.count("InvalidName") == 1 and "ReconcileFailed" not in reasons
        assert cluster.live(RULES, NS) == [] and labels_of(cluster, "gpu-1") == {"zone": "a"}
    finally:
        cluster.validator = strict


async def test_peering_mode_reconciles_and_needs_only_peering_calls(sources: Sources) -> None:
    """HA (`--peering`): kopf's peering works with our registry; it adds exactly list, watch
    and patch on clusterkopfpeerings (what the chart grants with operator.ha=true)."""
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu)
        emu.declare("kopf.dev/v1/clusterkopfpeerings", "ClusterKopfPeering", namespaced=False)
        await post(
            emu,
            "/apis/kopf.dev/v1/clusterkopfpeerings",
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "ClusterKopfPeering",
                "metadata": {"name": "trainsentry"},
            },
        )
        running = OperatorThread(str(emu.url).rstrip("/"), sources, peering="trainsentry")
        await running.start(emu)
        try:
            await seed(emu, "p", ["gpu-1", "gpu-2"])
            await post(emu, TJ_PATH, trainingjob("p"))
            await eventually(lambda: status_of(emu, "p").get("phase") == "Monitoring")
            await eventually(
                lambda: any(c.verb == "patch" and c.group == "kopf.dev" for c in emu.calls)
            )
        finally:
            await running.stop()
        peering = {
            (c.verb, c.resource)
            for c in emu.recorded_calls(exclude_agent="kmock/")
            if c.group == "kopf.dev"
        }
        assert peering == {
            ("list", "clusterkopfpeerings"),
            ("watch", "clusterkopfpeerings"),
            ("patch", "clusterkopfpeerings"),
        }


async def test_namespace_restricted_operator_ignores_other_namespaces(sources: Sources) -> None:
    """`--namespace team-a`: jobs elsewhere are not touched."""
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu, workloads=False)
        running = OperatorThread(str(emu.url).rstrip("/"), sources, namespaces=[NS])
        await running.start(emu)
        try:
            await seed(emu, "in", ["gpu-1", "gpu-2"])
            await post(emu, TJ_PATH, trainingjob("in"))
            other = trainingjob("out")
            other["metadata"]["namespace"] = "team-b"
            await post(emu, "/apis/trainsentry.io/v1alpha1/namespaces/team-b/trainingjobs", other)
            await eventually(lambda: status_of(emu, "in").get("phase") == "Monitoring")
            await asyncio.sleep(1)  # two resyncs
        finally:
            await running.stop()
        assert emu.get_live(TJ, "team-b", "out").get("status") is None
        assert not emu.live(RULES, "team-b")
        namespaced = {
            c for c in emu.recorded_calls(exclude_agent="kmock/") if c.resource == "namespaces"
        }
        assert not namespaced  # exact names need no namespace scanning (no extra RBAC)


async def test_a_probe_hang_trigger_makes_the_job_hung_with_the_rank_named(
    cluster: KubeEmulator, operator: OperatorThread, tmp_path: Path
) -> None:
    """The fast hang path reaches the TrainingJob: a probe's trigger at the real gateway →
    one TrainingCollectiveStalled alert → lastAlert (P0), then the diagnosis (rank 2, from
    the ranks' dumps) in lastAlert → the operator's phase Hung, all within seconds."""

    import aiohttp
    from aiohttp.test_utils import TestServer
    from pydantic import SecretStr

    # A gateway that has been up a while has its analyzer loaded (`HangDiagnoser.warm_up`);
    # started just now, its numpy and scipy imports would fall inside the 2 s deadline (seen
    # on a worker whose first tests were these).
    import trainsentry.diagnostics.api  # noqa: F401
    from trainsentry.config import GatewaySettings
    from trainsentry.config.diagnosis import DiagnosisSettings
    from trainsentry.gateway.assemble import Diagnosis, create_app
    from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints
    from trainsentry.probe.token import job_token

    probe_token, world, culprit = "probe-token", 4, 2
    await seed(cluster, "g", ["gpu-1", "gpu-2"])
    await post(cluster, TJ_PATH, trainingjob("g"))
    await eventually(lambda: status_of(cluster, "g").get("phase") == "Monitoring")

    # Each probe holds the job's own token (the operator's Secret); the gateway derives it.
    runners = await start_dump_probes(
        world, scenario="hang", culprit=culprit, entries=40, token=job_token(probe_token, NS, "g")
    )
    addresses = probe_addresses(runners)

    async def api() -> ApiClient:
        return ApiClient(Configuration(host=str(cluster.url).rstrip("/")))

    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=f"sqlite:///{tmp_path / 'gw.db'}",
        webhook_token=SecretStr("t"),
        trainingjob_status=True,
    )
    diagnosis = Diagnosis(
        DiagnosisSettings(hold_seconds=6, deadline_seconds=2, request_timeout_seconds=1),
        StaticEndpoints({f"{NS}/g": addresses}),
        probe_token,
    )
    server = TestServer(create_app(settings, diagnosis=diagnosis, kube_api=api), host="127.0.0.1")
    await server.start_server()
    trigger = {"namespace": NS, "trainingjob": "g", "pg": "0", "seq": 40, "rank": 0}
    try:
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {probe_token}"}) as http,
            http.post(
                server.make_url("/api/v1/hang-triggers"), json={**trigger, "waited_s": 25.0}
            ) as answer,
        ):
            assert answer.status == 202, await answer.text()
        started = asyncio.get_running_loop().time()
        await eventually(lambda: status_of(cluster, "g").get("phase") == "Hung")
        await eventually(lambda: "diagnosis" in status_of(cluster, "g").get("lastAlert", {}))
        took = asyncio.get_running_loop().time() - started
        last = status_of(cluster, "g")["lastAlert"]
        assert (last["name"], last["priority"], last["status"]) == (
            "TrainingCollectiveStalled",
            "P0",
            "firing",
        )
        assert last["culpritRanks"] == [culprit]
        assert last["diagnosis"].startswith(f"rank {culprit} never entered"), last
        assert status_of(cluster, "g")["phase"] == "Hung"
        assert took < 10
    finally:
        await close_in_process(server)
        for runner in runners:
            await runner.cleanup()
