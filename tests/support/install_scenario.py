"""The install-level hang scenario, shared by tests/e2e/test_install.py and
bench/bench_hang_page.py --injected: `helm install` (rendered), a team's TrainingJob and
PyTorchJob (4 ranks: a master and 3 workers), the pods admitted through the webhook and run
from the image stand-in with a script that knows nothing of trainsentry; rank 2 stops.

`installed()` gives the running cluster (tests/support/install.py) and the Feishu contract
server its bot posts to; `hang_paged()` runs the job until the card naming rank 2 arrives.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock

from tests.chart.chart_helm import NAMESPACE, template
from tests.operator.operator_harness import Validator, declare_cluster
from tests.operator.pod_templates import pytorchjob_pod
from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.install import Cluster, container_of, http_up, one, until
from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from tests.support.training_image import training_image

TEAM = "team-a"
JOB = "llama"
WORKERS = 3  # and one master: 4 ranks
STALLED = 2  # rank 2 is llama-worker-1, on gpu-node-1
STALLED_POD = "llama-worker-1"
SECRET = "bot-signing-secret"
SCRIPT = Path(__file__).resolve().parents[1] / "e2e" / "plain_train.py"
GATEWAY_DNS = f"ts-trainsentry-gateway.{NAMESPACE}.svc"
WEBHOOK_DNS = f"ts-trainsentry-operator-webhook.{NAMESPACE}.svc"


def chart_values(feishu: FeishuContractServer) -> dict[str, Any]:
    """What an admin sets: a Feishu bot for P0/P1; ports moved off the shared ones."""
    group = {"priorities": ["P0", "P1"], "url_env": "BOT_URL", "secret_env": "BOT_SECRET"}
    return {
        "operator": {"healthPort": free_port(), "webhook": {"port": free_port()}},
        "channels": {
            "config": {"feishu_bot": {"groups": {"critical": group}}},
            "secretEnv": {"BOT_URL": feishu.hook_url("critical"), "BOT_SECRET": SECRET},
        },
    }


def job_pods(master_port: int) -> list[dict[str, Any]]:
    """The PyTorchJob's pods as the training operator creates them."""
    pods = [pytorchjob_pod(JOB, TEAM, "master", 0, WORKERS, master_port=master_port)]
    pods += [pytorchjob_pod(JOB, TEAM, "worker", i, WORKERS, master_port=master_port)
             for i in range(WORKERS)]  # fmt: skip
    return pods


def cards(feishu: FeishuContractServer) -> list[str]:
    return [json.dumps(body, ensure_ascii=False) for _, body in feishu.accepted["critical"]]


async def post(emu: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    async with emu.post(path, json=body) as answer:
        assert answer.status == 201, await answer.text()


@asynccontextmanager
async def installed(
    folder: Path, *, gateway: bool = True, operator: bool = True
) -> AsyncIterator[tuple[Cluster, FeishuContractServer]]:
    """The rendered install running against a fresh emulator, until the block ends."""
    async with (
        KubeEmulator() as emu,
        kmock.Server(emu),
        FeishuContractServer(hooks={"critical": Hook(secret=SECRET)}) as feishu,
    ):
        declare_cluster(emu)
        emu.validator = Validator()  # every object written: the real schemas, strictly
        objs = template("defaults", chart_values(feishu), folder)
        image = container_of(one(objs, "Deployment", "-operator"))["image"]
        cluster = Cluster(objs, emu, folder / "cluster", NAMESPACE, image)
        await cluster.apply([NAMESPACE, TEAM])
        try:
            if gateway:
                process = cluster.start_gateway()
                url = cluster.resolve_url(f"http://{GATEWAY_DNS}:9095", TEAM)
                await until(lambda: http_up(f"{url}/readyz"), 60, "the gateway", process)
            if operator:
                process = cluster.start_operator()
                port = cluster.resolve(WEBHOOK_DNS, 443, TEAM)[1]
                await until(lambda: http_up(f"https://127.0.0.1:{port}/"), 60, "the webhook",
                            process)  # fmt: skip
                await until(lambda: webhook_configured(cluster), 60, "the caBundle", process)
            yield cluster, feishu
        finally:
            cluster.stop()


def webhook_configured(cluster: Cluster) -> bool:
    """Whether the operator put caBundle and path into the webhook's configuration."""
    resource = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    config = cluster.emu.get_live(resource, None, "ts-trainsentry-instrument") or {}
    client = (config.get("webhooks") or [{}])[0].get("clientConfig", {})
    return "caBundle" in client and "path" in client.get("service", {})


def namespace_labelled(cluster: Cluster, namespace: str) -> bool:
    live = cluster.emu.get_live("v1/namespaces", None, namespace) or {"metadata": {}}
    return (live["metadata"].get("labels") or {}).get("trainsentry.io/trainingjobs") == "true"


async def apply_trainingjob(cluster: Cluster, probe_port: int) -> None:
    """What the team applies: a TrainingJob for its PyTorchJob (a free probe port here)."""
    tj = {
        "apiVersion": "trainsentry.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB, "namespace": TEAM},
        "spec": {"workloadRef": {"kind": "PyTorchJob", "name": JOB}, "probe": {"port": probe_port}},
    }
    await post(cluster.emu, f"/apis/trainsentry.io/v1alpha1/namespaces/{TEAM}/trainingjobs", tj)


@dataclass
class HangRun:
    pods: list[dict[str, Any]]  # as the training operator made them
    admitted: list[dict[str, Any]]  # as the API server stored them
    stalled_at: float  # unix time rank 2 stopped
    card_at: float  # unix time the card naming rank 2 reached Feishu
    card: str
    threshold_s: float  # the stall threshold rank 0's probe used

    @property
    def card_s(self) -> float:
        return self.card_at - self.stalled_at


async def hang_paged(
    cluster: Cluster, feishu: FeishuContractServer, folder: Path, env: dict[str, str]
) -> HangRun:
    """Applies the TrainingJob, admits and runs the PyTorchJob's pods; rank 2 stops after
    STALL_AFTER (in `env`, with the probe's settings if any); returns once the card naming
    rank 2 arrived. The env on top of the pod's own: where marks go, who stalls, loopback
    gloo, and the probe binding its pod's own address (pods here share one network)."""
    probe_port = free_port()
    await apply_trainingjob(cluster, probe_port)
    # The operator labels the namespace on the job's first reconcile; the webhook sees its
    # pods from then on (docs/operator.md, "Which pods the webhook sees").
    await until(lambda: namespace_labelled(cluster, TEAM), 30, "the namespace label",
                *cluster.processes)  # fmt: skip
    pods = job_pods(free_port())
    admitted = []
    for pod in pods:
        patched, outcomes = await cluster.admit(copy.deepcopy(pod), TEAM)
        assert outcomes == ["patched"], outcomes
        admitted.append(patched)
    python = training_image(folder / "image")
    marks = cluster.folder / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    for index, pod in enumerate(admitted):
        stored = await cluster.create_pod(pod, node=f"gpu-node-{index // 2}")
        extra = {
            "MARK_DIR": str(marks),
            "STALL_RANK": str(STALLED),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "TRAINSENTRY_PROBE_BIND": stored["status"]["podIP"],
            **env,
        }
        cluster.run_pod(stored, [str(python), str(SCRIPT)], extra_env=extra)
    stall = marks / f"stalled.{STALLED}"
    await until(stall.exists, 600, "the stall", *cluster.processes)
    named = f"rank {STALLED} (pod {STALLED_POD}"
    await until(lambda: any(named in c for c in cards(feishu)), 600, "the card naming rank 2",
                *cluster.processes)  # fmt: skip
    card_at = time.time()
    card = next(c for c in cards(feishu) if named in c)
    rank0 = cluster.pod_ips[pods[0]["metadata"]["name"]]
    async with httpx.AsyncClient(timeout=5) as http:
        status = (await http.get(f"http://{rank0}:{probe_port}/status")).json()
    threshold = max((s["threshold_s"] for s in status.get("stalls", [])), default=float("nan"))
    return HangRun(pods, admitted, float(stall.read_text()), card_at, card, threshold)
