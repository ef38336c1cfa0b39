"""Label names, in one place: which labels name the node, the GPU, the rank and the training
job of an alert, and how a job is derived from them.

Labels are attacker-controlled strings; everything here only reads them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The node an alert is about, most specific first (dcgm-exporter uses Hostname,
# node_exporter series carry instance).
NODE_LABELS: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")
# The GPU: dcgm-exporter's gpu index, MIG instance and UUID, and `device` (nvidia0, ...).
GPU_LABELS: tuple[str, ...] = ("gpu", "GPU_I_ID", "UUID", "device")
# The GPU by its identifiers only (the weekly report counts GPUs by these, not by `device`).
GPU_ID_LABELS: tuple[str, ...] = ("gpu", "GPU_I_ID", "UUID")
# The rank of a training process.
RANK_LABELS: tuple[str, ...] = ("rank", "global_rank")
# The TrainingJob's name (the operator's rules set `trainingjob`; `job_name` is accepted).
JOB_NAME_LABELS: tuple[str, ...] = ("trainingjob", "job_name")
NAMESPACE_LABEL = "namespace"
# Prometheus' scrape job (not a training job): what a storm falls back to without one.
SCRAPE_JOB_LABEL = "job"


def hca_port(labels: Mapping[str, str]) -> str:
    """Pure: "mlx5_0 port 1" for an alert about a port of a network adapter (node_exporter's
    infiniband and netclass series carry `device` and `port`), else "". Such a `device` is
    an HCA, never a GPU (`gpu_label`)."""
    device, port = labels.get("device"), labels.get("port")
    return f"{device} port {port}" if device and port else ""


def gpu_label(labels: Mapping[str, str], names: Iterable[str] = GPU_LABELS) -> str:
    """Pure: the GPU an alert names (the first of `names`), "" when none does; `device`
    names a GPU only when the alert is not about an adapter's port (`hca_port`)."""
    if hca_port(labels):
        names = [name for name in names if name != "device"]
    return first_label(labels, names)


def first_label(labels: Mapping[str, str], names: Iterable[str]) -> str:
    """Pure: the first non-empty value among `names` (exporters name the same thing
    differently), or ""."""
    for name in names:
        value = labels.get(name)
        if value:
            return str(value)
    return ""


def node_of(labels: Mapping[str, str], names: tuple[str, ...] = NODE_LABELS) -> str:
    """Pure: the node an alert's labels point at, or "" when none does."""
    return first_label(labels, names)


def job_name_of(labels: Mapping[str, str]) -> str:
    """Pure: the training job's name, or "" when the labels name none."""
    return first_label(labels, JOB_NAME_LABELS)


def job_text(labels: Mapping[str, str]) -> str:
    """Pure: `namespace/name` of the training job (`name` without a namespace), or ""."""
    name = job_name_of(labels)
    if not name:
        return ""
    namespace = labels.get(NAMESPACE_LABEL, "")
    return f"{namespace}/{name}" if namespace else name
