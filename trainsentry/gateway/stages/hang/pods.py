"""A job's pods in rank order, from the labels the workload controllers that run training
jobs put on them (pure).

The hang diagnosis asks a rank that never posted a trigger for its `/status` by guessing
its address: with the pods in rank order, rank r's probe is endpoint r (a pod's ranks are
its index × `ranksPerPod` + LOCAL_RANK; locate.py `_status_targets`). The Kubernetes
API lists pods in no such order (by name, or as stored), so they are sorted by:
- Kubeflow's training-operator (PyTorchJob, MPIJob): `training.kubeflow.org/replica-type`
  (`master` first: a PyTorchJob's master is rank 0, worker i is rank i + 1; an MPIJob's
  `launcher` last: it runs `mpirun`, not a rank, so its workers are ranks from 0 (with
  mpi-operator's `runLauncherAsWorker` it runs one too, and each guess is off by one pod:
  one `/status` more, below)), then `training.kubeflow.org/replica-index`;
- JobSet: `jobset.sigs.k8s.io/job-index` (the replicated Job), then the Job's index;
- an Indexed Job: `batch.kubernetes.io/job-completion-index` (a label since Kubernetes 1.28,
  an annotation before);
- else the pod's name, its numbers compared as numbers (a StatefulSet's `llama-2` before
  `llama-10`).
A wrong guess costs one `/status` (each answer says its rank), never a wrong verdict.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
_FIRST_TYPES = ("master",)  # a PyTorchJob's rank 0
_LAST_TYPES = ("launcher",)  # an MPIJob's mpirun host: no rank
_NUMBER = re.compile(r"(\d+)")


def _index(metadata: Mapping[str, Any], name: str) -> int:
    """Pure: an index label (or annotation) as a number; -1 when absent or not a number."""
    for where in ("labels", "annotations"):
        value = str((metadata.get(where) or {}).get(name) or "")
        if value.isdigit() and len(value) <= 9:
            return int(value)
    return -1


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    """Pure: a name's parts, its numbers as numbers (`w-2` before `w-10`)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _NUMBER.split(name) if p)


def rank_order(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """Pure: a sort key putting a job's pods in rank order (the module docstring says how)."""
    metadata = pod.get("metadata") or {}
    kind = str((metadata.get("labels") or {}).get(REPLICA_TYPE) or "").lower()
    return (
        0 if kind in _FIRST_TYPES else 2 if kind in _LAST_TYPES else 1,
        _index(metadata, JOBSET_JOB_INDEX),
        _index(metadata, REPLICA_INDEX),
        _index(metadata, COMPLETION_INDEX),
        _natural(str(metadata.get("name") or "")),
    )
