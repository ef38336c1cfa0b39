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
- The cause (`lead`, `cause`) is kept apart from the grouping key, so a later correlation
  (issue 37) can add alerts of other groups to an incident and choose its cause again.

`IncidentBook` holds the incidents one planning batch touches (mutable, pure);
`incident_drafts` turns a changed incident into notifications: a card, an in-place redraw on
channels that can update a card, follow-ups at most once per `follow_up_interval` on those
that cannot, and the one page.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert, Priority
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.payload import (
    alert_to_json,
)
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import job_key, job_title
from trainsentry.labels import first_label

FIRING = "firing"
RESOLVED = "resolved"
CAUSE_ROLE = "cause"  # the alert the incident's card is about (re-chosen later: issue 37)
MEMBER_ROLE = "member"
INCIDENT_CONTEXT = "incident"  # fingerprint context: the occurrence's incident and status

# (priority, labels, paging) -> (channels, route id, extra payload fields): decide.py's route.
Router = Callable[[Priority, Mapping[str, str], bool], tuple[tuple[str, ...], str, dict[str, Any]]]


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
    acked_by: str | None = None  # the store's column (stages/ack.py); never written here
    due_at: datetime | None = None  # a follow-up waits until then
    # for this batch only (not stored)
    trigger: str = ""  # the last change shown: keys the idempotency of its drafts
    page_due: bool = False
    dirty: bool = False

    @property
    def uid(self) -> str:
        """Stable identity for idempotency keys (the id may differ in a replayed batch)."""
        return f"{self.key}@{self.opened_at.isoformat()}"

    @property
    def mark(self) -> str:
        """What a channel that cannot update must be told at once when it changes."""
        return f"{self.status}|{self.priority.value}|{self.headline}"

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
        )


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
    `rebuild`: see `of_alert`.
    """

    def __init__(
        self,
        policy: Policy,
        incidents: Iterable[IncidentState] = (),
        members: Mapping[int, int] | None = None,
        ids: Iterable[int] | None = None,
        apart: Mapping[int, str] | None = None,
        rebuild: bool = True,
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
    ) -> tuple[IncidentState, bool]:
        """The incident a newly firing alert joins (opening one if needed); True if new."""
        known = self.of_alert(alert_id, context)
        if known is not None:
            return known, False
        base = base_key(alert, group_key, self.policy, self.apart.get(alert_id or 0, ""))
        cause = cause_of(alert)
        split = f"{base}|cause={cause}"
        state = self.open.get(split)
        if state is None and (found := self.open.get(base)) is not None:
            if found.cause == cause or classification.priority is not Priority.P0:
                state = found
            else:
                opened = self._open(split, cause, alert, alert_id, classification, group_key, at)
                return opened, True
        if state is None:
            return self._open(base, cause, alert, alert_id, classification, group_key, at), True
        self._join(state, alert_id, alert, classification, group_key, at, MEMBER_ROLE)
        return state, False

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
        state = IncidentState(
            id=self._new_id(key, at),
            key=key,
            cause=cause,
            job=job_title(job_key(alert.labels)),
            opened_at=at,
            lead={"alert": alert_to_json(alert), "alert_id": alert_id},
            priority=classification.priority,
            classification=classification.to_json(),
        )
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
    ) -> None:
        if alert_id is not None:
            self.members[alert_id] = state.id
            self.joined.append(Membership(alert_id, state.id, role, group_key, at))
        state.total += 1
        state.firing += 1
        self._count(state, alert, +1)
        if classification.priority.level < state.priority.level:
            state.priority = classification.priority
            state.classification = classification.to_json()
        self.touch(state, at)

    def _count(self, state: IncidentState, alert: Alert, by: int) -> None:
        policy = self.policy
        cap = policy.grouping.max_tracked
        node = first_label(alert.labels, policy.node_labels)
        gpu = first_label(alert.labels, policy.gpu_labels)
        tracked = not node or _bump(state.nodes, node, by, cap)
        if gpu:
            tracked = _bump(state.gpus, f"{node}/{gpu}", by, cap) and tracked
        if not tracked and by > 0:
            state.untracked += 1

    def resolve(self, state: IncidentState, alert: Alert, at: datetime) -> None:
        """One of its alerts resolved; the incident resolves with its last firing alert."""
        if state.firing > 0:
            state.firing -= 1
            self._count(state, alert, -1)
        if state.firing == 0 and state.status == FIRING:
            state.status = RESOLVED
            state.resolved_at = at
            if self.open.get(state.key) is state:
                del self.open[state.key]
        self.touch(state, at)

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
