"""Opt-in discovery: a PyTorchJob or Volcano Job annotated `trainsentry.io/monitor: "true"`
gets a TrainingJob of the same name. Pure: workload in, TrainingJob manifest out.

The TrainingJob is owned by the workload (ownerReference), so deleting the workload deletes
its TrainingJob. Ranks are derived from the workload where it says them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainsentry.operator.spec import API_VERSION, KIND, MANAGED_BY, WORKLOAD_API_VERSION

DISCOVERED_ANNOTATION = "trainsentry.io/discovered-from"


def _as_int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def pytorchjob_ranks(spec: Mapping[str, Any]) -> tuple[int | None, int]:
    """(world size, ranks per pod) of a Kubeflow PyTorchJob spec."""
    replica_specs = spec.get("pytorchReplicaSpecs") or {}
    pods = sum(_as_int((rs or {}).get("replicas", 1)) or 0 for rs in replica_specs.values())
    per_pod = (
        _as_int(spec.get("nprocPerNode"))
        or _as_int((spec.get("elasticPolicy") or {}).get("nProcPerNode"))
        or 1
    )
    return (pods * per_pod if pods else None), per_pod


def volcano_ranks(spec: Mapping[str, Any]) -> tuple[int | None, int]:
    pods = sum(_as_int((task or {}).get("replicas", 1)) or 0 for task in spec.get("tasks") or [])
    return (pods if pods else None), 1


def trainingjob_for(kind: str, workload: Mapping[str, Any]) -> dict[str, Any]:
    meta = workload["metadata"]
    spec = workload.get("spec") or {}
    world, per_pod = pytorchjob_ranks(spec) if kind == "PyTorchJob" else volcano_ranks(spec)
    api_version = str(workload.get("apiVersion") or WORKLOAD_API_VERSION[kind])
    tj_spec: dict[str, Any] = {
        "workloadRef": {"kind": kind, "name": meta["name"], "apiVersion": api_version},
        "ranksPerPod": per_pod,
    }
    if world is not None:
        tj_spec["worldSize"] = world
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(MANAGED_BY),
            "annotations": {DISCOVERED_ANNOTATION: f"{kind}/{meta['name']}"},
            "ownerReferences": [
                {
                    "apiVersion": api_version,
                    "kind": kind,
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "spec": tj_spec,
    }
