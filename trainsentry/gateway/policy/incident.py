"""Incidents: the unit of notification (pure: no I/O, no clock).

An incident is what one card speaks for, what one phone escalation pages for and what one
acknowledgement covers. By default it holds the alerts of one Alertmanager group (the
webhook's `groupKey`, whose labels say what the admin grouped by), else of one job and
alertname (`policy.grouping`, docs/policy.md "Incidents").

Invariants:
- Every alert occurrence (alert id) is in exactly one incident (`IncidentBook.members`);
  an occurrence never leaves its incident.
- At most one incident per key is open (firing); it resolves when its last firing alert
  resolves, and a later firing of the key opens a new incident.
- "The same cause" is the same alertname and `component` label (`cause_of`). A P0 alert of
  another cause than the open incident of its key opens an incident of its own (key
  `<key>|cause=<cause>`), so it pages on its own instead of updating another card.
- An incident's priority is its most urgent alert's (the blast-radius raise is part of an
  alert's classification, so it counts once for the incident); it never drops while open.
- The cause (`lead`, `cause`) is kept apart from the grouping key: correlation
  (correlate.py, `policy.correlation`) adds alerts of other groups to a node's incident and
  chooses its cause again (`cause_rank`: a better cause becomes the lead); a consequence
  never opens a second incident of its failure domain, so it never pages again.
- A tenant's alert is a stranger's input (tenancy.py): an incident's realm is its opener's;
  an alert joins another realm's incident only as a job's alert in an incident of trusted
  evidence, where it never leads, blinds or indexes it (`_evidence`); no tenant's alert
  finds another tenant's incident (node index entries are per realm, twins index only
  trusted evidence's incidents). A job with a route of its own (`place`'s `own_route`)
  never joins one either: its alerts take its job's part of it (`_part`: an incident of
  the job's realm, `part_of` the other), whose card, page and ack are its job's alone.
  Jobs' alerts that joined one (`strangers`) never keep it open: once its own alerts all
  resolved it is spent (`_retire`): resolved, its escalation ended, its key and failure
  domain left; the jobs' alerts still firing are no longer counted, and their resolves
  later change nothing (`resolve`).
- A cluster-wide alert and its job-scoped copy (twins.py) are one alert: the copy joins the
  incident of the first (`twins`), counts as no new firing alert, and the alert resolves
  when both have, or when the copy of the incident's realm has (a stranger's copy that
  never resolves keeps nothing open: `resolve`).
- An alert whose reporting target is down, or a hardware fault not yet confirmed, that
  resolves stays firing in its incident as "unknown" (`unknown`) until `settle` finds its
  node alive (correlate.py); a new firing of it takes its place.

`IncidentBook` holds the incidents one planning batch touches (mutable, pure);
`incident_drafts` turns a changed incident into notifications: a card, an in-place redraw on
channels that can update a card, follow-ups at most once per `follow_up_interval` on those
that cannot, and the one page.

One piece: `IncidentState` and the `IncidentBook` transitions that keep its invariants
(place, join, twin, correlate, resolve, settle) read and write the same fields together;
split apart, each half would reach into the other's private helpers.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import Alert, JobRef, Priority
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.correlate import (
    BLINDERS,
    CONSEQUENCE,
    FAULT,
    FOREIGN,
    JOB_DOMAIN,
    NODE_DOMAIN,
    blinds,
    node_keys,
    rank,
    without_blast_radius,
)
from trainsentry.gateway.policy.infra_words import PLACEMENT
from trainsentry.gateway.policy.payload_build import (
    alert_from_json,
    alert_to_json,
)
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import job_key, job_title
from trainsentry.gateway.policy.story import HANG, note
from trainsentry.gateway.policy.tenancy import CLUSTER_REALM, realm_key, realm_of
from trainsentry.gateway.policy.twins import twin_identity
from trainsentry.labels import gpu_label, hca_port

FIRING = "firing"
RESOLVED = "resolved"
CAUSE_ROLE = "cause"  # the alert the incident's card is about (re-chosen by correlation)
MEMBER_ROLE = "member"
TWIN_ROLE = "twin"  # a job-scoped (or cluster-wide) copy of an alert of the incident
TWIN_DOMAIN = "twin="  # failure-domain index: a twin identity -> the incident of its alert
CLUSTER = job_title("cluster")  # the job of an alert of no job
COPIED, UNKNOWN, RESOLVED_NOW = "copy", "unknown", "resolved"  # what `resolve` did
LEFT = "left"  # `resolve`: a job's alert a spent incident left firing; its resolve is nothing
STANDBY_MAX = 8  # firing alerts kept as the lead's successors (newest; older ones forgotten)
INCIDENT_CONTEXT = "incident"  # fingerprint context: the occurrence's incident and status
SPENT = "|spent="  # ends the key of an incident whose own evidence is over (`_retire`)

# (priority, labels, paging) -> (channels, route id, extra payload fields): decide.py's route.
Router = Callable[[Priority, Mapping[str, str], bool], tuple[tuple[str, ...], str, dict[str, Any]]]
# alert -> whether its job (or namespace) has a route of its own (drafts.py, route.py)
OwnRoute = Callable[[Alert], bool]


def cause_of(alert: Alert) -> str:
    """Pure: what "the same cause" means: the same alertname and `component` label."""
    return f"{alert.name}/{alert.labels.get('component', '')}"


def base_key(alert: Alert, group_key: str, policy: Policy, apart: str = "") -> str:
    """Pure: the incident key of an alert, as `policy.grouping.by` says. `apart`: the
    maintenance window stretch muting the alert: it groups with the others it mutes, never
    with alerts that notify (the window mutes its incident's cards by their cause alert)."""
    if apart:
        return f"{base_key(alert, group_key, policy)}|maintenance={apart}"
    by = policy.grouping.by
    if by == "alert":
        return f"alert:{alert.fingerprint}@{alert.starts_at.isoformat()}"
    if by == "group_key" and group_key:
        return f"group:{group_key}"
    return f"alertname:{job_key(alert.labels)}/{alert.name}"


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _bump(counts: dict[str, int], key: str, by: int, cap: int) -> bool:
    """Adds `by` to `counts[key]`; False when `key` is new and the map is full."""
    if key not in counts and len(counts) >= cap:
        return False
    counts[key] = max(0, counts.get(key, 0) + by)
    return True


@dataclass(slots=True)
class IncidentState:
    """One incident as the policy keeps it (the store's `incidents` row holds it as JSON)."""

    id: int
    key: str
    cause: str
    job: str
    opened_at: datetime
    # the cause alert: {"alert": alert_to_json, "alert_id": int | None}; the card is about it
    lead: dict[str, Any]
    priority: Priority = Priority.P3
    classification: dict[str, Any] = field(default_factory=dict)  # of the most urgent alert
    status: str = FIRING
    resolved_at: datetime | None = None
    updated_at: datetime | None = None
    total: int = 0  # alerts in it
    firing: int = 0  # of them firing now
    nodes: dict[str, int] = field(default_factory=dict)  # node -> its alerts firing now
    gpus: dict[str, int] = field(default_factory=dict)  # "node/gpu" -> its alerts firing now
    # "node device port" -> its alerts firing now: an HCA's port (labels.hca_port), no GPU
    ports: dict[str, int] = field(default_factory=dict)
    mounts: dict[str, int] = field(default_factory=dict)  # mountpoint -> its alerts firing now
    names: dict[str, int] = field(default_factory=dict)  # alertname -> its alerts firing now
    untracked: int = 0  # alerts whose node or GPU was beyond `max_tracked`
    # what the card's title says: the lone alert's notice (firing, recurrence, flapping,
    # resolved), else firing / resolved; `detail`: that notice's counts
    headline: str = FIRING
    detail: dict[str, Any] = field(default_factory=dict)
    announced: bool = False  # it has (or gets) cards of its own
    folded: bool = False  # a storm summary speaks for it (storm.py)
    version: int = 0  # bumped by every change a card shows
    told: dict[str, dict[str, Any]] = field(default_factory=dict)  # channel -> v, at, mark
    paged: bool = False  # its escalation runs (keyed by `page_alert_id`)
    page_alert_id: int | None = None
    storm_note: str = ""  # why it pages on its own during a storm
    acked_by: str | None = None  # the store's column (stages/services/ack.py); never written here
    due_at: datetime | None = None  # a follow-up waits until then
    # correlation (correlate.py): the failure domain ("node=<node>"), the cause's rank in
    # CAUSE_ORDER, the jobs its alerts belong to, the story (story.py), twin identity ->
    # fingerprints of its copies firing, node -> {twin identity or fingerprint: blinder
    # alertname} firing,
    # and the resolutions not believed yet (twin identity or fingerprint -> what and when)
    domain: str = ""
    cause_rank: int = FOREIGN
    jobs: list[str] = field(default_factory=list)
    story: dict[str, dict[str, Any]] = field(default_factory=dict)
    twins: dict[str, list[str]] = field(default_factory=dict)
    # of `total`, alerts that are another's copy or its firing again after an unknown
    # resolution (one alert to a person)
    copies: int = 0
    blind: dict[str, dict[str, str]] = field(default_factory=dict)
    unknown: dict[str, dict[str, Any]] = field(default_factory=dict)
    # firing alerts of the incident besides its lead, newest last, at most STANDBY_MAX:
    # {"alert", "alert_id", "level"}; the lead moves to one of them when it resolves
    standby: list[dict[str, Any]] = field(default_factory=list)
    # the infrastructure incident ("level=element", infra.py) its hardware alerts were folded
    # into: it speaks for this one, whose later alerts (the failure's consequences) it takes
    infra: str = ""
    # its cards wait for an element's incident (infra_hold.py): {"until": ISO time,
    # "elements": [keys], "page": owed}; {} when not held
    held: dict[str, Any] = field(default_factory=dict)
    # whose evidence it holds (tenancy.py): its opener's realm, "" for trusted cluster-wide
    # evidence; only alerts of that realm lead it, blind it or index it (`_evidence`)
    realm: str = CLUSTER_REALM
    strangers: int = 0  # of `firing`, alerts of another realm (a job's, in the cluster's)
    # why it resolved though jobs' alerts of it still fired (`_retire`); "" when it did not
    spent: str = ""
    # a job's part of an incident of trusted evidence (`IncidentBook.place`): that incident
    part_of: int | None = None
    # for this batch only (not stored)
    trigger: str = ""  # the last change shown: keys the idempotency of its drafts
    # the alert whose drafts this batch's are (held for its diagnosis; None: the lead's)
    trigger_alert_id: int | None = None
    page_due: bool = False
    dirty: bool = False

    @property
    def uid(self) -> str:
        """Stable identity for idempotency keys (the id may differ in a replayed batch)."""
        return f"{self.key}@{self.opened_at.isoformat()}"

    @property
    def mark(self) -> str:
        """What a channel that cannot update must be told at once when it changes: the
        status, priority and title word; for a failure domain's incident also its cause's
        rank (a better cause was found), whether a job is known to be hit (the first job
        named) and whether a job of it hung (the hang and its culprits), so a person learns
        these at once, not a follow-up interval later. Each changes a bounded number of
        times (CAUSE_ORDER only improves; each flag once)."""
        mark = f"{self.status}|{self.priority.value}|{self.headline}"
        if self.domain:
            hung = any(step.get("name") == HANG for step in self.story.values())
            mark += f"|cause={self.cause_rank}|jobs={int(bool(self.jobs))}|hung={int(hung)}"
        return mark

    @property
    def lead_alert_id(self) -> int | None:
        value = self.lead.get("alert_id")
        return int(value) if value is not None else None

    @property
    def lead_labels(self) -> Mapping[str, str]:
        labels: Mapping[str, str] = self.lead.get("alert", {}).get("labels", {})
        return labels

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key,
            "cause": self.cause,
            "job": self.job,
            "opened_at": self.opened_at.isoformat(),
            "lead": self.lead,
            "priority": self.priority.value,
            "classification": self.classification,
            "status": self.status,
            "resolved_at": _iso(self.resolved_at),
            "updated_at": _iso(self.updated_at),
            "total": self.total,
            "firing": self.firing,
            "nodes": dict(self.nodes),
            "gpus": dict(self.gpus),
            "ports": dict(self.ports),
            "mounts": dict(self.mounts),
            "names": dict(self.names),
            "untracked": self.untracked,
            "headline": self.headline,
            "detail": self.detail,
            "announced": self.announced,
            "folded": self.folded,
            "version": self.version,
            "told": self.told,
            "paged": self.paged,
            "page_alert_id": self.page_alert_id,
            "storm_note": self.storm_note,
            "due_at": _iso(self.due_at),
            "domain": self.domain,
            "cause_rank": self.cause_rank,
            "jobs": list(self.jobs),
            "story": self.story,
            "twins": self.twins,
            "copies": self.copies,
            "blind": self.blind,
            "unknown": self.unknown,
            "standby": self.standby,
            "infra": self.infra,
            "held": self.held,
            "realm": self.realm,
            "part_of": self.part_of,
            "strangers": self.strangers,
            "spent": self.spent,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], acked_by: str | None = None) -> IncidentState:
        return cls(
            id=int(data["id"]),
            key=data["key"],
            cause=data.get("cause", ""),
            job=data.get("job", ""),
            opened_at=datetime.fromisoformat(data["opened_at"]),
            lead=dict(data.get("lead") or {}),
            priority=Priority(data.get("priority", "P3")),
            classification=dict(data.get("classification") or {}),
            status=data.get("status", FIRING),
            resolved_at=_dt(data.get("resolved_at")),
            updated_at=_dt(data.get("updated_at")),
            total=int(data.get("total", 0)),
            firing=int(data.get("firing", 0)),
            nodes=dict(data.get("nodes") or {}),
            gpus=dict(data.get("gpus") or {}),
            ports=dict(data.get("ports") or {}),
            mounts=dict(data.get("mounts") or {}),
            names=dict(data.get("names") or {}),
            untracked=int(data.get("untracked", 0)),
            headline=data.get("headline", FIRING),
            detail=dict(data.get("detail") or {}),
            announced=bool(data.get("announced", False)),
            folded=bool(data.get("folded", False)),
            version=int(data.get("version", 0)),
            told={k: dict(v) for k, v in (data.get("told") or {}).items()},
            paged=bool(data.get("paged", False)),
            page_alert_id=data.get("page_alert_id"),
            storm_note=data.get("storm_note", ""),
            acked_by=acked_by,
            due_at=_dt(data.get("due_at")),
            domain=data.get("domain", ""),
            cause_rank=int(data.get("cause_rank", FOREIGN)),
            jobs=list(data.get("jobs") or ()),
            story={k: dict(v) for k, v in (data.get("story") or {}).items()},
            twins={k: list(v) for k, v in (data.get("twins") or {}).items()},
            copies=int(data.get("copies", 0)),
            blind={k: dict(v) for k, v in (data.get("blind") or {}).items()},
            unknown={k: dict(v) for k, v in (data.get("unknown") or {}).items()},
            standby=[dict(entry) for entry in data.get("standby") or ()],
            infra=str(data.get("infra", "")),
            held=dict(data.get("held") or {}),
            realm=str(
                data["realm"]
                if "realm" in data
                else realm_of((data.get("lead") or {}).get("alert", {}).get("labels", {}))
            ),
            part_of=data.get("part_of"),
            strangers=int(data.get("strangers", 0)),
            spent=str(data.get("spent", "")),
        )


def _add_standby(
    state: IncidentState, alert: dict[str, Any], alert_id: int | None, level: int
) -> None:
    """A firing alert of the incident that may lead it later (the newest STANDBY_MAX)."""
    _drop_standby(state, str(alert.get("fingerprint", "")))
    state.standby.append({"alert": alert, "alert_id": alert_id, "level": level})
    del state.standby[:-STANDBY_MAX]


def _drop_standby(state: IncidentState, fingerprint: str) -> None:
    state.standby[:] = [e for e in state.standby if e["alert"].get("fingerprint") != fingerprint]


def _add_job(state: IncidentState, job: JobRef | None) -> bool:
    """The TrainingJob `job` (None for none) joins the incident's `jobs` (as people read it,
    `str(job)`); the first one named becomes the card's job, in place of a cluster-wide
    alert's scrape job or "cluster". Returns whether the job is new to the incident."""
    if job is None or str(job) in state.jobs:
        return False
    if not state.jobs:
        state.job = str(job)
    state.jobs.append(str(job))
    return True


def _evidence(state: IncidentState, alert: Alert) -> bool:
    """Pure: whether the alert is evidence of the incident (tenancy.py): of the incident's
    realm (trusted evidence in an incident it opened, a job's alert in its job's). Only
    evidence leads the incident, blinds its resolutions or indexes its node; a job's alert
    that joined an incident of trusted evidence is one of the jobs it hit, nothing more."""
    return realm_of(alert.labels) == state.realm


def _apart(state: IncidentState, alert: Alert, own_route: OwnRoute | None) -> bool:
    """Pure: whether a job's alert takes its job's part of `state`, an incident of another
    realm (trusted evidence), instead of joining it: its job has a route of its own."""
    return own_route is not None and not _evidence(state, alert) and own_route(alert)


@dataclass(frozen=True, slots=True)
class Membership:
    """An alert joining an incident (a row of the store's `incident_alerts`)."""

    alert_id: int
    incident_id: int
    role: str
    group_key: str
    at: datetime


class IdsExhausted(RuntimeError):
    """The batch opened more incidents than ids were reserved for it (planned again alone)."""


class IncidentBook:
    """The incidents one planning batch (or one `decide` call) touches; changed in place.

    `incidents`: the stored incidents of the batch's keys and alerts (open ones by key);
    `members`: alert id -> incident id for the batch's alerts already in one; `ids`: ids
    reserved for incidents this batch opens (default: derived from each one's key and start);
    `apart`: alert id -> the maintenance window stretch muting it now (`base_key`);
    `rebuild`: see `of_alert`; `domains`: the failure-domain index entries of the batch's
    alerts ("node=<node>", "job=<job>", "twin=<identity>" -> {"key", "id", "at"}: the
    incident that domain's alerts join; the store keeps them, `domains_changed` says which
    to write back).
    """

    def __init__(
        self,
        policy: Policy,
        incidents: Iterable[IncidentState] = (),
        members: Mapping[int, int] | None = None,
        ids: Iterable[int] | None = None,
        apart: Mapping[int, str] | None = None,
        rebuild: bool = True,
        domains: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.policy = policy
        # Without a store, an incident the book does not hold is rebuilt from the alert's
        # fingerprint context (`_rebuilt`); with one (rebuild=False) it never is: the store
        # holds it, and a stand-in must not be written over it.
        self.rebuild = rebuild
        self.apart: Mapping[int, str] = apart or {}
        self.by_id: dict[int, IncidentState] = {s.id: s for s in incidents}
        self.open: dict[str, IncidentState] = {
            s.key: s for s in self.by_id.values() if s.status == FIRING
        }
        self.members: dict[int, int] = dict(members or {})
        self.joined: list[Membership] = []
        self._ids: Iterator[int] | None = iter(ids) if ids is not None else None
        self.changed: dict[int, IncidentState] = {}
        self.domains: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (domains or {}).items()}
        self.domains_changed: set[str] = set()
        # The hang diagnosis' view of the batch (set by the planner before its changes):
        # `diagnosed`, newly firing alerts whose drafts are held for their diagnosis (an
        # incident's drafts caused by one are its, `trigger_alert_id`); `unsent`, alerts
        # whose held page was cancelled unsent (a checkpoint that ended): nobody was told.
        self.diagnosed: frozenset[int] = frozenset()
        self.unsent: frozenset[int] = frozenset()
        # page alert ids whose escalation ends though their incident fires on (`_move_lead`)
        self.pages_ended: list[int] = []

    def _new_id(self, key: str, at: datetime) -> int:
        """The next reserved id; without reserved ids (a `decide` call on its own), one
        derived from the incident's key and start, so calls without a store agree."""
        if self._ids is None:
            return 1 + zlib.crc32(f"{key}@{at.isoformat()}".encode()) % 2**31
        try:
            return next(self._ids)
        except StopIteration:
            raise IdsExhausted("no incident id left for this batch") from None

    def of_alert(self, alert_id: int | None, context: Mapping[str, Any]) -> IncidentState | None:
        """The incident an alert is in. An occurrence in none yet whose fingerprint's firing
        occurrence (its context) is in one joins that one, quietly (a resolve of a newer
        occurrence resolves the fingerprint there)."""
        if alert_id is not None and (found := self.members.get(alert_id)) is not None:
            state = self.by_id.get(found)
            if state is not None:
                return state
        noted = context.get(INCIDENT_CONTEXT)
        prior = self.members.get(int(context.get("alert_id") or 0))
        if prior is None and isinstance(noted, Mapping):
            prior = int(noted["id"])
        known = self.by_id.get(prior) if prior is not None else None
        if known is not None and alert_id is not None:
            self.members[alert_id] = known.id
            self.joined.append(Membership(alert_id, known.id, MEMBER_ROLE, "", known.opened_at))
            known.total += 1
            self.changed[known.id] = known
            return known
        return self._rebuilt(alert_id, context) if self.rebuild else None

    def _rebuilt(self, alert_id: int | None, context: Mapping[str, Any]) -> IncidentState | None:
        """An incident known only from an alert's fingerprint context (a `decide` call
        without a store): the alert alone, as the context remembers it."""
        noted = context.get(INCIDENT_CONTEXT)
        if not isinstance(noted, Mapping) or alert_id is None:
            return None
        alert = context.get("alert") or {}
        state = IncidentState(
            id=int(noted["id"]),
            key=str(noted.get("key", "")),
            cause=str(noted.get("cause", "")),
            job=str(noted.get("job", "")),
            opened_at=datetime.fromisoformat(noted["opened_at"]),
            lead={"alert": alert, "alert_id": alert_id},
            priority=Priority(noted.get("priority", "P3")),
            classification=dict(context.get("classification") or {}),
            total=1,
            firing=1,
            announced=bool(noted.get("announced", False)),
            folded=bool(noted.get("folded", False)),
            version=1,
            realm=realm_of(alert.get("labels") or {}),
        )
        self.by_id[state.id] = state
        self.members[alert_id] = state.id
        self.joined.append(Membership(alert_id, state.id, CAUSE_ROLE, "", state.opened_at))
        self.changed[state.id] = state
        if state.firing:
            self.open.setdefault(state.key, state)
        return state

    def place(
        self,
        alert_id: int | None,
        alert: Alert,
        classification: Classification,
        group_key: str,
        at: datetime,
        context: Mapping[str, Any],
        own_route: OwnRoute | None = None,
    ) -> tuple[IncidentState, bool]:
        """The incident a newly firing alert joins (opening one if needed); True if new.

        In order: the incident of its twin (a copy of an alert already firing there); with
        correlation, its failure domain's (`_domain_of`), or a node's incident it opens (not
        a job's `PLACEMENT` alert: it only joins one); else its `grouping` key's, a P0 of
        another cause apart. A job's alert whose job has a route of its own (`own_route`) takes
        its job's part of an incident of trusted evidence instead of joining it (`_part`)."""
        known = self.of_alert(alert_id, context)
        if known is not None:
            return known, False
        apart = self.apart.get(alert_id or 0, "")
        ident = twin_identity(alert)
        if ident and not apart:
            twin = self._indexed(TWIN_DOMAIN + ident, at, None)
            copies = twin.twins.get(ident, []) if twin is not None else []
            if twin is not None and copies and alert.fingerprint not in copies:
                if _apart(twin, alert, own_route):
                    level = rank(alert, classification, self.policy)
                    return self._part(twin, alert_id, alert, classification, group_key, at, level)
                self._join_twin(twin, alert_id, alert, group_key, at, ident)
                return twin, False
        cause = cause_of(alert)
        correlation = self.policy.correlation
        level = rank(alert, classification, self.policy)
        ranked: int | None = level
        if correlation.enabled and not apart and level < FOREIGN:
            state = self._domain_of(alert, at)
            if state is not None and _apart(state, alert, own_route):
                return self._part(state, alert_id, alert, classification, group_key, at, level)
            if state is not None:
                self._join(
                    state, alert_id, alert, classification, group_key, at, MEMBER_ROLE, level
                )
                self._correlate(state, alert, alert_id, level, at)
                return state, False
            if alert.name == PLACEMENT:
                # it names its job in its node's incident; before the node's fault arrives
                # (a later Alertmanager flush) it is an alert of its own, no failure domain:
                # not the incident the job's NCCL and hang alerts follow, and at its own
                # priority (it is on each of the job's faulty nodes by design: no blast radius)
                level = FOREIGN
                classification = without_blast_radius(classification)
                ranked = None  # its rank as a member: of the classification it joins with
        base = base_key(alert, group_key, self.policy, apart)
        split = f"{base}|cause={cause}"
        state = self.open.get(split)
        new = False
        if state is None and (found := self.open.get(base)) is not None:
            if found.cause == cause or classification.priority is not Priority.P0:
                state = found
            else:
                state = self._open(split, cause, alert, alert_id, classification, group_key, at)
                new = True
        if state is None:
            state = self._open(base, cause, alert, alert_id, classification, group_key, at)
            new = True
        elif not new:
            self._join(state, alert_id, alert, classification, group_key, at, MEMBER_ROLE, ranked)
        self._correlate(state, alert, alert_id, level, at, index=not apart)
        return state, new

    def _part(
        self,
        whole: IncidentState,
        alert_id: int | None,
        alert: Alert,
        classification: Classification,
        group_key: str,
        at: datetime,
        level: int,
    ) -> tuple[IncidentState, bool]:
        """A job's alert meets `whole`, an incident of trusted evidence (the job's node's, or
        its twin's), and its job has a route of its own: it joins (or opens) its job's part
        of that incident (key `<whole's key>@<the job's realm>`), an incident of its job's
        realm, so its card takes its job's route, its page its job's roster, and its ack
        covers its job's alerts only; it keeps nothing of `whole` open. The part starts with
        `whole`'s own story (what hit the job), its node and the infrastructure incident that
        speaks for it; `whole`'s story names the job (a consequence's step). True if new."""
        key = realm_key(whole.key, realm_of(alert.labels))
        state = self.open.get(key)
        new = state is None
        if state is None:
            state = self._open(key, cause_of(alert), alert, alert_id, classification, group_key, at)
            state.part_of, state.infra, state.domain = whole.id, whole.infra, whole.domain
            for step_key, step in whole.story.items():
                if not step.get("job"):  # the cluster's own steps, never another job's
                    state.story.setdefault(step_key, dict(step))
        else:
            self._join(state, alert_id, alert, classification, group_key, at, MEMBER_ROLE, level)
        self._correlate(state, alert, alert_id, level, at)
        if level == CONSEQUENCE and self.policy.correlation.enabled:
            note(whole.story, alert, level, at)
            self.touch(whole, at)
        return state, new

    def _indexed(self, domain: str, at: datetime, window: float | None) -> IncidentState | None:
        """The open incident a failure-domain index entry names, if it gathered an alert
        within `window` seconds (None: however long ago)."""
        entry = self.domains.get(domain)
        if entry is None:
            return None
        state = self.by_id.get(int(entry["id"]))
        if state is None or state.status != FIRING or state.key != entry.get("key"):
            return None
        since = (at - datetime.fromisoformat(entry["at"])).total_seconds()
        if window is not None and since > window:
            return None
        return state

    def _domain_of(self, alert: Alert, at: datetime) -> IncidentState | None:
        """Pure: the incident of the alert's failure domain: its node's open incident of its
        own realm or of trusted evidence (`correlate.node_keys`; never another tenant's),
        else (an alert without a node, or a node without an incident yet) the incident its
        job's alerts joined within `correlation.window` that no other node holds (only its
        own job's alerts index its job)."""
        window = self.policy.correlation.window
        job = alert.job
        if nodes := node_keys(alert):
            for key in nodes:  # its own realm's incident of the node, then the cluster's
                if (found := self._indexed(key, at, None)) is not None:
                    return found
            by_job = self._indexed(JOB_DOMAIN + job.key, at, window) if job else None
            return by_job if by_job is not None and not by_job.domain else None
        return self._indexed(JOB_DOMAIN + job.key, at, window) if job else None

    def _correlate(
        self,
        state: IncidentState,
        alert: Alert,
        alert_id: int | None,
        level: int,
        at: datetime,
        index: bool = True,
    ) -> None:
        """What an alert that joined (or opened) `state` adds to it: its twin identity, its
        blinder, the unknown resolution it replaces; with correlation, its cause rank (a
        better cause becomes the lead), job, story step and failure-domain index entries.
        A job's alert in an incident of trusted evidence (`_evidence` False) adds its job,
        story step and copies only: it never leads it, blinds it or indexes its node."""
        ident = twin_identity(alert)
        fingerprint = alert.fingerprint
        evidence = _evidence(state, alert)
        if ident:
            copies = state.twins.setdefault(ident, [])
            if fingerprint not in copies:
                copies.append(fingerprint)
            if index and state.realm == CLUSTER_REALM:  # a tenant's copy captures no twin
                self._index(TWIN_DOMAIN + ident, state, at)
        node = alert.node
        if node and alert.name in BLINDERS and evidence:
            state.blind.setdefault(node, {})[ident or fingerprint] = alert.name
            for entry in state.unknown.values():  # they wait for the target to be back
                if entry["node"] == node and blinds(alert.name, alert_from_json(entry["alert"])):
                    entry["confirm_at"] = None
        if state.unknown.pop(ident or fingerprint, None) is not None and state.firing > 0:
            # it fires again: its unknown resolution is over, and this is the same alert
            state.firing -= 1
            state.strangers -= 0 if evidence or not state.strangers else 1
            state.copies += 1
            self._count(state, alert, -1)
        if not self.policy.correlation.enabled or level >= FOREIGN:
            return
        if level < state.cause_rank and evidence:  # a better cause: the card is about it
            former, former_rank = state.lead, state.cause_rank
            state.lead = {"alert": alert_to_json(alert), "alert_id": alert_id}
            state.cause, state.cause_rank = cause_of(alert), level
            _drop_standby(state, fingerprint)
            gone = str(former.get("alert", {}).get("fingerprint", ""))
            if former.get("alert") and gone not in state.unknown and gone != fingerprint:
                _add_standby(state, former["alert"], former.get("alert_id"), former_rank)
        job = alert.job
        _add_job(state, job)
        note(state.story, alert, level, at)
        if not index:
            return
        domain = realm_key(NODE_DOMAIN + node, state.realm)
        if node and evidence and self._indexed(domain, at, None) in (None, state):
            state.domain = state.domain or NODE_DOMAIN + node
            self._index(domain, state, at)
        if job:
            current = self._indexed(JOB_DOMAIN + job.key, at, self.policy.correlation.window)
            # a job's placement in its node's incident takes the job from an incident of no
            # node (its NCCL alert that came first): its later alerts follow the fault
            moved = alert.name == PLACEMENT and current is not None and not current.domain
            if current is None or current is state or (moved and bool(state.domain)):
                self._index(JOB_DOMAIN + job.key, state, at)

    def _index(self, domain: str, state: IncidentState, at: datetime) -> None:
        self.domains[domain] = {"key": state.key, "id": state.id, "at": at.isoformat()}
        self.domains_changed.add(domain)

    def _join_twin(
        self,
        state: IncidentState,
        alert_id: int | None,
        alert: Alert,
        group_key: str,
        at: datetime,
        ident: str,
    ) -> None:
        """A copy of an alert firing in `state` joins it: no new alert, no new firing one;
        the job it adds is shown (a change of the card)."""
        if alert_id is not None:
            self.members[alert_id] = state.id
            self.joined.append(Membership(alert_id, state.id, TWIN_ROLE, group_key, at))
        state.total += 1
        state.copies += 1
        state.twins[ident].append(alert.fingerprint)
        self._index(TWIN_DOMAIN + ident, state, at)
        job = alert.job
        if _add_job(state, job):
            if job is not None and self.policy.correlation.enabled:
                self._index(JOB_DOMAIN + job.key, state, at)
            self.touch(state, at)
        self.changed[state.id] = state

    def _open(
        self,
        key: str,
        cause: str,
        alert: Alert,
        alert_id: int | None,
        classification: Classification,
        group_key: str,
        at: datetime,
    ) -> IncidentState:
        level = rank(alert, classification, self.policy)
        state = IncidentState(
            id=self._new_id(key, at),
            key=key,
            cause=cause,
            job=job_title(job_key(alert.labels)),
            opened_at=at,
            lead={"alert": alert_to_json(alert), "alert_id": alert_id},
            priority=classification.priority,
            classification=classification.to_json(),
            cause_rank=level if self.policy.correlation.enabled else FOREIGN,
            realm=realm_of(alert.labels),
        )
        _add_job(state, alert.job)
        self.by_id[state.id] = state
        self.open[key] = state
        self._join(state, alert_id, alert, classification, group_key, at, CAUSE_ROLE)
        return state

    def _join(
        self,
        state: IncidentState,
        alert_id: int | None,
        alert: Alert,
        classification: Classification,
        group_key: str,
        at: datetime,
        role: str,
        level: int | None = None,
    ) -> None:
        """`level`: `rank(alert, classification, policy)` when the caller has it."""
        if alert_id is not None:
            self.members[alert_id] = state.id
            self.joined.append(Membership(alert_id, state.id, role, group_key, at))
        evidence = _evidence(state, alert)
        state.total += 1
        state.firing += 1
        state.strangers += 0 if evidence else 1
        self._count(state, alert, +1)
        if role != CAUSE_ROLE and evidence:  # may lead it later
            if level is None:
                level = rank(alert, classification, self.policy)
            _add_standby(state, alert_to_json(alert), alert_id, level)
        if classification.priority.level < state.priority.level:
            state.priority = classification.priority
            state.classification = classification.to_json()
        self.touch(state, at)

    def _count(self, state: IncidentState, alert: Alert, by: int) -> None:
        policy = self.policy
        cap = policy.grouping.max_tracked
        node = alert.node
        gpu = gpu_label(alert.labels, policy.gpu_labels)
        tracked = not node or _bump(state.nodes, node, by, cap)
        if gpu:
            tracked = _bump(state.gpus, f"{node}/{gpu}", by, cap) and tracked
        if port := hca_port(alert.labels):
            tracked = _bump(state.ports, f"{node} {port}", by, cap) and tracked
        if mount := alert.labels.get("mountpoint", ""):  # the filesystem, on any node
            tracked = _bump(state.mounts, mount, by, cap) and tracked
        tracked = _bump(state.names, alert.name, by, cap) and tracked
        if not tracked and by > 0:
            state.untracked += 1

    def resolve(
        self,
        state: IncidentState,
        alert: Alert,
        at: datetime,
        classification: Classification | None = None,
    ) -> str:
        """One of its alerts resolved. COPIED: a copy resolved, its twin still fires (the
        one alert fires), or a stranger's copy resolved whose alert had resolved already
        (below); UNKNOWN: the resolution is not believed yet (`_unbelieved`), the alert
        stays firing; RESOLVED_NOW: it resolved, and the incident with its last firing
        alert. `classification`: the alert's, while it fired.

        Twins (tenancy.py): the copy of the incident's realm speaks for the one alert. When
        it resolves, the alert resolves, whatever copies of other realms still fire (a
        team's copy of a cluster-wide alert may be its decoy, which never resolves): they
        are dropped, and their own resolves later change nothing. A stranger's copy that
        resolves while another copy fires changes nothing either. LEFT: a job's alert that a
        spent incident left firing (`_retire`) resolved: nothing changes."""
        if state.spent and state.status != FIRING and not _evidence(state, alert):
            return LEFT
        ident = twin_identity(alert)
        copies = state.twins.get(ident)
        evidence = _evidence(state, alert)
        if copies and alert.fingerprint in copies:
            copies.remove(alert.fingerprint)
            if copies and evidence:  # the others are strangers' word: the alert resolves
                del state.twins[ident]
            elif copies:
                self.changed[state.id] = state
                return COPIED
        elif ident and not evidence:  # its alert resolved already, with the realm's copy
            self.changed[state.id] = state
            return COPIED
        node = alert.node
        if node and (ident or alert.fingerprint) in state.blind.get(node, {}):
            del state.blind[node][ident or alert.fingerprint]
            for entry in state.unknown.values():  # the node's targets may be back: confirm
                if entry["node"] == node and entry["confirm_at"] is None:
                    held = alert_from_json(entry["alert"])
                    if not self._blinded(state, node, held):
                        confirm = self.policy.correlation.confirm_resolved
                        entry["confirm_at"] = (at + timedelta(seconds=confirm)).isoformat()
        if self._unbelieved(state, alert, node, classification, at, ident):
            if self._blinded(state, node, alert):
                self.touch(state, at)  # the card shows it unknown
            else:
                self.changed[state.id] = state  # quiet until confirmed (`settle`)
            return UNKNOWN
        self._resolve_now(state, alert, at)
        return RESOLVED_NOW

    def _blinded(self, state: IncidentState, node: str, alert: Alert) -> bool:
        """Pure: whether a blinder of the node fires in `state` for this alert."""
        return any(blinds(name, alert) for name in state.blind.get(node, {}).values())

    def _unbelieved(
        self,
        state: IncidentState,
        alert: Alert,
        node: str,
        classification: Classification | None,
        at: datetime,
        ident: str,
    ) -> bool:
        """With correlation, the resolution of an alert of a node's incident is held as
        unknown while its node's reporting target is down (no confirmation time: it waits
        for the target), or, for a hardware fault, until `confirm_resolved` passed."""
        correlation = self.policy.correlation
        if not correlation.enabled or not node or not state.domain:
            return False
        blinded = self._blinded(state, node, alert)
        fault = classification is not None and rank(alert, classification, self.policy) == FAULT
        if not blinded and not fault:
            return False
        confirm = None if blinded else at + timedelta(seconds=correlation.confirm_resolved)
        state.unknown[ident or alert.fingerprint] = {
            "alert": alert_to_json(alert),
            "node": node,
            "at": at.isoformat(),
            "confirm_at": _iso(confirm),
        }
        return True

    def settle(self, state: IncidentState, now: datetime) -> bool:
        """Resolves the unknown resolutions whose confirmation passed and whose node's
        reporting targets are not down; True if one did."""
        settled = False
        for key, entry in list(state.unknown.items()):
            confirm_at = _dt(entry.get("confirm_at"))
            held = alert_from_json(entry["alert"])
            if confirm_at is None or confirm_at > now:
                continue
            if self._blinded(state, entry["node"], held):
                entry["confirm_at"] = None  # waits for its target to be back
                continue
            del state.unknown[key]
            self._resolve_now(state, held, now)
            settled = True
        return settled

    @staticmethod
    def next_confirmation(state: IncidentState) -> datetime | None:
        """Pure: when `settle` must look at the incident next (None: nothing to confirm)."""
        times = [t for e in state.unknown.values() if (t := _dt(e.get("confirm_at")))]
        return min(times) if times else None

    def _resolve_now(self, state: IncidentState, alert: Alert, at: datetime) -> None:
        if state.firing > 0:
            state.firing -= 1
            state.strangers -= 0 if _evidence(state, alert) or not state.strangers else 1
            self._count(state, alert, -1)
        _drop_standby(state, alert.fingerprint)
        lead = state.lead.get("alert") or {}
        if lead.get("fingerprint") == alert.fingerprint and state.firing > 0 and state.standby:
            self._move_lead(state)
        if state.firing == 0 and state.status == FIRING:
            self._close(state, at)
        elif (
            state.status == FIRING
            and state.realm == CLUSTER_REALM
            and state.firing <= state.strangers
        ):
            self._retire(state, at)
        self.touch(state, at)

    def _close(self, state: IncidentState, at: datetime) -> None:
        """It resolves: no longer open under its key (its escalation ends with it:
        stages/planning/incidents.py `resolved_pages`)."""
        state.status = RESOLVED
        state.resolved_at = at
        if self.open.get(state.key) is state:
            del self.open[state.key]

    def _retire(self, state: IncidentState, at: datetime) -> None:
        """An incident of trusted evidence whose own alerts all resolved while jobs' alerts
        that joined it (jobs of the gateway's own route) fire on: it is spent. It resolves
        (its RESOLVED card, shown resolved in the console and the API, its escalation ended,
        acknowledged or not) and says why (`spent`); the jobs' alerts still firing are no
        longer counted in it and their resolves change nothing (`resolve`: LEFT). Renamed
        `<key>|spent=<id>`, it is no failure domain's nor key's any more, so a later fault of
        its node or group, or another job's alert, opens an incident of its own and pages;
        no team's alert keeps it open or capturing."""
        left = state.firing
        if SPENT not in state.key:
            if self.open.get(state.key) is state:
                del self.open[state.key]
            state.key = f"{state.key}{SPENT}{state.id}"
        alerts = "alert" if left == 1 else "alerts"
        state.spent = (
            f"Its own alerts resolved; {left} {alerts} of the jobs it hit fired on, "
            "followed here no more."
        )
        state.firing = state.strangers = 0
        self._close(state, at)

    def _move_lead(self, state: IncidentState) -> None:
        """The lead resolved while other alerts of the incident fire: the best of them (the
        lowest cause rank, the newest of equals) leads from now on, so the card is never
        about a resolved alert. When nobody was told of the former lead (its held page was
        cancelled unsent: a checkpoint that ended), every channel is owed the new lead's
        card, and its escalation (held under the former lead) ends: a P0 pages anew, under
        the new lead."""
        best = min(range(len(state.standby)), key=lambda i: (state.standby[i]["level"], -i))
        entry = state.standby.pop(best)
        former = state.lead_alert_id
        state.lead = {"alert": entry["alert"], "alert_id": entry["alert_id"]}
        state.cause = cause_of(alert_from_json(entry["alert"]))
        # `cause_rank` stays the best cause's: it only ever improves (a channel that cannot
        # update is told at once of each improvement: `mark`), and a resolved cause is no
        # reason to tell anyone the incident got a worse one.
        if former is None or former not in self.unsent:
            return
        state.told = {}
        if state.paged and state.page_alert_id == former:
            self.pages_ended.append(former)
            state.paged, state.page_alert_id = False, None
        state.page_due = state.priority is Priority.P0 and not state.acked_by

    def add_quiet(
        self,
        alert_id: int,
        alert: Alert,
        classification: Classification,
        group_key: str,
        at: datetime,
    ) -> IncidentState:
        """An alert no notice placed (a resolve never seen firing, a suppressed repeat): it
        joins the open incident of its key without counting as firing, or a resolved
        incident of its own, so it is in one like every alert; nothing is announced."""
        if (found := self.members.get(alert_id)) is not None and found in self.by_id:
            return self.by_id[found]
        base = base_key(alert, group_key, self.policy, self.apart.get(alert_id, ""))
        cause = cause_of(alert)
        state = self.open.get(f"{base}|cause={cause}") or self.open.get(base)
        if state is None:
            state = self._open(base, cause, alert, alert_id, classification, group_key, at)
            state.status, state.resolved_at, state.firing = RESOLVED, at, 0
            self._count(state, alert, -1)
            del self.open[base]
            state.dirty = False
            return state
        self.members[alert_id] = state.id
        self.joined.append(Membership(alert_id, state.id, MEMBER_ROLE, group_key, at))
        state.total += 1
        self.changed[state.id] = state
        return state

    def wake(self, states: Iterable[IncidentState]) -> None:
        """Incidents whose follow-up is due: `flush` looks at them."""
        for state in states:
            state = self.by_id.setdefault(state.id, state)
            if state.status == FIRING:
                self.open.setdefault(state.key, state)
            self.changed[state.id] = state

    def touch(self, state: IncidentState, at: datetime) -> None:
        state.version += 1
        state.updated_at = at if state.updated_at is None else max(at, state.updated_at)
        state.dirty = True
        self.changed[state.id] = state

    def note(self, state: IncidentState) -> dict[str, Any]:
        """What an alert's fingerprint context keeps of its incident (see `_rebuilt`)."""
        return {
            "id": state.id,
            "key": state.key,
            "cause": state.cause,
            "job": state.job,
            "opened_at": state.opened_at.isoformat(),
            "priority": state.priority.value,
            "announced": state.announced,
            "folded": state.folded,
        }
