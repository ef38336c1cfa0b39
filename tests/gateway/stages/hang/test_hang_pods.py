"""A job's pods in rank order (stages/hang/pods.py), from the labels the controllers set as
their sources define them: Kubeflow training-operator's `training.kubeflow.org/replica-type`
(lower-cased replica type) and `replica-index`, JobSet's `jobset.sigs.k8s.io/job-index`,
Kubernetes' Indexed Job `batch.kubernetes.io/job-completion-index` (label since 1.28,
annotation before); and through the Kubernetes API (kmock), the endpoints the diagnosis
asks come back in rank order whatever order the pods were created in."""

from __future__ import annotations

import random
from typing import Any

from kubernetes_asyncio.client import ApiClient, Configuration

from tests.operator.operator_harness import NS, pod, post, trainingjob
from tests.support.kube_emulator import KubeEmulator
from trainsentry.alerts import JobRef
from trainsentry.gateway.stages.hang.diagnosis import KubernetesEndpoints
from trainsentry.gateway.stages.hang.pods import REPLICA_INDEX, rank_order


def meta(name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> Any:
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}}}


def in_order(pods: list[Any]) -> list[str]:
    shuffled = list(pods)
    random.Random(7).shuffle(shuffled)
    return [p["metadata"]["name"] for p in sorted(shuffled, key=rank_order)]


def test_a_pytorchjobs_master_is_rank_0_then_its_workers_by_index() -> None:
    def replica(kind: str, index: int) -> Any:
        labels = {
            "training.kubeflow.org/replica-type": kind,
            "training.kubeflow.org/replica-index": str(index),
        }
        return meta(f"llama-{kind}-{index}", labels)

    pods = [replica("master", 0)] + [replica("worker", i) for i in range(12)]
    assert in_order(pods) == ["llama-master-0"] + [f"llama-worker-{i}" for i in range(12)]


def test_an_mpijobs_launcher_runs_no_rank_and_comes_after_its_workers() -> None:
    """mpi-operator labels the launcher `replica-type: launcher`; it runs mpirun, and the
    workers (replica-index 0..) run the ranks, so worker 0's pod is rank 0's."""
    labels = {"training.kubeflow.org/replica-type": "launcher"}
    pods = [meta("bert-launcher", labels)]
    for i in range(3):
        worker = {"training.kubeflow.org/replica-type": "worker"}
        pods.append(meta(f"bert-worker-{i}", {**worker, REPLICA_INDEX: str(i)}))
    assert in_order(pods) == ["bert-worker-0", "bert-worker-1", "bert-worker-2", "bert-launcher"]


def test_jobset_pods_by_their_job_then_their_index() -> None:
    def member(job: int, index: int) -> Any:
        labels = {
            "jobset.sigs.k8s.io/job-index": str(job),
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        return meta(f"llm-workers-{job}-{index}-x7k2p", labels)

    pods = [member(job, index) for job in range(3) for index in range(4)]
    expected = [f"llm-workers-{job}-{index}-x7k2p" for job in range(3) for index in range(4)]
    assert in_order(pods) == expected


def test_an_indexed_jobs_pods_by_their_completion_index_label_or_annotation() -> None:
    new = [meta(f"bert-{i}-abcde", {"batch.kubernetes.io/job-completion-index": str(i)})
           for i in range(11)]  # fmt: skip
    assert in_order(new) == [f"bert-{i}-abcde" for i in range(11)]
    old = [meta(f"bert-{i}-q", {}, {"batch.kubernetes.io/job-completion-index": str(i)})
           for i in range(11)]  # fmt: skip
    assert in_order(old) == [f"bert-{i}-q" for i in range(11)]


def test_a_statefulsets_pods_by_their_numbers_not_their_letters() -> None:
    pods = [meta(f"gpt-{i}", {}) for i in range(12)]
    assert in_order(pods) == [f"gpt-{i}" for i in range(12)]  # gpt-2 before gpt-10


async def test_the_diagnosis_asks_the_pods_endpoints_in_rank_order(
    cluster: KubeEmulator,
) -> None:
    spec = {"selector": {"matchLabels": {"job": "pt"}}, "worldSize": 24, "ranksPerPod": 2}
    await post(cluster, f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs",
               trainingjob("pt", spec))  # fmt: skip
    replicas = [("master", 0)] + [("worker", i) for i in range(11)]
    random.Random(3).shuffle(replicas)  # created in no order (a restart, a scale-up)
    for kind, index in replicas:
        body = pod(f"pt-{kind}-{index}", "pt", f"gpu-{index}", labels={
            "job": "pt",
            "training.kubeflow.org/replica-type": kind,
            "training.kubeflow.org/replica-index": str(index),
        })  # fmt: skip
        body["status"]["podIP"] = f"10.0.{index}.{1 if kind == 'master' else 2}"
        await post(cluster, f"/api/v1/namespaces/{NS}/pods", body)
    async with ApiClient(Configuration(host=str(cluster.url).rstrip("/"))) as api:
        ranks = await KubernetesEndpoints(api)(JobRef(NS, "pt"))
    pods = [e.pod for e in ranks.endpoints]
    assert pods[:2] == ["pt-master-0", "pt-master-0"]  # ranks 0 and 1
    assert pods[2::2] == [f"pt-worker-{i}" for i in range(11)]  # rank 2i+2 on worker i
    assert [e.address for e in ranks.endpoints[2:4]] == ["10.0.0.2:9401", "10.0.0.2:9402"]
