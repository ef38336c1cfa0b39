"""Cordon with a human in the loop (pure): which sick nodes to recommend, and whether a
cordon may go ahead now.

A node whose hardware fault score (gateway/policy/health.py) reaches
`remediation.threshold` is recommended once: one card with Approve / Dismiss. After a
decision (dismissed, cordoned then uncordoned) only faults that started after it count
towards the next recommendation, so a dismissed node gets no new card until it fails again.

Guards, checked before every cordon (approved or automatic):
- share: after the cordon, no job has more than `max_job_share` of its nodes cordoned. A
  job's nodes are the nodes its alerts named within the health horizon, joined with the
  nodes its TrainingJob lists in `status.nodes` when it can be read (the gateway's RBAC
  gives it no pod reads, so this is what it knows of where a job runs);
- rate: at most `max_per_hour` cordons in the last hour, whoever approved them;
- infrastructure (auto mode only): no open infrastructure incident covers an element of the
  node's place (then the switch or the PDU is broken, not the node).

Every function takes the time as a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainsentry.alerts import Alert
from trainsentry.gateway.policy.health import NodeHealth, score_nodes
from trainsentry.gateway.policy.rules import Policy
from trainsentry.labels import job_text

MAX_JOBS_LISTED = 20  # jobs named on a card and kept in a node's state


class Mode(StrEnum):
    OFF = "off"
    APPROVE = "approve"
    AUTO = "auto"


class CordonSettings(BaseModel):
    """The `remediation:` section of the gateway config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cordon: Mode = Mode.APPROVE
    threshold: float = Field(default=20.0, gt=0, le=1e6)  # health score that recommends
    max_job_share: float = Field(default=0.25, gt=0, le=1)
    max_per_hour: int = Field(default=2, ge=1, le=1000)
    check_seconds: float = Field(default=60.0, ge=0.05, le=86400)


class CordonConfigError(ValueError):
    """The `remediation:` section is wrong; the message names the field."""


def parse_settings(raw: Mapping[str, Any] | None) -> CordonSettings:
    """Pure: the `remediation:` section checked; CordonConfigError names the field at fault."""
    try:
        return CordonSettings.model_validate(dict(raw or {}))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            where = ".".join(str(part) for part in error["loc"])
            problems.append(f"remediation.{where}: {error['msg']}")
        raise CordonConfigError("; ".join(problems)) from None


class Status(StrEnum):
    RECOMMENDED = "recommended"  # a card is out, waiting for Approve / Dismiss
    DISMISSED = "dismissed"
    CORDONED = "cordoned"
    UNCORDONED = "uncordoned"


@dataclass(frozen=True, slots=True)
class NodeDecision:
    """What is stored per node (policy_state, scope "cordon")."""

    status: Status
    at: datetime  # when the status was set
    by: str = ""
    score: float = 0.0
    faults: Mapping[str, int] | None = None
    jobs: tuple[str, ...] = ()
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "at": self.at.isoformat(),
            "by": self.by,
            "score": round(self.score, 3),
            "faults": dict(self.faults or {}),
            "jobs": list(self.jobs),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeDecision:
        return cls(
            status=Status(data["status"]),
            at=datetime.fromisoformat(str(data["at"])),
            by=str(data.get("by", "")),
            score=float(data.get("score", 0.0)),
            faults=dict(data.get("faults") or {}),
            jobs=tuple(str(job) for job in data.get("jobs") or ()),
            reason=str(data.get("reason", "")),
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    health: NodeHealth
    jobs: tuple[str, ...]  # namespace/name of the jobs whose alerts named the node


def jobs_by_node(alerts: Iterable[Alert]) -> dict[str, set[str]]:
    """Pure: node -> the jobs (`namespace/name`) whose alerts named it."""
    found: dict[str, set[str]] = {}
    for alert in alerts:
        job = job_text(alert.labels)
        if alert.node and job:
            found.setdefault(alert.node, set()).add(job)
    return found


def candidates(
    alerts: Iterable[Alert],
    policy: Policy,
    settings: CordonSettings,
    decisions: Mapping[str, NodeDecision],
    now: datetime,
) -> list[Candidate]:
    """Pure: the nodes to recommend now, sickest first: score at or above the threshold,
    counting for a node with a past decision only the faults that started after it; nodes
    with a recommendation out or cordoned are never candidates."""
    if settings.cordon is Mode.OFF:
        return []
    occurrences = list(alerts)
    counted = []
    for alert in occurrences:
        before = decisions.get(alert.node)
        if before is not None and (
            before.status in (Status.RECOMMENDED, Status.CORDONED) or alert.starts_at <= before.at
        ):
            continue
        counted.append(alert)
    jobs = jobs_by_node(occurrences)
    return [
        Candidate(health, tuple(sorted(jobs.get(health.node, ())))[:MAX_JOBS_LISTED])
        for health in score_nodes(counted, policy, now)
        if health.score >= settings.threshold
    ]


def blocked(
    node: str,
    settings: CordonSettings,
    decisions: Mapping[str, NodeDecision],
    job_nodes: Mapping[str, set[str]],
    now: datetime,
    *,
    automatic: bool,
    incident_elements: Iterable[str] = (),
) -> str | None:
    """Pure: why `node` may not be cordoned now (a sentence), or None when it may.
    `job_nodes`: job -> the nodes its alerts named; `incident_elements`: `level=element` of
    the open infrastructure incidents covering the node's place."""
    if settings.cordon is Mode.OFF:
        return "remediation.cordon is off"
    cordoned = {n for n, d in decisions.items() if d.status is Status.CORDONED}
    if node in cordoned:
        return f"{node} is cordoned already"
    if automatic:
        covering = sorted(incident_elements)
        if covering:
            return (
                f"an infrastructure incident covers {node} ({', '.join(covering)}): "
                "the element is suspected, not the node"
            )
    hour_ago = now - timedelta(hours=1)
    recent = sum(1 for d in decisions.values() if d.status is Status.CORDONED and d.at > hour_ago)
    if recent >= settings.max_per_hour:
        return f"{recent} nodes cordoned in the last hour (remediation.max_per_hour)"
    for job, nodes in sorted(job_nodes.items()):
        if node not in nodes:
            continue
        after = len((cordoned | {node}) & nodes)
        if after > settings.max_job_share * len(nodes):
            return (
                f"job {job} would have {after} of its {len(nodes)} nodes cordoned "
                f"(remediation.max_job_share {settings.max_job_share:g})"
            )
    return None


def job_nodes_of(alerts: Iterable[Alert]) -> dict[str, set[str]]:
    """Pure: job (`namespace/name`) -> the nodes its alerts named."""
    found: dict[str, set[str]] = {}
    for node, jobs in jobs_by_node(alerts).items():
        for job in jobs:
            found.setdefault(job, set()).add(node)
    return found


def with_listed_nodes(
    job_nodes: Mapping[str, set[str]], listed: Mapping[str, Iterable[str]]
) -> dict[str, set[str]]:
    """Pure: the jobs' nodes from their alerts, joined with the nodes their TrainingJobs list
    (`status.nodes`, written by the operator; a job not read keeps its alert-named nodes)."""
    joined = {job: set(nodes) for job, nodes in job_nodes.items()}
    for job, nodes in listed.items():
        joined.setdefault(job, set()).update(nodes)
    return joined


def summary(candidate: Candidate) -> str:
    """Pure: "cordon gpu-node-17: 3 xid:79 ..." as the card's first line says it."""
    health = candidate.health
    faults = ", ".join(f"{count} {kind}" for kind, count in sorted(health.faults.items()))
    return f"cordon {health.node}: {faults} (score {health.score:.1f})"
