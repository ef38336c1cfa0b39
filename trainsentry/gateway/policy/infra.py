"""Infrastructure incidents across jobs (pure), beside the per-job storm logic (storm.py).

Hardware alerts (component `fabric`, `node` or `gpu`, an XID code or a hardware rule of the
classification) of trusted evidence (tenancy.py: the chart's cluster-wide rules, no
`namespace` label) on at least N distinct nodes under one topology element (a leaf switch, a
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
- a job hit whose own route pages other people than the incident's page (its on-call
  roster, or another escalation policy: `PagesApart`) gets its own page, once per incident,
  through its route's paging channels, tied to the job's alert that owed it (so its team's
  ack of its job's alerts stops it, and no other escalation); the jobs of the gateway's own
  route are covered by the incident's page (no second call to the same people);
- resolves of folded alerts fold into it too; when the last one resolves, one closing card
  goes to the infrastructure route with everything the incident gathered.

A fabric failure's consequences are the incident's too: the job-level alerts that follow
(NCCL RAS errors, stalls, hangs: correlate.py's CONSEQUENCE) join the per-alert incident of
the folded hardware alerts (incident.py, by failure domain), which remembers the element
that speaks for it (`IncidentState.infra`); `fold_consequence` then records them on the
element's incident: the job is named (its notice if new), what happened to it is told once
per job (`infra_update`, never paging), and no second card or escalation opens.

Only trusted evidence counts or folds (`infrastructure_component`): a team writes its own rules
and can raise a hardware alert for any node, so its hardware alerts never count towards an
element's threshold and are never folded into (nor keep open) an element's incident; they
stay in its own job's incidents (incident.py), which page its own route. A job's alert that
joined a cluster incident the element speaks for is a consequence (`fold_consequence`): it
names the job, never counts a node.

The card leads with the element: "leaf-a down: 64 ports on 8 nodes; team-a/llama-70b hung"
(`lead_line`), never with one node's port.

The count is taken from the stored alerts, so alerts that arrive together are folded from
the first; one that comes before the threshold is reached waits for it (infra_hold.py).
Invariants: one open incident per element; the states' lists are bounded (MAX_LISTED); the
idempotency of each message depends only on (element, episode, kind, job or number).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert, Priority
from trainsentry.gateway.policy.classify import Classification, xid_code
from trainsentry.gateway.policy.infra_payload import (
    MAX_LISTED,
    InfraMessageKind,
    payload_of,
    summary_of,
)
from trainsentry.gateway.policy.infra_words import (
    PLACEMENT,
    stronger,
)
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.tenancy import trusted
from trainsentry.gateway.policy.topology import Topology, place_of
from trainsentry.labels import hca_port, job_text
from trainsentry.userregex import full_match

INFRA_KIND = "infra"  # NotificationDraft.kind of an incident's card and of its job notices
INFRA_ALERTNAME = "InfrastructureIncident"
_JOB_NOTICE_LABELS = frozenset({"namespace", "trainingjob", "job_name", "priority"})
# (priority, a job's alert's labels, the incident's labels) -> whether a page of that
# priority about the job calls other people than the incident's page does (its job's
# roster, another escalation policy); drafts.py `Drafts.pages_apart`.
PagesApart = Callable[[Priority, Mapping[str, str], Mapping[str, str]], bool]


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


def infrastructure_component(alert: Alert, policy: Policy) -> str:
    """Pure: the hardware component an alert counts as towards an infrastructure incident:
    `hardware_component` of trusted evidence (tenancy.py `trusted`: no `namespace` label),
    "" for any tenant's alert (its labels, node included, are its own word)."""
    return hardware_component(alert, policy) if trusted(alert.labels) else ""


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
    ports: frozenset[str] = frozenset()  # "node device port" of its fabric alerts


def port_key(alert: Alert) -> str:
    """Pure: "gpu-node-00 mlx5_0 port 1" for an alert about an HCA port, else ""."""
    port = hca_port(alert.labels)
    return f"{alert.node} {port}" if port and alert.node else ""


def sightings(alerts: Iterable[Alert], topology: Topology, policy: Policy) -> dict[str, Sighting]:
    """Pure: per element key, the distinct nodes and jobs of the hardware `alerts` of
    trusted evidence (`infrastructure_component`; the firing occurrences that started within
    the window on nodes the topology places). A tenant's alert counts no node."""
    nodes: dict[str, set[str]] = {}
    jobs: dict[str, set[str]] = {}
    ports: dict[str, set[str]] = {}
    levels = _levels(topology.levels, policy)
    for alert in alerts:
        if not infrastructure_component(alert, policy):
            continue
        place = place_of(topology, alert)
        for level in levels:
            if level in place:
                key = element_key(level, place[level])
                nodes.setdefault(key, set()).add(alert.node)
                if job := job_text(alert.labels):
                    jobs.setdefault(key, set()).add(job)
                if port := port_key(alert):
                    ports.setdefault(key, set()).add(port)
    return {
        key: Sighting(frozenset(found), frozenset(jobs.get(key, ())), frozenset(ports.get(key, ())))
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
    ports: tuple[str, ...] = ()  # "node device port" of the fabric alerts folded
    consequences: Mapping[str, str] = field(default_factory=dict)  # job -> alertname
    updated: tuple[str, ...] = ()  # jobs whose consequence the incident told this episode
    job_paged: tuple[str, ...] = ()  # jobs paged on their own route this episode
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
            "ports": list(self.ports),
            "consequences": dict(self.consequences),
            "updated": list(self.updated),
            "job_paged": list(self.job_paged),
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
            ports=tuple(data.get("ports", ())),
            consequences=dict(data.get("consequences") or {}),
            updated=tuple(data.get("updated", ())),
            job_paged=tuple(data.get("job_paged", ())),
            peak=Priority(data.get("peak", "P3")),
            paged=bool(data.get("paged", False)),
            incidents=int(data.get("incidents", 0)),
        )


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
    about: str = ""  # the job an update tells of (routed to the incident, not the job)

    @property
    def ident(self) -> tuple[str, ...]:
        """What the message's idempotency key is built from (with the channel)."""
        return (INFRA_KIND, self.kind.value, self.key, self.episode, self.job or self.about)


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
        self.taken = ""  # the key of the incident the last fold went to
        self.paged_job = ""  # the job the last `fold_consequence` paged on its own route

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

    def component(self, alert: Alert, classification: Classification) -> str:
        """The hardware component of a trusted alert of a placed node an incident may take
        (`infrastructure_component`, or `gpu` when a hardware rule classified it), else ""."""
        component = infrastructure_component(alert, self.policy)
        if not component and trusted(alert.labels) and _hardware_by_rule(classification):
            component = "gpu"
        if not self.policy.infrastructure.enabled or not alert.node or not self.levels:
            return ""
        return component

    def keys(self) -> tuple[str, ...]:
        """The element keys of the alert's place, the levels looked at."""
        return tuple(self._key(level) for level in self.levels)

    def fold_firing(
        self, alert: Alert, alert_id: int | None, classification: Classification, at: datetime
    ) -> bool:
        """Folds a firing notice of a hardware alert of trusted evidence; False when no
        incident takes it (a tenant's alert is never folded: it stays in its own job's
        incident, which pages its own route)."""
        component = self.component(alert, classification)
        if not component:
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
                ports=tuple(sorted(sighting.ports))[:MAX_LISTED],
                consequences={},
                updated=(),
                job_paged=(),
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
            ports=_bounded_add(state.ports, port_key(alert)),
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
        state = self._notice(state, job, at)
        self.taken = state.key
        self._keep(state)
        return True

    def _notice(self, state: InfraState, job: str, at: datetime) -> InfraState:
        """The job's one notice of this episode, if it has not had it."""
        if job and job not in state.noticed and len(state.noticed) < MAX_LISTED:
            state = replace(state, noticed=(*state.noticed, job))
            self._emit(InfraMessageKind.JOB_NOTICE, state, at, paging=False, job=job)
        return state

    def fold_consequence(
        self, key: str, alert: Alert, alert_id: int | None, classification: Classification,
        at: datetime, pages_apart: PagesApart | None = None,
    ) -> bool:  # fmt: skip
        """Folds a firing alert of an incident (incident.py) that the open incident `key`
        speaks for: a job's consequence of the failure (its RAS errors, stall, hang) or a
        late alert correlated to it. It names the job (its notice if new), and the job's
        first consequence is told once on the incident (`infra_update`, never paging); a
        P0 pages only if the incident has not paged yet. The job's `PLACEMENT` alert (its
        pods are on the failed nodes) names the job only: no consequence yet, no update.
        `pages_apart`: given for an alert of its job's own incident (a job of a route of
        its own: incident.py `_part`), not acknowledged; once the incident is P0, the job's
        page is owed when it says the job's route calls other people (`_job_page_owed`).
        False when `key` is not open."""
        self.paged_job = ""
        state = self.states.get(key)
        if not self.policy.infrastructure.enabled or state is None or not state.open:
            return False
        job = job_text(alert.labels)
        consequences = dict(state.consequences)
        known = consequences.get(job)
        room = len(consequences) < MAX_LISTED
        told = alert.name != PLACEMENT
        if job and told and ((known is None and room) or (known and stronger(alert.name, known))):
            consequences[job] = alert.name
        priority = classification.priority
        state = replace(
            state,
            last_at=at,
            jobs=_bounded_add(state.jobs, job),
            consequences=consequences,
            alertnames=_bump(state.alertnames, alert.name or "(unnamed)"),
            folded=state.folded + 1,
            peak=priority if priority.at_least(state.peak) else state.peak,
        )
        if priority is Priority.P0 and not state.paged:
            state = replace(state, paged=True)
            self._emit(InfraMessageKind.PAGE, state, at, paging=True, alert_id=alert_id)
        paging = self._job_page_owed(state, job, pages_apart)
        if paging:
            state = replace(state, job_paged=(*state.job_paged, job))
        state = self._notice(state, job, at)
        if paging:
            self.paged_job = job
            kind = InfraMessageKind.JOB_PAGE
            self._emit(kind, state, at, paging=True, job=job, alert_id=alert_id)
        if job in consequences and job not in state.updated and len(state.updated) < MAX_LISTED:
            state = replace(state, updated=(*state.updated, job))
            self._emit(InfraMessageKind.UPDATE, state, at, paging=False, about=job)
        self.taken = state.key
        self._keep(state)
        return True

    def _job_page_owed(self, state: InfraState, job: str, pages_apart: PagesApart | None) -> bool:
        """Whether the job's own page is owed now: the incident is P0, the job was not paged
        this episode, and its route calls other people than the incident's page."""
        return (
            pages_apart is not None
            and bool(job)
            and state.peak is Priority.P0
            and job not in state.job_paged
            and len(state.job_paged) < MAX_LISTED
            and pages_apart(state.peak, self.job_labels, self.incident_labels(state))
        )

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
        about: str = "",
    ) -> None:
        summary = summary_of(state, self.policy, self.seen.get(state.key, Sighting()))
        payload = payload_of(kind, state, summary, at, job, about)
        if alert_id is not None:
            payload["alert_id"] = alert_id
        labels = dict(self.job_labels) if job else self.incident_labels(state)
        priority = state.peak
        if kind in (InfraMessageKind.JOB_NOTICE, InfraMessageKind.JOB_PAGE):
            # shown: what names the job and the incident, not the one alert that told of it
            # (its node and HCA are one of many: the incident's card lists them)
            payload["labels"] = {
                **{k: v for k, v in self.job_labels.items() if k in _JOB_NOTICE_LABELS},
                **self.incident_labels(state),
            }
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
                about=about,
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
