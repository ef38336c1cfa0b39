"""Escalations that follow a TrainingJob's own on-call roster (`spec.alerting.onCallRosterRef`).

Pure: the escalation state (escalation.py) stays one document; an incident opened by a page
of a job with its own roster carries that job's key (`"roster": "namespace/name"`), and each
group of incidents (the gateway's own roster: no key; one group per job) is advanced with
its roster: the job's roster as the gateway last read it, or the gateway's own when the
job's is gone or unusable now (so a page is never left without someone to call). Policy
(threshold, ack timeout, calls per layer) stays the gateway's: the job chooses who is
called, not how often.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from trainsentry.gateway.policy.escalation import CallDue, Escalator, IncidentPage, Roster

ROSTER_KEY = "roster"

RosterOf = Callable[[str], Roster | None]


def _groups(state: Mapping[str, Any]) -> dict[str | None, dict[str, Any]]:
    groups: dict[str | None, dict[str, Any]] = {}
    for key, incident in state["incidents"].items():
        groups.setdefault(incident.get(ROSTER_KEY), {})[key] = incident
    return groups


def _escalator(escalator: Escalator, group: str | None, roster_of: RosterOf) -> Escalator:
    roster = roster_of(group) if group is not None else None
    return escalator if roster is None else Escalator(roster, escalator.policy)


def batch(
    escalator: Escalator,
    state: dict[str, Any],
    now: datetime,
    *,
    pages: Sequence[IncidentPage],
    page_rosters: Mapping[int, str],
    resolved: Collection[int],
    forget_before: datetime | None,
    roster_of: RosterOf,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[dict[str, Any], list[CallDue]]:
    """Pure: `escalation.batch`, each incident with its roster. `page_rosters`: alert id →
    job key, for the pages that follow a job's own roster; an alert already escalating
    stays in its group. `named`: the on-call escalation policies (an incident naming one
    follows it; docs/oncall.md)."""
    groups = _groups(state)
    known = {key: incident.get(ROSTER_KEY) for key, incident in state["incidents"].items()}
    wanted: dict[str | None, list[IncidentPage]] = {}
    for page in pages:
        key = str(page.alert_id)
        group = known[key] if key in known else page_rosters.get(page.alert_id)
        wanted.setdefault(group, []).append(page)
        groups.setdefault(group, {})
    incidents: dict[str, Any] = {}
    calls: list[CallDue] = []
    for group, members in groups.items():
        sub = {**state, "incidents": members}
        new, due = _escalator(escalator, group, roster_of).batch(
            sub,
            now,
            pages=wanted.get(group, ()),
            resolved=resolved,
            forget_before=forget_before,
            named=named,
        )
        for key, incident in new["incidents"].items():
            if group is not None:
                incident[ROSTER_KEY] = group
            incidents[key] = incident
        calls.extend(due)
    calls.sort(key=lambda call: (call.alert_id, call.step))
    return {**state, "incidents": incidents}, calls


def plan(
    escalator: Escalator,
    state: dict[str, Any],
    now: datetime,
    *,
    roster_of: RosterOf,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[dict[str, Any], list[CallDue]]:
    """Pure: `escalation.plan`, each incident with its roster."""
    return batch(
        escalator,
        state,
        now,
        pages=(),
        page_rosters={},
        resolved=(),
        forget_before=None,
        roster_of=roster_of,
        named=named,
    )
