"""Install level: the fast hang path works as `helm install` leaves a cluster, with a training
image that has never heard of trainsentry.

The chart is rendered by the real helm; the gateway and the operator run as processes with
the rendered args, env and Secrets (tests/support/install.py); the Kubernetes API is the
emulator. A PyTorchJob's four pods (the training operator's pod template) go through the
API server's admission as the rendered MutatingWebhookConfiguration says, into the
operator's webhook over HTTPS with the chart's generated certificate; the rendered
NetworkPolicies are asked whether each pod may reach the gateway (tests/support/
install_scenario.py holds the scenario, shared with the benchmark). Then each pod runs: the
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
import os
from pathlib import Path

import pytest

from tests.chart.chart_helm import NAMESPACE
from tests.chart.netpol import Pod, allowed, workload_pod
from tests.support.install import container_of, one, until
from tests.support.install_scenario import (
    JOB,
    TEAM,
    hang_paged,
    installed,
    job_pods,
    namespace_labelled,
    post,
)
from tests.support.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.torch]
torch = pytest.importorskip("torch")

FAST = {"TRAINSENTRY_PROBE_STALL_FLOOR": "2", "TRAINSENTRY_PROBE_STALL_STARTUP": "2"}


async def test_helm_install_then_a_hang_is_paged_by_the_fast_path(tmp_path: Path) -> None:
    async with installed(tmp_path) as (cluster, feishu):
        run = await hang_paged(cluster, feishu, tmp_path, {**FAST, "STALL_AFTER": "4"})
        assert "node gpu-node-1" in run.card, run.card
        # fast: the lowered 2 s threshold, then detection, trigger, dumps, stacks, the card
        assert run.card_s < 30, run.card_s
        # the pods as stored: the webhook's patch, validated against the real Pod schema by
        # the emulator; each rank's token is its job's, from the Secret the operator wrote
        master = cluster.emu.get_live("v1/pods", TEAM, "llama-master-0")
        assert master is not None and master["spec"]["initContainers"]
        token = cluster._secret_in_cluster(TEAM, f"{JOB}-trainsentry-probe-token", "token")
        assert token and token != cluster._secret("ts-trainsentry-gateway-auth", "probe-token")

        # The NetworkPolicies: an instrumented pod reaches the gateway's port; the same pod
        # without the webhook's label does not.
        policies = [o for o in cluster.objs if o["kind"] == "NetworkPolicy"]
        gateway = one(cluster.objs, "Deployment", "-gateway")
        http = container_of(gateway)["ports"][0]["containerPort"]
        target = workload_pod(gateway, NAMESPACE)
        # The namespace's labels as the cluster holds them (the operator's, for its job).
        team = cluster.emu.get_live("v1/namespaces", None, TEAM)
        assert team is not None
        ns_labels = team["metadata"]["labels"]
        admitted = run.admitted[0]["metadata"]["labels"]
        assert allowed(policies, Pod(TEAM, admitted, ns_labels), target, http)
        assert not allowed(policies, Pod(TEAM, run.pods[0]["metadata"]["labels"], ns_labels),
                           target, http)  # fmt: skip
        # The same labels from a namespace holding no TrainingJob (issue 43, finding 8).
        assert not allowed(policies, Pod("kube-system", admitted), target, http)
        cluster.stop()

        # The webhook unreachable (the operator gone): the pods are admitted unchanged.
        for pod in job_pods(free_port()):
            unchanged, outcomes = await cluster.admit(copy.deepcopy(pod), TEAM)
            assert outcomes == ["ignored: ConnectError"], outcomes
            assert unchanged == pod


async def test_an_image_without_python_runs_unchanged_with_the_patch(tmp_path: Path) -> None:
    """The webhook cannot see into an image: a container with no Python gets the patch, and
    its command runs exactly as before (PYTHONPATH and the probe's variables mean nothing to
    it). No probe answers; the job's TrainingProbeDown rule says so after 5 minutes."""
    async with installed(tmp_path, gateway=False) as (cluster, _):
        tj = {
            "apiVersion": "trainsentry.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "shell", "namespace": TEAM},
            "spec": {"selector": {"matchLabels": {"app": "shell"}}},
        }
        await post(cluster.emu, f"/apis/trainsentry.io/v1alpha1/namespaces/{TEAM}/trainingjobs", tj)
        await until(lambda: namespace_labelled(cluster, TEAM), 30, "the namespace label")
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
