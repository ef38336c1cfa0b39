"""The console's view types: what the templates draw. Built by views.py (pure) from store
rows; every string in them that came from labels or annotations is attacker-controlled and
is escaped by the templates (jinja2 autoescape), never marked safe."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

PRIORITIES = ("P0", "P1", "P2", "P3")


@dataclass(frozen=True, slots=True)
class Filters:
    """The Now page's filters (query parameters), each checked by views.parse_filters."""

    priority: str = ""
    namespace: str = ""
    job: str = ""
    component: str = ""

    def query(self) -> dict[str, str]:
        return {k: v for k, v in self.as_dict().items() if v}

    def as_dict(self) -> dict[str, str]:
        return {
            "priority": self.priority,
            "namespace": self.namespace,
            "job": self.job,
            "component": self.component,
        }


@dataclass(frozen=True, slots=True)
class Card:
    """One open (or resolved) alert occurrence in a list."""

    id: int
    alertname: str
    priority: str
    summary: str
    started: datetime
    age: str
    acked_by: str | None
    node: str
    gpu: str
    component: str
    namespace: str
    job: str
    resolved: datetime | None = None
    muted_by: str = ""  # the maintenance window holding its notices back (its reason or id)


@dataclass(frozen=True, slots=True)
class Storm:
    since: str  # the episode's ISO start, as the policy stored it
    total: int


@dataclass(frozen=True, slots=True)
class IncidentGroup:
    """One incident on the Now page: its firing alerts drawn (of the job's, the most urgent
    the page draws) inside it, and how many it has."""

    id: int
    title: str  # its cause's alertname
    priority: str
    firing: int  # its alerts firing now, drawn or not
    total: int
    nodes: int
    acked_by: str | None
    started: datetime
    age: str
    cards: list[Card]
    note: str = ""  # why it pages on its own during a storm

    @property
    def more(self) -> int:
        """Firing in the incident but not drawn here (the page draws the most urgent)."""
        return max(0, self.firing - len(self.cards))


@dataclass(frozen=True, slots=True)
class JobGroup:
    namespace: str
    job: str
    cards: list[Card]
    counts: dict[str, int]
    storm: Storm | None = None
    unacked: int = 0
    total: int = 0  # open in the job, drawn or not (>= len(cards))
    incidents: list[IncidentGroup] = field(default_factory=list)  # its drawn cards, by incident
    loose: list[Card] = field(default_factory=list)  # drawn cards in no incident (yet)

    @property
    def more(self) -> int:
        """Open in the job but not drawn: the page draws the most urgent only."""
        return max(0, self.total - len(self.cards))

    @property
    def title(self) -> str:
        if not self.job:
            return "alerts without a training job"
        return f"{self.namespace}/{self.job}" if self.namespace else self.job

    @property
    def top(self) -> str:
        return next((p for p in PRIORITIES if self.counts.get(p)), "P3")


@dataclass(frozen=True, slots=True)
class OnShift:
    """One person on call on a schedule: their layer, and until when (None: open-ended)."""

    name: str
    layer: str
    until: datetime | None


@dataclass(frozen=True, slots=True)
class OnCall:
    """Who is on call now, as the gateway knows it (None in NowView: it does not): the
    `oncall:` schedules (primary first, with until-times), else the inline roster's layers."""

    layers: list[tuple[str, list[str]]]  # (layer name, people)
    source: str
    schedules: list[tuple[str, list[OnShift]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Window:
    """A maintenance window not over yet (gateway/stages/services/maintenance.py)."""

    id: str
    reason: str
    matchers: str  # "node=gpu-node-17, gpu~0|1"
    created_by: str
    active: bool
    until: datetime | None  # the end of the stretch now (active), else of the window


@dataclass(frozen=True, slots=True)
class Muted:
    """The maintenance window that held an alert's notices back."""

    window_id: str
    reason: str
    state: str  # muted | notified | resolved
    until: datetime | None


@dataclass(frozen=True, slots=True)
class NowView:
    groups: list[JobGroup]
    total: int
    counts: dict[str, int]
    filters: Filters
    truncated: bool  # fewer cards drawn than `total`
    choices: dict[str, list[str]]  # the values seen, for the filter selects
    shown: int = 0  # cards drawn
    oncall: OnCall | None = None
    windows: list[Window] | None = None


@dataclass(frozen=True, slots=True)
class RankCell:
    rank: int
    state: str  # culprit | nodump | notstarted | slow | arrived | ok | unknown
    note: str


@dataclass(frozen=True, slots=True)
class Diagnosis:
    verdict: str
    summary: str
    culprits: list[int]
    cells: list[RankCell]
    ranks: int
    grid_truncated: bool
    collective: str  # "all_reduce #412"
    group: str  # the process group's description / communicator
    waited_s: float | None
    failed: list[str]
    slow: list[dict[str, Any]]
    stacks: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    at: datetime
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class Delivery:
    channel: str
    kind: str
    status: str
    created: datetime
    sent: datetime | None
    attempts: int
    to: str
    error: str
    reason: str


@dataclass(frozen=True, slots=True)
class Link:
    text: str
    url: str


@dataclass(frozen=True, slots=True)
class AlertView:
    card: Card
    status: str
    labels: list[tuple[str, str]]
    annotations: list[tuple[str, str]]
    timeline: list[TimelineEntry]
    deliveries: list[Delivery]
    links: list[Link]
    priority_reason: str
    diagnosis: Diagnosis | None
    acked_at: datetime | None
    muted: Muted | None = None
    incident_id: int | None = None  # the incident it is in (None: none yet)


@dataclass(frozen=True, slots=True)
class IncidentPage:
    """One incident: its state and counts, its alerts (the first drawn), the events of its
    alerts, the notifications and calls made for it, and its cause alert in full."""

    id: int
    title: str  # its cause's alertname
    cause: str  # alertname/component
    priority: str
    status: str
    job: str
    started: datetime
    age: str
    resolved: datetime | None
    acked_by: str | None
    acked_at: datetime | None
    firing: int
    total: int
    nodes: int
    gpus: int
    note: str
    alerts: list[Card]
    timeline: list[TimelineEntry]
    deliveries: list[Delivery]
    cause_view: AlertView | None  # the alert its cards are about (None: purged)
    escalate_alert: int | None  # the alert its phone escalation is keyed by

    @property
    def more(self) -> int:
        return max(0, self.total - len(self.alerts))


@dataclass(frozen=True, slots=True)
class Hardware:
    kind: str  # node | GPU | IB port
    name: str
    alerts: int


@dataclass(frozen=True, slots=True)
class JobView:
    namespace: str
    job: str
    cards: list[Card]
    hardware: list[Hardware]
    by_alertname: list[tuple[str, int]]
    days: int


# The on-call, silences and windows, nodes and history pages (ops_views.py builds them).


@dataclass(frozen=True, slots=True)
class LayerRow:
    """One layer of a schedule as configured, and whom it puts on call now."""

    name: str
    members: list[str]
    shift: str  # "1 w", "12 h"
    start: str  # its first handoff, local wall time
    restrict: str  # "Mon 09:00-17:00, ..." or ""
    now: str  # the member it puts on call now ("" where it covers nothing now)


@dataclass(frozen=True, slots=True)
class OverrideRow:
    """An override or swap not over yet: stored at run time (`id`, removable), or
    configured (`id` None)."""

    id: int | None
    kind: str  # override | swap
    who: str
    replaces: str
    start: datetime
    end: datetime
    reason: str
    created_by: str
    active: bool  # in force now (else: to come)


@dataclass(frozen=True, slots=True)
class ScheduleView:
    name: str
    timezone: str
    now: list[OnShift]  # primary first
    next_at: datetime | None  # when someone else is first (None: not within the horizon)
    next: list[OnShift]  # who is on call from then
    layers: list[LayerRow]
    overrides: list[OverrideRow]


@dataclass(frozen=True, slots=True)
class OncallPage:
    schedules: list[ScheduleView]
    people: list[str]
    roster: OnCall | None  # the inline escalation roster, where no schedule is configured


@dataclass(frozen=True, slots=True)
class SilenceRow:
    """An Alertmanager silence the gateway made (an ack with a duration) whose length has
    not run out, with its state in Alertmanager (expired: someone ended it early there)."""

    silence_id: str
    by: str
    at: datetime
    until: datetime
    alert_id: int
    alertname: str
    node: str
    job: str
    state: str = ""  # Alertmanager's (active, pending, expired); "" when it did not say


@dataclass(frozen=True, slots=True)
class Preview:
    """What a window asked for would match: when, and the open alerts its matchers hold for
    (of the `checked` most urgent open alerts, of `open_total`)."""

    matchers: str
    active_now: bool
    first: tuple[datetime, datetime] | None  # its stretch now, else its first one
    matched: list[Card]
    total: int  # matched among those checked (drawn: the first MAX_PREVIEW)
    checked: int
    open_total: int


@dataclass(frozen=True, slots=True)
class NodeRow:
    node: str
    score: float
    faults: str  # "fell_off_bus 3, xid 1"
    gpus: str  # "3 (2.1), 5 (0.4)"
    last_fault: datetime | None
    place: str  # "rack=r7, leaf=l2"
    cordon: str  # recommended | cordoned | dismissed | uncordoned | ""
    cordon_by: str
    cordon_at: datetime | None
    cordon_reason: str
    incidents: list[tuple[int, str, str]]  # (id, priority, cause) of its open incidents
    infra: list[str]  # the open infrastructure incidents over its place ("rack=r7")


@dataclass(frozen=True, slots=True)
class InfraRow:
    """An open infrastructure incident (one topology element: gateway/policy/infra.py)."""

    key: str
    nodes: list[str]
    peak: str
    since: str
    alertnames: str


@dataclass(frozen=True, slots=True)
class NodesPage:
    nodes: list[NodeRow]
    total: int  # nodes known (drawn: the first MAX_NODES)
    infra: list[InfraRow]
    half_life_s: float
    cordon: str  # the cordon mode: off | approve | auto ("off" without a remediation section)
    threshold: float | None


@dataclass(frozen=True, slots=True)
class HistoryIncident:
    """One resolved incident in History: its cause, priority, how long it lasted, how long
    until someone acknowledged it and who, and its first alerts."""

    id: int
    title: str
    cause: str
    priority: str
    job: str
    opened: datetime
    resolved: datetime | None
    duration: str
    to_ack: str  # "" when nobody acknowledged it
    acked_by: str | None
    total: int
    nodes: int
    alerts: list[Card]

    @property
    def more(self) -> int:
        return max(0, self.total - len(self.alerts))
