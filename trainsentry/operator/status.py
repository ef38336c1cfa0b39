"""TrainingJob status: pure computation from what the operator observed, plus the one call the
gateway uses to record the last alert (`patch_last_alert`).

The operator owns `phase`, `conditions`, `observedGeneration`, `ranks`, `nodes`, `pods` and
`children`; the gateway owns `lastAlert`. Each writer patches only its own keys (JSON merge
patch on the status subresource), so neither clobbers the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainsentry.alerts import Priority
from trainsentry.operator.spec import TrainingJobSpec

PHASES = ("Pending", "Monitoring", "Degraded", "Hung", "Completed")
CONDITION_TYPES = ("RulesReady", "ScrapeReady", "ExportersReady")
OWNED_KEYS = ("phase", "conditions", "observedGeneration", "ranks", "nodes", "pods", "children")


@dataclass(frozen=True)
class Condition:
    type: str
    ok: bool
    reason: str
    message: str = ""
    unknown: bool = False  # status "Unknown" (neither True nor False: nothing decides it)


# The gateway writes AlertingReady when it reads a job's spec.alerting; the operator writes it
# only to say that nothing reads it (these reasons are the operator's, and only these).
ALERTING_READY = "AlertingReady"
ALERTING_DISABLED = "JobAlertingDisabled"
ALERTING_NOT_IN_NAMESPACE = "JobAlertingNotInNamespace"
OPERATOR_ALERTING_REASONS = frozenset({ALERTING_DISABLED, ALERTING_NOT_IN_NAMESPACE})


@dataclass(frozen=True)
class JobAlertingScope:
    """What the operator is told of the gateway's job alerting (`--job-alerting`, set by the
    chart from gateway.jobAlerting): off, or on in every namespace (`namespaces` empty) or
    in those namespaces only."""

    enabled: bool
    namespaces: frozenset[str] = frozenset()


def alerting_condition(
    spec: TrainingJobSpec, namespace: str, scope: JobAlertingScope | None
) -> Condition | None:
    """Pure: the AlertingReady condition the operator owes a job whose routing settings
    (spec.alerting owners, feishu, onCallRosterRef) nothing will read: Unknown, with the
    reason and what to do. None when the gateway reads them (it writes the condition), when
    the job gives none, or when the operator was not told (`scope` None).
    `priorityOverrides` is not routing: the operator applies it to the rules itself."""
    alerting = spec.alerting
    if scope is None or not (alerting.owners or alerting.feishu or alerting.onCallRosterRef):
        return None
    if not scope.enabled:
        return Condition(
            ALERTING_READY,
            False,
            ALERTING_DISABLED,
            "spec.alerting (owners, feishu, onCallRosterRef) is not read: the gateway's job "
            "alerting is off (chart value gateway.jobAlerting.enabled); this job's alerts go to "
            "the gateway's global routes. Ask the cluster admin to turn it on.",
            unknown=True,
        )
    if scope.namespaces and namespace not in scope.namespaces:
        return Condition(
            ALERTING_READY,
            False,
            ALERTING_NOT_IN_NAMESPACE,
            f"spec.alerting (owners, feishu, onCallRosterRef) is not read: the gateway's job "
            f"alerting covers the namespaces {', '.join(sorted(scope.namespaces))}, not "
            f"{namespace} (chart value gateway.jobAlerting.namespaces); this job's alerts go to "
            "the gateway's global routes.",
            unknown=True,
        )
    return None


def without_stale_alerting(conditions: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pure: `conditions` less an AlertingReady the operator wrote (its reasons only): one
    that no longer holds. The gateway's own AlertingReady is kept."""
    return [
        c
        for c in conditions
        if not (c.get("type") == ALERTING_READY and c.get("reason") in OPERATOR_ALERTING_REASONS)
    ]


@dataclass(frozen=True)
class PodSummary:
    total: int
    running: int
    succeeded: int
    failed: int
    nodes: tuple[str, ...]  # nodes of pods that are scheduled and not finished

    @classmethod
    def of(cls, pods: Iterable[Mapping[str, Any]]) -> PodSummary:
        phases: list[str] = []
        nodes: set[str] = set()
        for pod in pods:
            phase = str((pod.get("status") or {}).get("phase") or "Pending")
            phases.append(phase)
            node = (pod.get("spec") or {}).get("nodeName")
            if node and phase in ("Pending", "Running", "Unknown"):
                nodes.add(str(node))
        return cls(
            total=len(phases),
            running=phases.count("Running"),
            succeeded=phases.count("Succeeded"),
            failed=phases.count("Failed"),
            nodes=tuple(sorted(nodes)),
        )


def ranks(spec: TrainingJobSpec, pods: PodSummary) -> dict[str, int]:
    expected = spec.worldSize if spec.worldSize is not None else pods.total * spec.ranksPerPod
    return {"expected": expected, "running": min(expected, pods.running * spec.ranksPerPod)}


def compute_phase(
    pods: PodSummary,
    rank_counts: Mapping[str, int],
    last_alert: Mapping[str, Any] | None,
    hang_alerts: frozenset[str],
) -> str:
    """Completed > Hung > Degraded > Pending > Monitoring, first that applies.

    Conditions do not enter: a problem with the rules (an unknown threshold) is reported by
    RulesReady while the rest of the rules apply, so the phase still tells the job's state.
    """
    if pods.total and pods.succeeded == pods.total:
        return "Completed"
    firing = last_alert is not None and last_alert.get("status", "firing") == "firing"
    if firing and last_alert is not None and last_alert.get("name") in hang_alerts:
        return "Hung"
    if pods.running == 0:
        return "Degraded" if pods.failed else "Pending"
    if pods.failed or rank_counts["running"] < rank_counts["expected"]:
        return "Degraded"
    if firing and last_alert is not None and last_alert.get("priority") in ("P0", "P1"):
        return "Degraded"
    return "Monitoring"


def alerting_of(
    old_status: Mapping[str, Any],
    spec: TrainingJobSpec,
    namespace: str,
    scope: JobAlertingScope | None,
) -> tuple[Mapping[str, Any], Condition | None, bool]:
    """Pure: (the status to merge into, the operator's AlertingReady or None, whether it is
    news worth a Warning). Without a condition of its own, the status to merge into is the
    old one less a stale AlertingReady the operator wrote (the gateway's is kept)."""
    old = old_status.get("conditions") or []
    alerting = alerting_condition(spec, namespace, scope)
    if alerting is None:
        return {**old_status, "conditions": without_stale_alerting(old)}, None, False
    news = not any(
        c.get("type") == alerting.type
        and c.get("reason") == alerting.reason
        and c.get("message") == alerting.message
        for c in old
    )
    return old_status, alerting, news


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Iterable[Condition], now: str, generation: int
) -> list[dict[str, Any]]:
    """Kubernetes-style conditions; lastTransitionTime moves only when the status flips.
    Conditions of other writers (the gateway's `AlertingReady`) are kept as they are, unless
    `new` holds one of the same type (the operator's AlertingReady, alerting_condition)."""
    previous = {str(item.get("type")): item for item in old}
    result = []
    for cond in new:
        status = "Unknown" if cond.unknown else "True" if cond.ok else "False"
        before = previous.get(cond.type)
        changed = before is None or before.get("status") != status
        result.append(
            {
                "type": cond.type,
                "status": status,
                "reason": cond.reason,
                "message": cond.message,
                "observedGeneration": generation,
                "lastTransitionTime": now
                if changed or before is None
                else before.get("lastTransitionTime", now),
            }
        )
    mine = {item["type"] for item in result} | set(CONDITION_TYPES)
    result += [dict(item) for item in old if str(item.get("type")) not in mine]
    return result


def build_status(
    old_status: Mapping[str, Any],
    *,
    spec: TrainingJobSpec,
    generation: int,
    pods: PodSummary,
    conditions: Sequence[Condition],
    children: Sequence[Mapping[str, str]],
    hang_alerts: frozenset[str],
    now: str,
) -> dict[str, Any]:
    rank_counts = ranks(spec, pods)
    return {
        "phase": compute_phase(pods, rank_counts, old_status.get("lastAlert"), hang_alerts),
        "conditions": merge_conditions(
            old_status.get("conditions") or [], conditions, now, generation
        ),
        "observedGeneration": generation,
        "ranks": rank_counts,
        "pods": {
            "total": pods.total,
            "running": pods.running,
            "succeeded": pods.succeeded,
            "failed": pods.failed,
        },
        "nodes": list(pods.nodes),
        "children": [dict(child) for child in children],
    }


def status_patch(old_status: Mapping[str, Any], new_status: Mapping[str, Any]) -> dict[str, Any]:
    """The owned keys that differ (empty: nothing to write)."""
    return {
        key: new_status[key]
        for key in OWNED_KEYS
        if key in new_status and old_status.get(key) != new_status[key]
    }


def now_iso(clock: datetime | None = None) -> str:
    return (clock or datetime.now(tz=UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


MAX_DIAGNOSIS_CHARS = 1024


def last_alert_patch(
    alertname: str,
    priority: str | Priority,
    at: datetime,
    status: str = "firing",
    diagnosis: str | None = None,
    culprit_ranks: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Pure: the merge patch of `status.lastAlert`. `diagnosis` (the hang diagnosis'
    sentence, cut to 1,024 characters) and `culpritRanks` (at most 64) are written only
    when given, so a later patch of the same alert without them keeps them."""
    if status not in ("firing", "resolved"):
        raise ValueError(f"status must be firing or resolved, got {status!r}")
    if at.tzinfo is None:
        raise ValueError("at must be timezone-aware")
    alert: dict[str, Any] = {
        "name": alertname,
        "priority": Priority(priority).value,
        "at": now_iso(at.astimezone(UTC)),
        "status": status,
    }
    if diagnosis is not None:
        alert["diagnosis"] = diagnosis[:MAX_DIAGNOSIS_CHARS]
        alert["culpritRanks"] = [int(r) for r in culprit_ranks[:64]]
    return {"status": {"lastAlert": alert}}


async def patch_last_alert(
    api: Any,
    namespace: str,
    name: str,
    alertname: str,
    priority: str | Priority,
    at: datetime,
    *,
    status: str = "firing",
    diagnosis: str | None = None,
    culprit_ranks: tuple[int, ...] = (),
) -> bool:
    """Records the job's latest alert in `status.lastAlert` (for the gateway).

    `api` is a `kubernetes_asyncio.client.ApiClient`. Retries 429/5xx with backoff. Returns
    False when the TrainingJob does not exist (alerts for unknown jobs are not an error).
    The operator folds `lastAlert` into `phase` (Hung, Degraded) on its next reconcile.
    Needs RBAC `patch` on `trainingjobs/status`.
    """
    from trainsentry.kube.client import Kube, KubeError
    from trainsentry.kube.resources import TRAININGJOBS

    body = last_alert_patch(alertname, priority, at, status, diagnosis, culprit_ranks)
    try:
        await Kube(api).patch(TRAININGJOBS, namespace, name, body, subresource="status")
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise
    return True
