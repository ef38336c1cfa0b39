"""Pods as the Kubeflow training operator creates them for a PyTorchJob, for the webhook tests.

From kubeflow/training-operator (pkg/controller.v1/pytorch/envvar.go and the common job
labels): one pod per replica, named `<job>-master-0` and `<job>-worker-<i>`, the container
named `pytorch` (the name the operator requires) with its `pytorchjob-port` (23456), and the
env the operator appends to every container: PYTHONUNBUFFERED=0, MASTER_PORT, MASTER_ADDR
(the master pod's name), WORLD_SIZE (all replicas) and RANK (the master 0, worker i is
i + 1). Labels: `training.kubeflow.org/job-name`, `operator-name`, `replica-type`,
`replica-index`, and `job-role: master` on the master.
"""

from __future__ import annotations

from typing import Any


def pytorchjob_pod(
    job: str,
    namespace: str,
    replica_type: str,
    index: int,
    workers: int,
    *,
    image: str = "registry.example.com/llm/train:2.13",
    command: list[str] | None = None,
    extra_env: list[dict[str, Any]] | None = None,
    master_port: int = 23456,
) -> dict[str, Any]:
    """The pod of replica `replica_type` ("master" or "worker") `index` of PyTorchJob `job`
    with one master and `workers` workers, as it reaches admission (no uid, no status)."""
    rank = index if replica_type == "master" else index + 1
    labels = {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": replica_type,
        "training.kubeflow.org/replica-index": str(index),
    }
    if replica_type == "master":
        labels["training.kubeflow.org/job-role"] = "master"
    env = [
        *(extra_env or []),
        {"name": "PYTHONUNBUFFERED", "value": "0"},
        {"name": "MASTER_PORT", "value": str(master_port)},
        {"name": "MASTER_ADDR", "value": f"{job}-master-0"},
        {"name": "WORLD_SIZE", "value": str(workers + 1)},
        {"name": "RANK", "value": str(rank)},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-{replica_type}-{index}",
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": job,
                    "uid": "6b0e1f6c-2f4e-4c53-9d55-0d2a1c7e9a10",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [
                {
                    "name": "pytorch",
                    "image": image,
                    "command": command or ["python", "/workspace/train.py"],
                    "ports": [{"name": "pytorchjob-port", "containerPort": master_port}],
                    "env": env,
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }
