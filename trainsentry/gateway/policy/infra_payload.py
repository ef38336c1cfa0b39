"""What an infrastructure incident's messages carry (pure): its summary (the payload's
`infrastructure` field), the card's title and summary line, and the payload a channel renders
(infra.py emits the messages; infra_words.py has the words they are made of).

Invariant: a job's own message (its notice, its page) names its job only: it goes to the
job's destinations, never another job's (issue 43).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainsentry.gateway.policy.infra_words import (
    consequence_words,
    counted,
    lead_line,
    likely_cause,
)
from trainsentry.gateway.policy.rules import Policy

if TYPE_CHECKING:
    from trainsentry.gateway.policy.infra import InfraState, Sighting

MAX_LISTED = 200  # nodes, jobs and firing alerts kept per incident


class InfraMessageKind(enum.StrEnum):
    """What an infrastructure incident's message is (its payload's `event`)."""

    OPENED = "infra_opened"
    PAGE = "infra_page"  # a P0 reached an incident that had not paged yet
    JOB_NOTICE = "infra_job_notice"
    JOB_PAGE = "infra_job_page"  # a job's own page, on its own route (its paging channels)
    UPDATE = "infra_update"  # a job's first consequence, told on the incident (never paging)
    RESOLVED = "infra_resolved"


def summary_of(state: InfraState, policy: Policy, sighting: Sighting) -> dict[str, Any]:
    """Pure: the payload's `infrastructure` field: the incident as data (its nodes, jobs and
    ports with what the store saw under the element, bounded by MAX_LISTED)."""
    nodes = sorted(set(state.nodes) | sighting.nodes)[:MAX_LISTED]
    jobs = sorted(set(state.jobs) | sighting.jobs)[:MAX_LISTED]
    ports = sorted(set(state.ports) | sighting.ports)[:MAX_LISTED]
    return {
        "key": state.key,
        "level": state.level,
        "element": state.element,
        "episode": state.episode,
        "lead": lead_line(state.element, len(nodes), len(ports), state.consequences),
        "nodes": nodes,
        "jobs": jobs,
        "ports": len(ports),
        "port_names": ports[:20],
        "consequences": dict(sorted(state.consequences.items())),
        "firing": len(state.firing),
        "folded": state.folded,
        "components": dict(sorted(state.components.items())),
        "alertnames": dict(sorted(state.alertnames.items(), key=lambda kv: (-kv[1], kv[0]))),
        "likely_cause": likely_cause(state.level, state.element, state.components),
        "window_s": int(policy.infrastructure.window),
        "threshold": policy.infrastructure.nodes,
    }


def words(
    kind: InfraMessageKind, state: InfraState, summary: dict[str, Any], job: str, about: str
) -> tuple[str, str]:
    """Pure: the card's title (the element first; a job notice's title leaves the job to
    the card, which names it) and its summary line."""
    nodes, jobs = summary["nodes"], summary["jobs"]
    where = f"{state.level} {state.element}"
    if kind in (InfraMessageKind.JOB_NOTICE, InfraMessageKind.JOB_PAGE):
        title = lead_line(state.element, len(nodes), summary["ports"])
        paged = "its on-call is paged once for it" if job in state.job_paged else "not paged here"
        return title, (
            f"{job} is hit by the failure at {where}: the hardware alerts of its nodes are "
            f"followed on the incident's card, {paged} (so far: hardware alerts on "
            f"{counted(len(nodes), 'node')}, {counted(len(jobs), 'job')} hit)."
        )
    title = summary["lead"]
    if kind is InfraMessageKind.UPDATE:
        said = consequence_words(state.consequences.get(about, ""))
        return title, f"{about} {said}: followed on this incident, not paged again."
    what = {
        InfraMessageKind.RESOLVED: "over",
        InfraMessageKind.PAGE: f"raised to {state.peak.value}",
    }.get(kind, "opened")
    of_jobs = f" of {counted(len(jobs), 'job')}" if jobs else ""
    return title, (
        f"Infrastructure incident at {where} {what}: hardware alerts on "
        f"{counted(len(nodes), 'node')}{of_jobs}"
    )


def own_summary(summary: dict[str, Any], job: str) -> dict[str, Any]:
    """Pure: the incident's summary as a job's own message carries it: no other job named
    (its jobs, consequences and lead are the job's alone; the counts stay)."""
    mine = {name: said for name, said in summary["consequences"].items() if name == job}
    lead = lead_line(summary["element"], len(summary["nodes"]), summary["ports"], mine)
    return {**summary, "jobs": [job], "consequences": mine, "lead": lead}


def payload_of(
    kind: InfraMessageKind,
    state: InfraState,
    summary: dict[str, Any],
    at: datetime,
    job: str,
    about: str = "",
) -> dict[str, Any]:
    """Pure: what a channel renders for an incident's message of `kind` (`job`: the job of
    its notice or page, which then names no other job; `about`: the job an update tells
    of)."""
    where = f"{state.level} {state.element}"
    nodes, jobs = summary["nodes"], summary["jobs"]
    resolved = kind is InfraMessageKind.RESOLVED
    title, text = words(kind, state, summary, job, about)
    ports = f"Ports: {summary['ports']}\n" if summary["ports"] else ""
    named = ", ".join(jobs) or "(none named)"
    if job:  # a job's own message names its job only (it goes to the job's destinations)
        others = len(set(jobs) - {job})
        named = job + (f" (and {counted(others, 'other job')})" if others else "")
        summary = own_summary(summary, job)
    description = (
        f"Nodes: {', '.join(nodes)}\n{ports}Jobs: {named}\nLikely cause: {summary['likely_cause']}"
    )
    payload: dict[str, Any] = {
        "priority": state.peak.value,
        "status": "resolved" if resolved else "firing",
        "event": kind.value,
        "alertname": title,
        "annotations": {"summary": text, "description": description},
        # the rule, not the cause again (the description's last line says it)
        "reason": f"Hardware alerts on {counted(len(nodes), 'node')} under {where}; "
        f"{summary['threshold']} within {summary['window_s']} s make one incident.",
        "rule_id": "infrastructure",
        "topology": {state.level: state.element},
        "infrastructure": summary,
        "at": at.isoformat(),
    }
    if job:
        payload["job"] = job
    return payload
