"""A TrainingJob's pods instrumented as they are created. Pure: pod + jobs + settings in, a
JSONPatch (RFC 6902) out; no I/O, no clock (`admission.py` does the I/O).

When a TrainingJob in the pod's namespace selects the pod (`spec.selector`, or the pod label
its `workloadRef` implies: `TrainingJobSpec.pod_selector`, the selector the reconcile lists
pods by) and has `spec.instrument` on, the pod gets:
- an init container `trainsentry-probe-install` (the trainsentry image) running
  `trainsentry probe install /trainsentry-probe` into an emptyDir `trainsentry-probe`;
- on its training container (annotation `trainsentry.io/container`, else `pytorch`, the
  name a PyTorchJob requires, else the first): that emptyDir read-only at
  /trainsentry-probe, `PYTHONPATH` starting with its start-up hook (`probe/inject.py`),
  the env the probe reads (TRAINSENTRY_PROBE=1, the job, namespace, gateway URL and probe
  port; POD_NAME, POD_IP, TRAINSENTRY_NODE from the downward API; the job's probe token from
  the Secret the operator keeps next to the job), an emptyDir `trainsentry-fr` at the Flight
  Recorder dump folder, and the probe's ports;
- the label `trainsentry.io/trainingjob: <job>` (the chart's NetworkPolicy lets pods with it
  reach the gateway).

Invariants:
- Failing open: a pod that cannot be judged gets no patch and a reason (`Plan.reason`),
  never an error; the webhook is `failurePolicy: Ignore`.
- What the pod already sets is never overwritten: a variable, volume, mount, port or label
  of that name stays as it is (listed in `Plan.kept`); a literal PYTHONPATH is kept behind
  the hook's folder. A pod already instrumented (our init container or volume) is unchanged.
- Deterministic: several jobs selecting one pod are ordered by name; the first wins.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from trainsentry.operator.spec import (
    JOB_LABEL,
    MANAGED_BY,
    MAX_NAME_LENGTH,
    JobIdentity,
    TrainingJobSpec,
)
from trainsentry.probe.inject import BOOTSTRAP_PATH, DUMP_MOUNT, INSTALL_ARGS, PROBE_MOUNT

INIT_CONTAINER = "trainsentry-probe-install"
PROBE_VOLUME = "trainsentry-probe"
DUMP_VOLUME = "trainsentry-fr"
CONTAINER_ANNOTATION = "trainsentry.io/container"  # which container is the training one
OPT_OUT_ANNOTATION = "trainsentry.io/instrument"  # "false": leave this pod alone
TOKEN_KEY = "token"
MAX_PORTS = 32  # declared probe ports per pod (the probe listens whether declared or not)
Op = dict[str, Any]


@dataclass(frozen=True)
class InstrumentSettings:
    """What the operator was told at start (the chart passes it)."""

    image: str  # the trainsentry image: the init container runs it
    gateway_url: str = ""  # TRAINSENTRY_GATEWAY_URL; "" leaves it out (no fast hang path)
    image_pull_policy: str = "IfNotPresent"
    token_secrets: bool = True  # whether the operator keeps each job's probe token Secret


@dataclass(frozen=True)
class Plan:
    """The webhook's answer for one pod: the patch (empty: unchanged), the job it was
    instrumented for, why (not), and what of the pod's own settings was kept.

    `reason` may quote the pod (its container names, annotations: the caller's text) and
    goes to the operator's log only, quoted; `note` and `kept` are what the job's Events
    say: fixed text, our own names and the job's name, never the pod's own text."""

    ops: list[Op]
    job: str | None
    reason: str
    kept: list[str] = field(default_factory=list)
    note: str = ""
    #: Unchanged because someone asked for it (spec.instrument false, the pod's opt-out, an
    #: instrumented pod): nothing to tell the job's owners.
    deliberate: bool = False


def token_secret_name(job: str) -> str:
    """The Secret holding `job`'s probe token, next to the job (`admission.ProbeSecrets`)."""
    return f"{job}-trainsentry-probe-token"


def _pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901): `~` and `/` inside a part escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def selecting_jobs(
    labels: Mapping[str, str], jobs: Sequence[Mapping[str, Any]]
) -> tuple[list[tuple[str, TrainingJobSpec]], list[str]]:
    """Pure: the TrainingJobs (name, spec) selecting a pod with `labels`, by name, and the
    names of jobs whose spec or name could not be read (they select nothing)."""
    found, unreadable = [], []
    for body in jobs:
        name = str((body.get("metadata") or {}).get("name") or "")
        if body.get("metadata", {}).get("deletionTimestamp"):
            continue
        try:
            spec = TrainingJobSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            unreadable.append(name)
            continue
        if not name or len(name) > MAX_NAME_LENGTH:
            unreadable.append(name)
        elif spec.pod_selector().matches(labels):
            found.append((name, spec))
    return sorted(found, key=lambda item: item[0]), sorted(unreadable)


def training_container(pod: Mapping[str, Any]) -> tuple[int | None, str]:
    """Pure: the index of the pod's training container, or None and why not."""
    containers = (pod.get("spec") or {}).get("containers") or []
    names = [str(c.get("name", "")) for c in containers]
    if not names:
        return None, "the pod has no containers"
    asked = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONTAINER_ANNOTATION)
    if asked is not None:
        if asked in names:
            return names.index(asked), f"container {asked} ({CONTAINER_ANNOTATION})"
        return None, f"{CONTAINER_ANNOTATION} names {asked!r}, which the pod does not have"
    if "pytorch" in names:
        return names.index("pytorch"), "container pytorch"
    return 0, f"container {names[0]} (the first)"


def _env(job: str, namespace: str, spec: TrainingJobSpec, s: InstrumentSettings) -> list[Op]:
    def field_ref(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    env: list[Op] = [
        {"name": "TRAINSENTRY_PROBE", "value": "1"},
        {"name": "TRAINSENTRY_JOB", "value": job},
        {"name": "TRAINSENTRY_NAMESPACE", "value": namespace},
        {"name": "TRAINSENTRY_PROBE_PORT", "value": str(spec.probe.port)},
        {"name": "POD_NAME", "valueFrom": field_ref("metadata.name")},
        {"name": "POD_IP", "valueFrom": field_ref("status.podIP")},
        {"name": "TRAINSENTRY_NODE", "valueFrom": field_ref("spec.nodeName")},
    ]
    if s.gateway_url:
        env.append({"name": "TRAINSENTRY_GATEWAY_URL", "value": s.gateway_url})
    if s.token_secrets:
        # optional: a pod never waits for the Secret (the webhook writes it before answering,
        # but a pod must not hang on a Secret deleted by hand); without it the probe serves
        # no dumps and its triggers are refused, and the Prometheus rules still find hangs.
        ref = {"name": token_secret_name(job), "key": TOKEN_KEY, "optional": True}
        env.append({"name": "TRAINSENTRY_PROBE_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    return env


def init_container(s: InstrumentSettings) -> dict[str, Any]:
    """Pure: the init container copying the probe (restricted Pod Security profile)."""
    return {
        "name": INIT_CONTAINER,
        "image": s.image,
        "imagePullPolicy": s.image_pull_policy,
        "args": list(INSTALL_ARGS),
        "volumeMounts": [{"name": PROBE_VOLUME, "mountPath": PROBE_MOUNT}],
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _append(ops: list[Op], base: Mapping[str, Any], path: tuple[str | int, ...], key: str,
            items: Sequence[Any]) -> None:  # fmt: skip
    """Adds `items` to the list `base[key]` (at `path`), creating the list if absent."""
    if not items:
        return
    if isinstance(base.get(key), list):
        ops.extend({"op": "add", "path": _pointer(*path, key, "-"), "value": i} for i in items)
    else:
        ops.append({"op": "add", "path": _pointer(*path, key), "value": list(items)})


@dataclass
class _Patch:
    """The patch being built for one pod's training container. The steps (`_add_*`) only
    append: to `ops` in the order they are applied, to `kept` what of the pod's own settings
    was left as it was; the pod itself (`spec`, `container`) is never changed."""

    spec: Mapping[str, Any]  # the pod's spec
    container: Mapping[str, Any]  # its training container
    where: tuple[str | int, ...]  # the container's path: ("spec", "containers", index)
    ops: list[Op] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def _add_job_label(patch: _Patch, meta: Mapping[str, Any], job: str) -> None:
    """Adds the label `JOB_LABEL: job` (with the labels map where the pod has none); a pod
    labelled for another job keeps its label (kept)."""
    labels = meta.get("labels") or {}
    if labels.get(JOB_LABEL, job) != job:
        patch.kept.append(f"label {JOB_LABEL} (naming another job)")
    elif JOB_LABEL not in labels:
        if "labels" in meta:
            patch.ops.append({"op": "add", "path": _pointer("metadata", "labels", JOB_LABEL),
                              "value": job})  # fmt: skip
        else:
            patch.ops.append({"op": "add", "path": "/metadata/labels", "value": {JOB_LABEL: job}})


def _add_volumes(patch: _Patch, settings: InstrumentSettings) -> None:
    """Adds the probe's emptyDir, the init container filling it and its read-only mount at
    PROBE_MOUNT, and the Flight Recorder's emptyDir mounted at DUMP_MOUNT, unless the
    container mounts something there (kept) or the pod has a volume of that name (kept, and
    mounted there)."""
    mounts = patch.container.get("volumeMounts") or []
    volumes = patch.spec.get("volumes") or []
    new_volumes = [{"name": PROBE_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}}]
    new_mounts = [{"name": PROBE_VOLUME, "mountPath": PROBE_MOUNT, "readOnly": True}]
    if any(m.get("mountPath") == DUMP_MOUNT for m in mounts):
        patch.kept.append(f"mount at {DUMP_MOUNT}")
    elif any(v.get("name") == DUMP_VOLUME for v in volumes):
        patch.kept.append(f"volume {DUMP_VOLUME}")
        new_mounts.append({"name": DUMP_VOLUME, "mountPath": DUMP_MOUNT})
    else:
        new_volumes.append({"name": DUMP_VOLUME, "emptyDir": {}})
        new_mounts.append({"name": DUMP_VOLUME, "mountPath": DUMP_MOUNT})
    _append(patch.ops, patch.spec, ("spec",), "volumes", new_volumes)
    _append(patch.ops, patch.spec, ("spec",), "initContainers", [init_container(settings)])
    _append(patch.ops, patch.container, patch.where, "volumeMounts", new_mounts)


def _add_env(patch: _Patch, probe_env: list[Op]) -> None:
    """Adds `probe_env` (`_env`) less the variables the container sets (kept), and
    PYTHONPATH starting with the hook's folder: added, or the folder put in front of the
    container's literal value; a PYTHONPATH from a reference is kept as it is (no start-up
    hook)."""
    env = patch.container.get("env") or []
    have = {str(e.get("name")): i for i, e in enumerate(env)}
    add_env = []
    for item in probe_env:
        if item["name"] in have:
            patch.kept.append(f"env {item['name']}")
        else:
            add_env.append(item)
    if "PYTHONPATH" not in have:
        add_env.append({"name": "PYTHONPATH", "value": BOOTSTRAP_PATH})
    else:
        own = env[have["PYTHONPATH"]]
        if "value" in own and BOOTSTRAP_PATH not in str(own["value"]).split(":"):
            value = f"{BOOTSTRAP_PATH}:{own['value']}" if own["value"] else BOOTSTRAP_PATH
            patch.ops.append({"op": "replace", "path": _pointer(*patch.where, "env",
                              have["PYTHONPATH"], "value"), "value": value})  # fmt: skip
            patch.kept.append("env PYTHONPATH (the hook's folder put in front)")
        elif "value" not in own:
            patch.kept.append("env PYTHONPATH (set from a reference: no start-up hook)")
    _append(patch.ops, patch.container, patch.where, "env", add_env)


def _add_ports(patch: _Patch, job_spec: TrainingJobSpec) -> None:
    """Adds the probe's ports, one a local rank (`ranksPerPod`, at most MAX_PORTS) from
    `probe.port`, named ts-probe-<local rank>; a port whose number (TCP) or name a container
    of the pod has already is kept."""
    containers = patch.spec.get("containers") or []
    taken = {
        (int(p.get("containerPort", 0)), str(p.get("protocol", "TCP")))
        for c in containers
        for p in c.get("ports") or []
    }
    port_names = {str(p.get("name")) for c in containers for p in c.get("ports") or []}
    ports = []
    for local in range(min(job_spec.ranksPerPod, MAX_PORTS)):
        port, name = job_spec.probe.port + local, f"ts-probe-{local}"
        if (port, "TCP") in taken or name in port_names:
            patch.kept.append(f"port {port}")
            continue
        ports.append({"name": name, "containerPort": port, "protocol": "TCP"})
    _append(patch.ops, patch.container, patch.where, "ports", ports)


def plan(
    pod: Mapping[str, Any],
    namespace: str,
    jobs: Sequence[Mapping[str, Any]],
    settings: InstrumentSettings,
) -> Plan:
    """Pure: what the webhook does to `pod` (being created in `namespace`) given the
    TrainingJobs there (raw bodies). See the module docstring."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if not namespace:
        return Plan([], None, "the pod's namespace is unknown")
    if ((meta.get("annotations") or {}).get(OPT_OUT_ANNOTATION) or "").lower() == "false":
        return Plan([], None, f"the pod opts out ({OPT_OUT_ANNOTATION}: false)", deliberate=True)
    selecting, unreadable = selecting_jobs(meta.get("labels") or {}, jobs)
    if not selecting:
        if not jobs:
            return Plan([], None, f"no TrainingJob in namespace {namespace}")
        names = ", ".join(sorted(str((j.get("metadata") or {}).get("name")) for j in jobs))
        skipped = f" ({', '.join(unreadable)} unreadable)" if unreadable else ""
        return Plan([], None, f"no TrainingJob selects the pod (jobs here: {names}){skipped}")
    job, job_spec = selecting[0]
    others = [name for name, _ in selecting[1:]]
    also = f"; also selected by {', '.join(others)}" if others else ""
    if not job_spec.instrument:
        reason = f"TrainingJob {job} has spec.instrument: false{also}"
        return Plan([], job, reason, deliberate=True)
    inits = spec.get("initContainers") or []
    volumes = spec.get("volumes") or []
    if any(c.get("name") == INIT_CONTAINER for c in inits) or any(
        v.get("name") == PROBE_VOLUME for v in volumes
    ):
        return Plan([], job, "the pod is instrumented already", deliberate=True)
    index, which = training_container(pod)
    if index is None:
        note = (
            "a pod has no containers"
            if not spec.get("containers")
            else f"a pod's {CONTAINER_ANNOTATION} annotation names a container it does not have"
        )
        return Plan([], job, which, note=note)
    container = spec["containers"][index]
    mounts = container.get("volumeMounts") or []
    if any(m.get("mountPath") == PROBE_MOUNT for m in mounts):
        mounted = f"a pod's training container mounts something at {PROBE_MOUNT} already"
        return Plan([], job, mounted, note=mounted)

    patch = _Patch(spec, container, ("spec", "containers", index))
    _add_job_label(patch, meta, job)
    _add_volumes(patch, settings)
    _add_env(patch, _env(job, namespace, job_spec, settings))
    _add_ports(patch, job_spec)
    reason = f"instrumented for TrainingJob {job}, {which}{also}"
    return Plan(patch.ops, job, reason, patch.kept, note=f"pods instrumented for TrainingJob {job}")


def token_secret(job: JobIdentity, token: str) -> dict[str, Any]:
    """Pure: the Secret holding the job's probe token (`probe.token.job_token` of the
    master), owned by the TrainingJob so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": token_secret_name(job.name),
            "namespace": job.namespace,
            "labels": {**MANAGED_BY, JOB_LABEL: job.name},
            "ownerReferences": [job.owner_reference()],
        },
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }
