"""Install level: the fast hang path works as `helm install` leaves a cluster, with a training
image that has never heard of trainsentry.

The chart is rendered by the real helm; the gateway and the operator run as processes with
the rendered args, env and Secrets (tests/support/install.py); the Kubernetes API is the
emulator. A PyTorchJob's four pods (the training operator's pod template) go through the
API server's admission as the rendered MutatingWebhookConfiguration says, into the
operator's webhook over HTTPS with the chart's generated certificate; the rendered
NetworkPolicies are asked whether each pod may reach the gateway. Then each pod runs: the
init container copies the probe, and four real gloo ranks start with exactly the env,
volumes and PYTHONPATH the patch gave (a training script with no trainsentry import and no
launcher, in an image without trainsentry). Rank 2 stops: the card naming rank 2, its pod
and node arrives through the fast path (trigger → gateway → dumps → Feishu).

With the webhook unreachable (the operator not running) the same pods are admitted
unchanged. The stall threshold is lowered (TRAINSENTRY_PROBE_STALL_*) so a run takes
seconds; bench/bench_hang_page.py --injected measures the defaults.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import kmock
import pytest

from tests.chart.chart_helm import NAMESPACE, template
from tests.chart.netpol import Pod, allowed, workload_pod
from tests.operator.operator_harness import Validator, declare_cluster
from tests.operator.pod_templates import pytorchjob_pod
from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.install import Cluster, container_of, http_up, one, until
from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from tests.support.training_image import training_image

pytestmark = [pytest.mark.e2e, pytest.mark.torch]
torch = pytest.importorskip("torch")

TEAM = "team-a"
JOB = "llama"
WORKERS = 3  # and one master: 4 ranks
STALLED = 2  # rank 2 is llama-worker-1
SECRET = "bot-signing-secret"
SCRIPT = Path(__file__).with_name("plain_train.py")
FAST = {"TRAINSENTRY_PROBE_STALL_FLOOR": "2", "TRAINSENTRY_PROBE_STALL_STARTUP": "2"}


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
    pods = [pytorchjob_pod(JOB, TEAM, "master", 0, WORKERS, master_port=master_port)]
    pods += [pytorchjob_pod(JOB, TEAM, "worker", i, WORKERS, master_port=master_port)
             for i in range(WORKERS)]  # fmt: skip
    return pods


def cards(feishu: FeishuContractServer) -> list[str]:
    return [json.dumps(body, ensure_ascii=False) for _, body in feishu.accepted["critical"]]


async def post(emu: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    async with emu.post(path, json=body) as answer:
        assert answer.status == 201, await answer.text()


async def installed(tmp_path: Path, emu: KubeEmulator, feishu: FeishuContractServer) -> Cluster:
    objs = template("defaults", chart_values(feishu), tmp_path)
    image = container_of(one(objs, "Deployment", "-operator"))["image"]
    return Cluster(objs, emu, tmp_path / "cluster", NAMESPACE, image)


def stall_time(cluster: Cluster) -> float:
    return float((cluster.folder / "marks" / f"stalled.{STALLED}").read_text())


async def run_job(
    cluster: Cluster, admitted: list[dict[str, Any]], python: Path, extra: dict[str, str]
) -> None:
    """Runs the admitted pods as the kubelet would; the test's own env on top: where marks
    go, who stalls, loopback gloo, and the probe binding its pod's own address."""
    marks = cluster.folder / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    for index, pod in enumerate(admitted):
        stored = await cluster.create_pod(pod, node=f"gpu-node-{index // 2}")
        env = {
            "MARK_DIR": str(marks),
            "STALL_RANK": str(STALLED),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "TRAINSENTRY_PROBE_BIND": stored["status"]["podIP"],
            **extra,
        }
        cluster.run_pod(stored, [str(python), str(SCRIPT)], extra_env=env)


async def test_helm_install_then_a_hang_is_paged_by_the_fast_path(tmp_path: Path) -> None:
    async with (
        KubeEmulator() as emu,
        kmock.Server(emu),
        FeishuContractServer(hooks={"critical": Hook(secret=SECRET)}) as feishu,
    ):
        declare_cluster(emu)
        emu.validator = Validator()  # every object written: the real schemas, strictly
        cluster = await installed(tmp_path, emu, feishu)
        try:
            gateway = cluster.start_gateway()
            operator = cluster.start_operator()
            gw_url = cluster.resolve_url(
                f"http://ts-trainsentry-gateway.{NAMESPACE}.svc:9095", TEAM
            )
            await until(lambda: http_up(f"{gw_url}/readyz"), 60, "the gateway", gateway)
            hook_port = cluster.resolve(f"ts-trainsentry-operator-webhook.{NAMESPACE}.svc", 443,
                                        TEAM)[1]  # fmt: skip
            await until(lambda: http_up(f"https://127.0.0.1:{hook_port}/"), 60, "the webhook",
                        operator)  # fmt: skip

            # The team applies its TrainingJob, then starts its PyTorchJob: nothing else.
            tj = {
                "apiVersion": "trainsentry.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": JOB, "namespace": TEAM},
                "spec": {
                    "workloadRef": {"kind": "PyTorchJob", "name": JOB},
                    "probe": {"port": free_port()},
                },
            }
            await post(emu, f"/apis/trainsentry.io/v1alpha1/namespaces/{TEAM}/trainingjobs", tj)
            pods = job_pods(free_port())
            admitted = []
            for pod in pods:
                patched, outcomes = await cluster.admit(copy.deepcopy(pod), TEAM)
                assert outcomes == ["patched"], outcomes
                admitted.append(patched)

            # The NetworkPolicies: an instrumented pod reaches the gateway, the same pod
            # without the webhook's label does not.
            policies = [o for o in cluster.objs if o["kind"] == "NetworkPolicy"]
            gateway_dep = one(cluster.objs, "Deployment", "-gateway")
            gateway_pod = workload_pod(gateway_dep, NAMESPACE)
            http = container_of(gateway_dep)["ports"][0]["containerPort"]
            assert allowed(policies, Pod(TEAM, admitted[0]["metadata"]["labels"]), gateway_pod,
                           http)  # fmt: skip
            assert not allowed(policies, Pod(TEAM, pods[0]["metadata"]["labels"]), gateway_pod,
                               http)  # fmt: skip

            python = training_image(tmp_path / "image")
            await run_job(cluster, admitted, python, {**FAST, "STALL_AFTER": "4"})
            marks = cluster.folder / "marks"
            await until(lambda: (marks / f"stalled.{STALLED}").exists(), 120, "the stall",
                        *cluster.processes)  # fmt: skip
            await until(lambda: any("rank 2 (pod llama-worker-1" in c for c in cards(feishu)),
                        60, "the card naming rank 2", *cluster.processes)  # fmt: skip
            arrived = time.time()
            card = next(c for c in cards(feishu) if "rank 2 (pod llama-worker-1" in c)
            assert "node gpu-node-1" in card, card
            assert "TrainingCollectiveStalled" in card or "stalled" in card.lower(), card
            # fast: the lowered 2 s threshold, then detection, trigger, dumps, card
            assert arrived - stall_time(cluster) < 30, arrived - stall_time(cluster)
            # each rank's probe holds its job's token, from the Secret the operator wrote
            token = cluster._secret_in_cluster(TEAM, f"{JOB}-trainsentry-probe-token", "token")
            assert token and token != cluster._secret("ts-trainsentry-gateway-auth", "probe-token")
        finally:
            cluster.stop()

        # The webhook unreachable (no operator): the API server admits the pods unchanged.
        for pod in job_pods(free_port()):
            unchanged, outcomes = await cluster.admit(copy.deepcopy(pod), TEAM)
            assert outcomes == ["ignored: ConnectError"], outcomes
            assert unchanged == pod


async def test_an_image_without_python_runs_unchanged_with_the_patch(tmp_path: Path) -> None:
    """The webhook cannot see into an image: a container with no Python gets the patch, and
    its command runs exactly as before (PYTHONPATH and the probe's variables mean nothing to
    it). No probe answers; the job's TrainingProbeDown rule says so after 5 minutes."""
    async with (
        KubeEmulator() as emu,
        kmock.Server(emu),
        FeishuContractServer(hooks={"critical": Hook(secret=SECRET)}) as feishu,
    ):
        declare_cluster(emu)
        cluster = await installed(tmp_path, emu, feishu)
        try:
            operator = cluster.start_operator()
            hook_port = cluster.resolve(f"ts-trainsentry-operator-webhook.{NAMESPACE}.svc", 443,
                                        TEAM)[1]  # fmt: skip
            await until(lambda: http_up(f"https://127.0.0.1:{hook_port}/"), 60, "the webhook",
                        operator)  # fmt: skip
            tj = {
                "apiVersion": "trainsentry.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": "shell", "namespace": TEAM},
                "spec": {"selector": {"matchLabels": {"app": "shell"}}},
            }
            await post(emu, f"/apis/trainsentry.io/v1alpha1/namespaces/{TEAM}/trainingjobs", tj)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "shell-0", "namespace": TEAM, "labels": {"app": "shell"}},
                "spec": {"containers": [{"name": "main", "image": "busybox",
                                         "command": ["sh", "-c", "echo done"]}]},
            }  # fmt: skip
            patched, outcomes = await cluster.admit(pod, TEAM)
            assert outcomes == ["patched"]
            stored = await cluster.create_pod(patched, node="cpu-node-0")
            bin_dir = tmp_path / "bin"  # a PATH with a shell and no python
            bin_dir.mkdir()
            os.symlink("/bin/sh", bin_dir / "sh")
            os.symlink("/bin/echo", bin_dir / "echo")
            process = cluster.run_pod(stored, [str(bin_dir / "sh"), "-c", "echo done"],
                                      extra_env={"PATH": str(bin_dir)})  # fmt: skip
            assert process.popen.wait(30) == 0
            assert process.output().strip() == "done"
        finally:
            cluster.stop()
