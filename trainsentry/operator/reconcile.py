"""Reconcile one TrainingJob: observe pods, apply children, claim nodes, write status.

Idempotent: every step reads what exists and changes only what differs, so running it again
(a resync, a restart, a retry after an API error) converges without duplicates. Pure decisions
live in render.py, nodes.py and status.py; this module only moves data through the API.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainsentry.alerts import PROBE_HANG_ALERT
from trainsentry.kube.client import Kube, KubeError
from trainsentry.kube.resources import BY_KIND, NODES, PODS, TRAININGJOBS
from trainsentry.operator import discovery, nodes, status
from trainsentry.operator.render import (
    DashboardFile,
    Rendered,
    RuleFile,
    dashboards_ref,
    hang_alert_names,
    render_children,
    uses_pod_names,
)
from trainsentry.operator.spec import (
    MAX_NAME_LENGTH,
    OWNED_LABELS_ANNOTATION,
    JobIdentity,
    TrainingJobSpec,
)

log = logging.getLogger(__name__)

# (type "Normal" | "Warning", reason, message) → posts a Kubernetes Event on the TrainingJob.
Emit = Callable[[str, str, str], None]
NODE_CONFLICT_RETRIES = 8
RENDER_CACHE_SIZE = 2048  # renders kept (one per job and spec/pods version)


@dataclass(frozen=True)
class Sources:
    """Rule files and dashboards, loaded once at startup, and the renders made from them;
    with the two settings the reconciles read (where dashboards go, who reads spec.alerting)."""

    rule_files: tuple[RuleFile, ...]
    dashboards: tuple[DashboardFile, ...]
    # Where the jobs' dashboard ConfigMaps go; None: next to each job (render.dashboards_ref).
    dashboards_namespace: str | None = None
    # Whether the gateway reads jobs' spec.alerting (--job-alerting); None: not told, and the
    # operator says nothing of it (status.alerting_condition).
    job_alerting: status.JobAlertingScope | None = None
    _cache: OrderedDict[Hashable, Rendered] = field(
        default_factory=OrderedDict, repr=False, compare=False
    )

    @property
    def hang_alerts(self) -> frozenset[str]:
        """The rules' hang alerts and the probes' own (raised through the gateway)."""
        return hang_alert_names(self.rule_files) | {PROBE_HANG_ALERT}

    def render(self, job: JobIdentity, spec: TrainingJobSpec, pod_names: list[str]) -> Rendered:
        """render_children, remembered: a resync of an unchanged job renders nothing."""
        pods = tuple(sorted(pod_names)) if uses_pod_names(spec) else ()
        key = (job.uid, job.name, job.namespace, spec.model_dump_json(), pods)
        cached = self._cache.get(key)
        if cached is None:
            cached = render_children(
                job, spec, self.rule_files, self.dashboards, pod_names, self.dashboards_namespace
            )
            self._cache[key] = cached
            if len(self._cache) > RENDER_CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return cached


def load_sources(
    rules_dir: Path,
    dashboards_dir: Path,
    dashboards_namespace: str | None = None,
    job_alerting: status.JobAlertingScope | None = None,
) -> Sources:
    """The rule files (`*.yaml` holding `groups`) and dashboards (`*.json`) to render. Raises
    OSError when one cannot be read, ValueError naming the file when one does not parse."""
    rule_files = []
    for path in sorted(rules_dir.glob("*.yaml")) if rules_dir.is_dir() else []:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path.name}: not valid YAML: {exc}") from exc
        if isinstance(loaded, dict) and isinstance(loaded.get("groups"), list):
            rule_files.append(RuleFile(path.name, loaded["groups"]))
    dashboards = []
    for path in sorted(dashboards_dir.glob("*.json")) if dashboards_dir.is_dir() else []:
        try:
            dashboard = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path.name}: not valid JSON: {exc}") from exc
        dashboards.append(DashboardFile(path.stem, dashboard))
    return Sources(tuple(rule_files), tuple(dashboards), dashboards_namespace, job_alerting)


# --- children -------------------------------------------------------------------------------


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch turning `old` into `new`."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if old.get(key) != value:
            patch[key] = merge_diff(old.get(key), value)
    return patch


def owned_labels(meta: Mapping[str, Any]) -> set[str]:
    """The label keys a child's annotation says the operator set."""
    listed = str((meta.get("annotations") or {}).get(OWNED_LABELS_ANNOTATION) or "")
    return {key for key in listed.split(",") if key}


def child_patch(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """What to patch so `existing` matches `desired`: foreign labels/annotations are kept,
    labels the operator set before (OWNED_LABELS_ANNOTATION) and no longer wants go."""
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        if key in ("apiVersion", "kind", "metadata"):
            continue
        if existing.get(key) != value:
            patch[key] = merge_diff(existing.get(key), value)
    old_meta, new_meta = existing.get("metadata") or {}, desired.get("metadata") or {}
    meta_patch: dict[str, Any] = {}
    for section in ("labels", "annotations"):
        changed = {
            k: v
            for k, v in (new_meta.get(section) or {}).items()
            if (old_meta.get(section) or {}).get(k) != v
        }
        if section == "labels":
            dropped = owned_labels(old_meta) - set(new_meta.get("labels") or {})
            changed.update((k, None) for k in dropped if k in (old_meta.get("labels") or {}))
        if changed:
            meta_patch[section] = changed
    if old_meta.get("ownerReferences") != new_meta.get("ownerReferences"):
        meta_patch["ownerReferences"] = new_meta.get("ownerReferences")
    if meta_patch:
        patch["metadata"] = meta_patch
    return patch


async def apply_child(kube: Kube, manifest: dict[str, Any], known: bool = True) -> str:
    """Creates or patches one child; returns "created", "updated" or "unchanged".

    `known=False` (the child is not in the job's status yet) tries the create first, which
    saves a read for new jobs; an existing child then answers 409 and is read and patched.
    """
    res = BY_KIND[manifest["kind"]]
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    existing = await kube.get(res, namespace, name) if known else None
    if existing is None:
        try:
            await kube.create(res, namespace, manifest)
            return "created"
        except KubeError as exc:
            if exc.status != 409:
                raise
            existing = await kube.get(res, namespace, name)  # raced with another writer
            if existing is None:
                raise
    patch = child_patch(existing, manifest)
    if not patch:
        return "unchanged"
    await kube.patch(res, namespace, name, patch)
    return "updated"


# --- nodes ----------------------------------------------------------------------------------


class NodeLocks:
    """One lock per node, so this process's jobs queue for a shared node instead of
    conflicting (409) on it. Other writers are still caught by the resourceVersion check."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def __call__(self, node_name: str) -> asyncio.Lock:
        return self._locks.setdefault(node_name, asyncio.Lock())


async def sync_node(
    kube: Kube,
    node_name: str,
    job_uid: str,
    claim: nodes.Claim | None,
    locks: NodeLocks | None = None,
) -> bool:
    """Sets or drops this job's claim on a node; True if the node changed."""
    if locks is None:
        return await _sync_node(kube, node_name, job_uid, claim)
    async with locks(node_name):
        return await _sync_node(kube, node_name, job_uid, claim)


async def _sync_node(kube: Kube, node_name: str, job_uid: str, claim: nodes.Claim | None) -> bool:
    for _ in range(NODE_CONFLICT_RETRIES):
        node = await kube.get(NODES, None, node_name)
        if node is None:
            return False
        patch = nodes.node_patch(node, job_uid, claim)
        if patch is None:
            return False
        try:
            await kube.patch(NODES, None, node_name, patch)
            return True
        except KubeError as exc:
            if exc.status != 409:
                raise
            log.info("event=node_conflict node=%s job_uid=%s", node_name, job_uid)
    raise KubeError(409, f"node {node_name}: too many conflicting writers")


class ClaimLedger:
    """Per process: the nodes that may carry each job's claim, so a claim is released even
    when the status write naming its node was lost (the process died, or the write failed
    and the pod moved before the retry), or the body handed in is older than that write.

    Filled by one list of the monitored nodes at the first use in a process (a claim made by
    an earlier process is only on the nodes); after that every claim this process sets is
    noted before its write and dropped after its release. Steady state: no extra API call.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, set[str]] | None = None
        self._lock = asyncio.Lock()

    async def nodes_of(self, kube: Kube, job_uid: str) -> set[str]:
        """The nodes that may carry this job's claim (the ledger's own set: update it)."""
        if self._nodes is None:
            async with self._lock:
                if self._nodes is None:
                    self._nodes = await _scan_claims(kube)
        return self._nodes.setdefault(job_uid, set())

    def forget(self, job_uid: str) -> None:
        if self._nodes is not None:
            self._nodes.pop(job_uid, None)


async def _scan_claims(kube: Kube) -> dict[str, set[str]]:
    """job uid → the nodes carrying its claim, read from the nodes themselves."""
    found: dict[str, set[str]] = {}
    for node in await kube.list(NODES, None, f"{nodes.MONITORED_LABEL}=true"):
        meta = node.get("metadata") or {}
        for uid in nodes.claims_on(meta.get("annotations") or {}):
            found.setdefault(uid, set()).add(str(meta.get("name")))
    return found


async def release_all_nodes(kube: Kube, job_uid: str, locks: NodeLocks | None = None) -> list[str]:
    """Drops this job's claims from every node carrying one (for deletion)."""
    released = []
    for node in await kube.list(NODES, None, f"{nodes.MONITORED_LABEL}=true"):
        name = node["metadata"]["name"]
        if nodes.claimed_by(node, job_uid) and await sync_node(kube, name, job_uid, None, locks):
            released.append(name)
    return released


# --- the reconcile --------------------------------------------------------------------------


async def _write_status(
    kube: Kube, job: JobIdentity, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    patch = status.status_patch(old, new)
    if patch:
        await kube.patch(
            TRAININGJOBS, job.namespace, job.name, {"status": patch}, subresource="status"
        )


async def _refuse(
    kube: Kube,
    job: JobIdentity,
    old_status: Mapping[str, Any],
    generation: int,
    emit: Emit,
    reason: str,
    message: str,
) -> str:
    """A job the operator cannot render: reported in its status (and one Warning), no
    children, no retries."""
    reported = any(
        c.get("reason") == reason and c.get("message") == message
        for c in old_status.get("conditions") or []
    )
    if not reported:  # once per distinct problem, not on every resync
        emit("Warning", reason, message)
    bad = [status.Condition(kind, False, reason, message) for kind in status.CONDITION_TYPES]
    await _write_status(
        kube,
        job,
        old_status,
        {
            "phase": "Pending",
            "observedGeneration": generation,
            "conditions": status.merge_conditions(
                old_status.get("conditions") or [], bad, status.now_iso(), generation
            ),
        },
    )
    return "Pending"


async def reconcile(
    kube: Kube,
    body: Mapping[str, Any],
    sources: Sources,
    emit: Emit,
    node_locks: NodeLocks | None = None,
    claims: ClaimLedger | None = None,
) -> str:
    """Brings one TrainingJob's children, node claims and status up to date; returns phase.

    `claims`: the process's ClaimLedger; without one the nodes are listed on every call.
    """
    job = JobIdentity.from_body(body)
    old_status: Mapping[str, Any] = body.get("status") or {}
    generation = int(body["metadata"].get("generation") or 1)
    if len(job.name) > MAX_NAME_LENGTH:  # the CRD refuses these; older objects may have one
        message = (
            f"metadata.name: {len(job.name)} characters, at most {MAX_NAME_LENGTH} "
            "(it is a label value on the children); recreate the job with a shorter name"
        )
        return await _refuse(kube, job, old_status, generation, emit, "InvalidName", message)
    try:
        spec = TrainingJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return await _refuse(kube, job, old_status, generation, emit, "InvalidSpec", message)

    pods = await kube.list(PODS, job.namespace, spec.pod_selector().as_string())
    summary = status.PodSummary.of(pods)
    rendered = sources.render(job, spec, [pod["metadata"]["name"] for pod in pods])
    if rendered.unknown_thresholds:
        message = f"unknown thresholds: {', '.join(rendered.unknown_thresholds)}"
        if not any(
            c.get("reason") == "UnknownThreshold" and c.get("message") == message
            for c in old_status.get("conditions") or []
        ):
            emit("Warning", "UnknownThreshold", message)
    children = await _apply_children(kube, job, rendered, old_status, sources, emit)
    exporters = tuple(spec.exporters.enabled())
    await _claim_nodes(kube, job, exporters, summary, old_status, emit, node_locks, claims)

    conditions = _conditions(spec, rendered, summary, exporters)
    base, alerting, warn = status.alerting_of(old_status, spec, job.namespace, sources.job_alerting)
    if alerting is not None:
        conditions.append(alerting)
        if warn:  # once per distinct message, not on every resync
            emit("Warning", alerting.reason, alerting.message)
    new_status = status.build_status(
        base,
        spec=spec,
        generation=generation,
        pods=summary,
        conditions=conditions,
        children=children,
        hang_alerts=sources.hang_alerts,
        now=status.now_iso(),
    )
    await _write_status(kube, job, old_status, new_status)
    if old_status.get("phase") != new_status["phase"]:
        emit(
            "Normal", "PhaseChanged", f"{old_status.get('phase', 'None')} -> {new_status['phase']}"
        )
    return str(new_status["phase"])


async def _apply_children(
    kube: Kube,
    job: JobIdentity,
    rendered: Rendered,
    old_status: Mapping[str, Any],
    sources: Sources,
    emit: Emit,
) -> list[dict[str, Any]]:
    """Applies the rendered children (one event per kind of change, not per child) and
    deletes the dashboards' ConfigMap once the job has turned its dashboards off; returns
    the children for status.children."""
    children: list[dict[str, Any]] = []
    known = {(child.get("kind"), child.get("name")) for child in old_status.get("children") or []}
    changes: dict[str, list[str]] = {}
    for manifest in rendered.manifests:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        outcome = await apply_child(kube, manifest, known=(kind, name) in known)
        child = {"apiVersion": manifest["apiVersion"], "kind": kind, "name": name}
        if manifest["metadata"]["namespace"] != job.namespace:
            child["namespace"] = manifest["metadata"]["namespace"]
        children.append(child)
        if outcome != "unchanged":
            changes.setdefault(outcome, []).append(f"{kind} {name}")
    for outcome, items in changes.items():  # one event per kind of change, not per child
        emit("Normal", f"Children{outcome.capitalize()}", f"{outcome} {', '.join(items)}")
    dashboards_at, dashboards_name = dashboards_ref(job, sources.dashboards_namespace)
    dashboards_off = ("ConfigMap", dashboards_name) in known and not any(
        child["kind"] == "ConfigMap" for child in children
    )
    if dashboards_off and await kube.delete(BY_KIND["ConfigMap"], dashboards_at, dashboards_name):
        emit("Normal", "ChildDeleted", f"deleted ConfigMap {dashboards_name}")

    return children


async def _claim_nodes(
    kube: Kube,
    job: JobIdentity,
    exporters: tuple[str, ...],
    summary: status.PodSummary,
    old_status: Mapping[str, Any],
    emit: Emit,
    node_locks: NodeLocks | None,
    claims: ClaimLedger | None,
) -> None:
    """Claims the nodes the job's pods run on for its exporters (none: no claim) and
    releases those it held before and no longer runs on."""
    claim = nodes.Claim(job.uid, job.key, exporters) if exporters else None
    wanted = set(summary.nodes) if claim else set()
    # Not status.nodes alone: a status write lost after a claim would leak that claim.
    claimed = await (claims or ClaimLedger()).nodes_of(kube, job.uid)
    before = claimed | set(old_status.get("nodes") or [])
    changed, released = [], []
    for node in sorted(wanted):
        claimed.add(node)  # before the write: it may land even if the call fails
        if await sync_node(kube, node, job.uid, claim, node_locks):
            changed.append(node)
    for node in sorted(before - wanted):
        if await sync_node(kube, node, job.uid, None, node_locks):
            released.append(node)
        claimed.discard(node)
    if changed or released:
        emit("Normal", "NodesLabelled", f"claimed {changed or '[]'}, released {released or '[]'}")


def rules_message(rendered: Rendered) -> str:
    """Pure: what RulesReady says of an applied PrometheusRule: the alerting rules it holds,
    and the hardware (`job_scope: node`) rules left to the cluster-wide rules because the
    job does not tune them (not an error: the cluster-wide alert covers the job's nodes)."""
    message = f"{rendered.alert_count} alerting rules"
    if left := len(rendered.cluster_wide_rules):
        message += (
            f"; {left} untuned node-level rules are not copied (the cluster-wide rules "
            "alert for the job's nodes)"
        )
    return message


def _conditions(
    spec: TrainingJobSpec,
    rendered: Rendered,
    pods: status.PodSummary,
    exporters: Sequence[str],
) -> list[status.Condition]:
    unknown = rendered.unknown_thresholds
    rules = (
        status.Condition(
            "RulesReady", False, "UnknownThreshold", f"unknown thresholds: {', '.join(unknown)}"
        )
        if unknown
        else status.Condition("RulesReady", True, "Applied", rules_message(rendered))
    )
    last_port = spec.probe.port + spec.ranksPerPod - 1
    ports = (
        str(spec.probe.port) if last_port == spec.probe.port else f"{spec.probe.port}-{last_port}"
    )
    scrape = (
        status.Condition("ScrapeReady", True, "Applied", f"{pods.running} pods, ports {ports}")
        if pods.running
        else status.Condition(
            "ScrapeReady",
            False,
            "NoRunningPods",
            f"PodMonitor applied; no running pod matches {spec.pod_selector().as_string()!r}",
        )
    )
    if not exporters:
        nodes_cond = status.Condition("ExportersReady", True, "Disabled", "no exporters wanted")
    elif pods.nodes:
        nodes_cond = status.Condition(
            "ExportersReady",
            True,
            "NodesLabelled",
            f"{len(pods.nodes)} nodes labelled for {', '.join(exporters)}",
        )
    else:
        nodes_cond = status.Condition("ExportersReady", False, "NoNodes", "no pod is scheduled yet")
    return [rules, scrape, nodes_cond]


async def cleanup(
    kube: Kube,
    body: Mapping[str, Any],
    emit: Emit,
    node_locks: NodeLocks | None = None,
    claims: ClaimLedger | None = None,
    dashboards_namespace: str | None = None,
) -> list[str]:
    """On deletion: drop node claims and delete the dashboards kept in another namespace
    (the children next to the job go by ownerReference garbage collection)."""
    job = JobIdentity.from_body(body)
    at, name = dashboards_ref(job, dashboards_namespace)
    if at != job.namespace and await kube.delete(BY_KIND["ConfigMap"], at, name):
        emit("Normal", "ChildDeleted", f"deleted ConfigMap {at}/{name}")
    released = await release_all_nodes(kube, job.uid, node_locks)
    if claims is not None:
        claims.forget(job.uid)
    if released:
        emit("Normal", "NodesReleased", f"released {released}")
    return released


async def discover(kube: Kube, kind: str, workload: Mapping[str, Any]) -> bool:
    """Creates the TrainingJob for an opted-in workload if it has none; True if created."""
    manifest = discovery.trainingjob_for(kind, workload)
    meta = manifest["metadata"]
    if await kube.get(TRAININGJOBS, meta["namespace"], meta["name"]) is not None:
        return False
    try:
        await kube.create(TRAININGJOBS, meta["namespace"], manifest)
    except KubeError as exc:
        if exc.status == 409:
            return False
        raise
    return True
