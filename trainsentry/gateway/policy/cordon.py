"""Cordon with a human in the loop (pure): which sick nodes to recommend, whether a
cordon may go ahead now, and who may decide.

A node whose hardware fault score (gateway/policy/health.py) reaches
`remediation.threshold` is recommended once, counting only the occurrences of trusted
evidence (tenancy.py: the chart's cluster-wide rules, no `namespace` label; a team writes its
own rules and can raise `GPUFellOffBus{node=...}` for any node, and Prometheus confirms
that it fired: its rule did fire it) that Prometheus confirmed it fired
(gateway/policy/evidence.py; the stage passes those alone). After a
decision (dismissed, cordoned then uncordoned) only faults that started after it count
towards the next recommendation, so a dismissed node gets no new card until it fails again.

Guards, checked before every cordon (approved or automatic):
- share: after the cordon, no job has more than `max_job_share` of its nodes cordoned. The
  jobs on a node and their nodes come from the cluster: every TrainingJob whose
  `status.nodes` (the operator writes it) lists the node counts with those nodes, whatever
  the alerts say. A job the node's alerts name that the cluster lists no nodes for counts
  as that node alone (1 of 1: refused below a share of 1), and when the TrainingJobs could
  not be listed at all the cordon is refused: knowing too little makes the guard stricter;
- rate: at most `max_per_hour` cordons in the last hour, whoever approved them;
- infrastructure (auto mode only): no open infrastructure incident covers an element of the
  node's place (then the switch or the PDU is broken, not the node).

Only the people of `approvers` (names of `oncall.people`, pressing as their
`feishu_open_id`, or Feishu open_ids) decide a recommendation.

Every function takes the time as a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from trainsentry.alerts import Alert
from trainsentry.config.remediation import OPEN_ID, CordonSettings, Mode
from trainsentry.gateway.policy.health import NodeHealth, fault_of, score_nodes
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.tenancy import trusted
from trainsentry.labels import job_text
from trainsentry.oncall.types import Person

MAX_JOBS_LISTED = 20  # jobs named on a card and kept in a node's state


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
    card: tuple[str, ...] = ()  # the nodes on this node's card (folded), itself included

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "at": self.at.isoformat(),
            "by": self.by,
            "score": round(self.score, 3),
            "faults": dict(self.faults or {}),
            "jobs": list(self.jobs),
            "reason": self.reason,
            "card": list(self.card),
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
            card=tuple(str(node) for node in data.get("card") or ()),
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    health: NodeHealth
    jobs: tuple[str, ...]  # namespace/name: the jobs the cluster lists on it, and its alerts name


def jobs_by_node(alerts: Iterable[Alert]) -> dict[str, set[str]]:
    """Pure: node -> the jobs (`namespace/name`) whose alerts named it."""
    found: dict[str, set[str]] = {}
    for alert in alerts:
        job = job_text(alert.labels)
        if alert.node and job:
            found.setdefault(alert.node, set()).add(job)
    return found


def counted_faults(
    alerts: Iterable[Alert], policy: Policy, decisions: Mapping[str, NodeDecision], now: datetime
) -> list[Alert]:
    """Pure: the hardware fault occurrences that would count towards a recommendation now:
    of trusted evidence (`tenancy.trusted`: never a team's own alert), within the horizon,
    of a node with no recommendation out and not cordoned, and started after the node's
    last decision."""
    horizon = policy.node_health.horizon
    found = []
    for alert in alerts:
        before = decisions.get(alert.node)
        if not alert.node or (now - alert.starts_at).total_seconds() > horizon:
            continue
        if not trusted(alert.labels):
            continue
        if before is not None and (
            before.status in (Status.RECOMMENDED, Status.CORDONED) or alert.starts_at <= before.at
        ):
            continue
        if fault_of(alert, policy) is not None:
            found.append(alert)
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
    with a recommendation out or cordoned are never candidates. `alerts`: the occurrences
    that may count (the stage passes the confirmed ones); `jobs` are those they name."""
    if settings.cordon is Mode.OFF:
        return []
    occurrences = list(alerts)
    counted = counted_faults(occurrences, policy, decisions, now)
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
    job_nodes: Mapping[str, set[str]] | None,
    now: datetime,
    *,
    automatic: bool,
    incident_elements: Iterable[str] = (),
) -> str | None:
    """Pure: why `node` may not be cordoned now (a sentence), or None when it may.
    `job_nodes`: job -> its nodes, for the jobs on the node (`share_nodes`); None when the
    jobs could not be read (refused unless `max_job_share` is 1); `incident_elements`:
    `level=element` of the open infrastructure incidents covering the node's place."""
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
    if job_nodes is None:
        if settings.max_job_share >= 1:
            return None
        return (
            f"the jobs on {node} are unknown (TrainingJobs could not be listed): "
            "remediation.max_job_share cannot be checked"
        )
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


def share_nodes(
    node: str, listed: Mapping[str, Iterable[str]], named: Iterable[str]
) -> dict[str, set[str]]:
    """Pure: job -> its nodes, for the jobs on `node`: every job whose TrainingJob lists the
    node in `status.nodes` (`listed`: job -> those nodes, from the cluster), with exactly the
    nodes listed; and each job in `named` (the node's alerts name it) the cluster lists no
    nodes for, as the node alone. A job listed without the node is not on it."""
    found = {job: set(nodes) for job, nodes in listed.items() if node in set(nodes)}
    for job in named:
        if not set(listed.get(job, ())):
            found.setdefault(job, {node})
    return found


def jobs_on(
    node: str, listed: Mapping[str, Iterable[str]], named: Iterable[str]
) -> tuple[str, ...]:
    """Pure: the jobs a card names for `node` (and whose NodeCordoned condition a cordon
    sets): those `share_nodes` counts, sorted, at most MAX_JOBS_LISTED."""
    return tuple(sorted(share_nodes(node, listed, named)))[:MAX_JOBS_LISTED]


def approver_ids(names: Iterable[str], people: Mapping[str, Person]) -> dict[str, str]:
    """Pure: feishu_open_id -> name of each approver: a person of `oncall.people` (pressing as
    their `feishu_open_id`) or a Feishu open_id itself (`ou_...`, its own name). Every entry
    is one of these: the settings refuse any other when they load
    (config.remediation.approver_problems); one that is not is left out."""
    found: dict[str, str] = {}
    for name in names:
        person = people.get(name)
        if person is None and OPEN_ID.fullmatch(name):
            found[name] = name
        elif person is not None and person.feishu_open_id:
            found[person.feishu_open_id] = name
    return found
