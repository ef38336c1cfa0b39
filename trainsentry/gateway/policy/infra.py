"""Infrastructure incidents across jobs (pure), beside the per-job storm logic (storm.py).

Hardware alerts (component `fabric`, `node` or `gpu`, an XID code or a hardware rule of the
classification) on at least N distinct nodes under one topology element (a leaf switch, a
rack: topology.py) that started within W seconds, whatever jobs they belong to, are one
infrastructure incident: the element is broken, not the nodes.

While an element's incident is open, every hardware alert of a node under it is folded into
the incident instead of sent as its own card:
- the incident sends one card to the infrastructure route (`infrastructure.route_labels`)
  naming the element, its nodes, the affected jobs and the likely cause when it opens; if its
  alerts include a P0 it pages once (the page is tied to the P0 alert that raised it, so
  acking that alert stops the escalation), and a P0 arriving later in a lesser incident pages
  once then;
- each affected job gets one short notice per incident, routed like the job's own alerts
  (never paging), that points at the incident;
- resolves of folded alerts fold into it too; when the last one resolves, one closing card
  goes to the infrastructure route with everything the incident gathered.

Alerts planned before the threshold was reached keep the cards they already had (the count
is taken from the stored alerts, so alerts that arrive together are folded from the first).
Invariants: one open incident per element; the states' lists are bounded (MAX_LISTED); the
idempotency of each message depends only on (element, episode, kind, job or number).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert, Priority
from trainsentry.gateway.policy.classify import Classification, xid_code
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.topology import Topology
from trainsentry.labels import job_text
from trainsentry.userregex import full_match

INFRA_KIND = "infra"  # NotificationDraft.kind of an incident's card and of its job notices
INFRA_ALERTNAME = "InfrastructureIncident"
MAX_LISTED = 200  # nodes, jobs and firing alerts kept per incident
_CAUSES = {
    "fabric": "the switch or its cabling (network links of several nodes failed together)",
    "node": "shared power (PDU) or cooling (several nodes failed together)",
    "gpu": "shared power or cooling (GPUs of several nodes failed together)",
}


def hardware_component(alert: Alert, policy: Policy) -> str:
    """Pure: the hardware component an alert is about (`fabric`, `node`, `gpu`, from its
    `component` label, or `gpu` when it carries a known XID code or matches a hardware rule
    of the classification), or "" when it is not a hardware alert or its name matches
    `infrastructure.ignore_alertnames` (a full disk, an OOM: not the hardware)."""
    component = alert.labels.get("component", "")
    ignored = policy.infrastructure.ignore_alertnames
    if ignored and full_match(ignored, alert.name):
        return ""
    if component in policy.infrastructure.components:
        return component
    rules = policy.classification
    code = xid_code(alert, rules.xid_labels)
    if code is not None and code in rules.xid:
        return "gpu"
    return ""


def _hardware_by_rule(classification: Classification) -> bool:
    return any(step.rule_id.startswith(("xid:", "hardware:")) for step in classification.steps)


def element_key(level: str, element: str) -> str:
    return f"{level}={element}"


def _levels(topology_levels: Iterable[str], policy: Policy) -> list[str]:
    wanted = policy.infrastructure.levels
    return [level for level in topology_levels if not wanted or level in wanted]


@dataclass(frozen=True, slots=True)
class Sighting:
    """The hardware alerts seen under one element within the window (from the store)."""

    nodes: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()


def sightings(alerts: Iterable[Alert], topology: Topology, policy: Policy) -> dict[str, Sighting]:
    """Pure: per element key, the distinct nodes and jobs of the hardware `alerts` (the
    firing occurrences that started within the window on nodes the topology places)."""
    nodes: dict[str, set[str]] = {}
    jobs: dict[str, set[str]] = {}
    levels = _levels(topology.levels, policy)
    for alert in alerts:
        if not hardware_component(alert, policy):
            continue
        place = topology.place(alert.node)
        for level in levels:
            if level in place:
                key = element_key(level, place[level])
                nodes.setdefault(key, set()).add(alert.node)
                if job := job_text(alert.labels):
                    jobs.setdefault(key, set()).add(job)
    return {
        key: Sighting(frozenset(found), frozenset(jobs.get(key, ())))
        for key, found in nodes.items()
    }


def _bounded_add(items: tuple[str, ...], value: str) -> tuple[str, ...]:
    if not value or value in items or len(items) >= MAX_LISTED:
        return items
    return tuple(sorted((*items, value)))


def _bump(counts: Mapping[str, int], key: str) -> dict[str, int]:
    updated = dict(counts)
    if key in updated or len(updated) < MAX_LISTED:
        updated[key] = updated.get(key, 0) + 1
    return updated


@dataclass(frozen=True, slots=True)
class InfraState:
    """One topology element's incident (persisted by the store, key `level=element`)."""

    key: str
    level: str
    element: str
    open: bool = False
    episode: str = ""  # ISO time the incident opened
    last_at: datetime | None = None
    nodes: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    noticed: tuple[str, ...] = ()  # jobs that got their notice this episode
    firing: Mapping[str, str] = field(default_factory=dict)  # folded fingerprint -> node
    components: Mapping[str, int] = field(default_factory=dict)
    alertnames: Mapping[str, int] = field(default_factory=dict)
    folded: int = 0  # alert changes folded this episode
    peak: Priority = Priority.P3
    paged: bool = False
    incidents: int = 0  # incidents this element has had

    @classmethod
    def new(cls, level: str, element: str) -> InfraState:
        return cls(key=element_key(level, element), level=level, element=element)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "level": self.level,
            "element": self.element,
            "open": self.open,
            "episode": self.episode,
            "last_at": None if self.last_at is None else self.last_at.isoformat(),
            "nodes": list(self.nodes),
            "jobs": list(self.jobs),
            "noticed": list(self.noticed),
            "firing": dict(self.firing),
            "components": dict(self.components),
            "alertnames": dict(self.alertnames),
            "folded": self.folded,
            "peak": self.peak.value,
            "paged": self.paged,
            "incidents": self.incidents,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InfraState:
        last = data.get("last_at")
        return cls(
            key=data["key"],
            level=data["level"],
            element=data["element"],
            open=bool(data.get("open", False)),
            episode=data.get("episode", ""),
            last_at=None if last is None else datetime.fromisoformat(last),
            nodes=tuple(data.get("nodes", ())),
            jobs=tuple(data.get("jobs", ())),
            noticed=tuple(data.get("noticed", ())),
            firing=dict(data.get("firing") or {}),
            components=dict(data.get("components") or {}),
            alertnames=dict(data.get("alertnames") or {}),
            folded=int(data.get("folded", 0)),
            peak=Priority(data.get("peak", "P3")),
            paged=bool(data.get("paged", False)),
            incidents=int(data.get("incidents", 0)),
        )


class InfraMessageKind(enum.StrEnum):
    OPENED = "infra_opened"
    PAGE = "infra_page"  # a P0 reached an incident that had not paged yet
    JOB_NOTICE = "infra_job_notice"
    RESOLVED = "infra_resolved"


@dataclass(frozen=True, slots=True)
class InfraMessage:
    """Something an incident wants sent: to the infrastructure route, or (a job notice) to
    the job's own route."""

    kind: InfraMessageKind
    key: str
    episode: str
    at: datetime
    priority: Priority
    paging: bool
    labels: Mapping[str, str]  # what it is routed by
    payload: dict[str, Any]
    job: str = ""
    alert_id: int | None = None  # the P0 alert a page is tied to (its ack stops the calls)

    @property
    def ident(self) -> tuple[str, ...]:
        """What the message's idempotency key is built from (with the channel)."""
        return (INFRA_KIND, self.kind.value, self.key, self.episode, self.job)


def likely_cause(state: InfraState) -> str:
    """Pure: words for what probably broke, from the level and the components seen."""
    top = max(state.components.items(), key=lambda kv: (kv[1], kv[0]), default=("", 0))[0]
    what = _CAUSES.get(top, "something the nodes share")
    return f"{state.level} {state.element}: {what}"


def _summary(state: InfraState, policy: Policy, sighting: Sighting) -> dict[str, Any]:
    nodes = sorted(set(state.nodes) | sighting.nodes)[:MAX_LISTED]
    jobs = sorted(set(state.jobs) | sighting.jobs)[:MAX_LISTED]
    return {
        "key": state.key,
        "level": state.level,
        "element": state.element,
        "episode": state.episode,
        "nodes": nodes,
        "jobs": jobs,
        "firing": len(state.firing),
        "folded": state.folded,
        "components": dict(sorted(state.components.items())),
        "alertnames": dict(sorted(state.alertnames.items(), key=lambda kv: (-kv[1], kv[0]))),
        "likely_cause": likely_cause(state),
        "window_s": int(policy.infrastructure.window),
        "threshold": policy.infrastructure.nodes,
    }


def _payload(
    kind: InfraMessageKind, state: InfraState, summary: dict[str, Any], at: datetime, job: str
) -> dict[str, Any]:
    where = f"{state.level} {state.element}"
    nodes, jobs = summary["nodes"], summary["jobs"]
    resolved = kind is InfraMessageKind.RESOLVED
    if kind is InfraMessageKind.JOB_NOTICE:
        title = f"Infrastructure incident at {where} affects {job}"
        text = (
            f"{job} lost nodes to an infrastructure incident at {where}: its hardware alerts "
            f"are followed on the incident's card ({len(nodes)} nodes, {len(jobs)} jobs)."
        )
    else:
        state_word = "over" if resolved else "opened"
        title = f"Infrastructure incident at {where}"
        text = (
            f"Infrastructure incident {state_word} at {where}: hardware alerts on "
            f"{len(nodes)} nodes of {len(jobs)} jobs"
        )
    description = (
        f"Nodes: {', '.join(nodes)}\nJobs: {', '.join(jobs) or '(none named)'}\n"
        f"Likely cause: {summary['likely_cause']}"
    )
    payload: dict[str, Any] = {
        "priority": state.peak.value,
        "status": "resolved" if resolved else "firing",
        "event": kind.value,
        "alertname": title,
        "annotations": {"summary": text, "description": description},
        "reason": f"{len(nodes)} nodes under {where} (>= {summary['threshold']}) reported "
        f"hardware faults within {summary['window_s']}s: {summary['likely_cause']}",
        "rule_id": "infrastructure",
        "topology": {state.level: state.element},
        "infrastructure": summary,
        "at": at.isoformat(),
    }
    if job:
        payload["job"] = job
    return payload


class InfraFold:
    """The incident side of one `decide` call: given the states of the alert's elements and
    what the store saw under them, folds the alert's notices into an incident. Holds the
    updated states (`changed`) and the messages to send (`messages`)."""

    def __init__(
        self,
        policy: Policy,
        place: Mapping[str, str],
        states: Mapping[str, InfraState],
        seen: Mapping[str, Sighting],
        route_labels_of_job: Mapping[str, str],
    ) -> None:
        self.policy = policy
        self.levels = _levels(place, policy)
        self.place = place
        self.states = dict(states)
        self.seen = seen
        self.job_labels = route_labels_of_job
        self.changed: dict[str, InfraState] = {}
        self.messages: list[InfraMessage] = []

    def _key(self, level: str) -> str:
        return element_key(level, self.place[level])

    def _state(self, level: str) -> InfraState:
        key = self._key(level)
        return self.states.get(key) or InfraState.new(level, self.place[level])

    def _target(self, alert: Alert) -> str | None:
        """The level whose incident takes this hardware alert: an open one first, else the
        first whose nodes reach the threshold (this alert's node counted)."""
        for level in self.levels:
            if self._state(level).open:
                return level
        threshold = self.policy.infrastructure.nodes
        for level in self.levels:
            nodes = self.seen.get(self._key(level), Sighting()).nodes | {alert.node}
            if len(nodes) >= threshold:
                return level
        return None

    def fold_firing(
        self, alert: Alert, alert_id: int | None, classification: Classification, at: datetime
    ) -> bool:
        """Folds a firing notice of a hardware alert; False when no incident takes it."""
        component = hardware_component(alert, self.policy)
        if not component and _hardware_by_rule(classification):
            component = "gpu"
        if not self.policy.infrastructure.enabled or not component or not alert.node:
            return False
        level = self._target(alert)
        if level is None:
            return False
        state = self._state(level)
        sighting = self.seen.get(state.key, Sighting())
        opening = not state.open
        priority = classification.priority
        if opening:
            state = replace(
                state,
                open=True,
                episode=at.isoformat(),
                nodes=tuple(sorted(sighting.nodes))[:MAX_LISTED],
                jobs=tuple(sorted(sighting.jobs))[:MAX_LISTED],
                noticed=(),
                firing={},
                components={},
                alertnames={},
                folded=0,
                peak=priority,
                paged=False,
                incidents=state.incidents + 1,
            )
        job = job_text(alert.labels)
        firing = dict(state.firing)
        if len(firing) < MAX_LISTED or alert.fingerprint in firing:
            firing[alert.fingerprint] = alert.node
        state = replace(
            state,
            last_at=at,
            nodes=_bounded_add(state.nodes, alert.node),
            jobs=_bounded_add(state.jobs, job),
            firing=firing,
            components=_bump(state.components, component),
            alertnames=_bump(state.alertnames, alert.name or "(unnamed)"),
            folded=state.folded + 1,
            peak=priority if priority.at_least(state.peak) else state.peak,
        )
        page_now = priority is Priority.P0 and not state.paged
        if page_now:
            state = replace(state, paged=True)
        if opening or page_now:
            kind = InfraMessageKind.OPENED if opening else InfraMessageKind.PAGE
            self._emit(kind, state, at, paging=page_now, alert_id=alert_id if page_now else None)
        if job and job not in state.noticed and len(state.noticed) < MAX_LISTED:
            state = replace(state, noticed=(*state.noticed, job))
            self._emit(InfraMessageKind.JOB_NOTICE, state, at, paging=False, job=job)
        self._keep(state)
        return True

    def fold_resolved(self, alert: Alert, at: datetime) -> bool:
        """Folds the resolve of an alert an open incident took; False when none did."""
        for level in self.levels:
            state = self._state(level)
            if not state.open or alert.fingerprint not in state.firing:
                continue
            firing = {fp: node for fp, node in state.firing.items() if fp != alert.fingerprint}
            state = replace(state, firing=firing, last_at=at, folded=state.folded + 1)
            if not firing:
                self._emit(InfraMessageKind.RESOLVED, state, at, paging=False)
                state = replace(state, open=False)
            self._keep(state)
            return True
        return False

    def _keep(self, state: InfraState) -> None:
        self.states[state.key] = state
        self.changed[state.key] = state

    def _emit(
        self,
        kind: InfraMessageKind,
        state: InfraState,
        at: datetime,
        *,
        paging: bool,
        job: str = "",
        alert_id: int | None = None,
    ) -> None:
        summary = _summary(state, self.policy, self.seen.get(state.key, Sighting()))
        payload = _payload(kind, state, summary, at, job)
        if alert_id is not None:
            payload["alert_id"] = alert_id
        labels = dict(self.job_labels) if job else self.incident_labels(state)
        priority = state.peak
        if kind is InfraMessageKind.JOB_NOTICE:
            payload["labels"] = dict(self.job_labels)
        else:
            payload["labels"] = labels
        self.messages.append(
            InfraMessage(
                kind=kind,
                key=state.key,
                episode=state.episode,
                at=at,
                priority=priority,
                paging=paging,
                labels=labels,
                payload=payload,
                job=job,
                alert_id=alert_id,
            )
        )

    def incident_labels(self, state: InfraState) -> dict[str, str]:
        """The labels an incident's cards are routed by (and show)."""
        return {
            **self.policy.infrastructure.route_labels,
            "alertname": INFRA_ALERTNAME,
            "topology_level": state.level,
            "topology_element": state.element,
        }
