"""Phone escalation as a pure timeline: `plan(state, now) -> (new_state, calls_due)`.

The state is typed (`EscalationState`: an `Escalation` per paged alert occurrence) and
immutable; the caller persists its `to_json()` after every change; nothing here does I/O or
reads a clock. A restart reloads the state and carries on: a step that was
planned is recorded in the state, so it is never planned twice, and every call carries a
deterministic idempotency key (`esc:<alert_id>:<step>:<person>`) so an outbox that crashed
between planning and persisting can still drop the duplicate.

Timeline for one incident (an alert occurrence at or above `EscalationPolicy.min_priority`):
step 0 calls the on-call of layer 1 at once; if nobody acknowledges within the layer's wait
(`waits`, else `ack_timeout`), step 1 calls again (while `calls_per_layer` allows), then the
next layer, and so on; the whole list runs `repeat` times; then, with `call_every`, the last
layer is called again every `call_every` until `stop_after`; then it is "exhausted". A layer
may be a schedule's current person (`SchedulePick`: resolved at the time of the call, so
overrides and handoffs apply). Acknowledge or resolve stops the timeline at any point;
"escalate now" makes the next step due at once. Resolved and below-threshold alerts never
cause a call.

An incident may name its escalation policy (`IncidentPage.policy`, a key of `named`); one
without a name, or naming a policy no longer configured, follows the default roster and policy.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import Person, Priority
from trainsentry.notifiers.payload_contract import CallPayload
from trainsentry.oncall.schedule import entries_at
from trainsentry.oncall.schedule import on_call as schedule_on_call
from trainsentry.oncall.types import Schedule

STATE_VERSION = 1

OPEN = "open"
ACKED = "acked"
RESOLVED = "resolved"
EXHAUSTED = "exhausted"


@dataclass(frozen=True, slots=True)
class SchedulePick:
    """The person at `position` (1 = paged first) of a schedule's answer at the time of the
    call; `members` holds the schedule's people, by name."""

    schedule: Schedule
    position: int
    members: tuple[Person, ...]

    def person(self, at: datetime) -> Person | None:
        entries = entries_at(self.schedule, at)
        if len(entries) < self.position:
            return None
        name = entries[self.position - 1][0]
        return next((p for p in self.members if p.name == name), Person(name))

    def until(self, at: datetime) -> datetime | None:
        """When the person at `position` stops being on call there (None: not within 400 days)."""
        answer = schedule_on_call(self.schedule, at)
        return answer[self.position - 1].until if len(answer) >= self.position else None


@dataclass(frozen=True, slots=True)
class Layer:
    """People reachable at one escalation level.

    With `pick` set, the schedule's person at the time (see SchedulePick). With `shift` set,
    one member is on call at a time, rotating every `shift` from `rotation_start` (member 0
    first). Otherwise every member is called together.
    """

    name: str
    members: tuple[Person, ...]
    rotation_start: datetime | None = None
    shift: timedelta | None = None
    pick: SchedulePick | None = None

    def on_call(self, at: datetime) -> tuple[Person, ...]:
        if self.pick is not None:
            person = self.pick.person(at)
            return () if person is None else (person,)
        if not self.members:
            return ()
        if self.shift is None or self.rotation_start is None:
            return self.members
        shifts = math.floor((at - self.rotation_start) / self.shift)
        return (self.members[shifts % len(self.members)],)


@dataclass(frozen=True, slots=True)
class Roster:
    layers: tuple[Layer, ...]


@dataclass(frozen=True, slots=True)
class EscalationPolicy:
    """When each step comes. `waits[i]`: how long layer i waits for an ack before the next
    step (default `ack_timeout`); `repeat`: how often the whole layer list runs; `call_every`:
    then the last layer again at this interval, until `stop_after` since the first call."""

    min_priority: Priority = Priority.P0
    ack_timeout: timedelta = timedelta(minutes=5)
    calls_per_layer: int = 1
    waits: tuple[timedelta, ...] = ()
    repeat: int = 1
    call_every: timedelta | None = None
    stop_after: timedelta = timedelta(hours=24)

    def __post_init__(self) -> None:
        if self.calls_per_layer < 1 or self.repeat < 1:
            raise ValueError("calls_per_layer and repeat must be at least 1")
        waits = (self.ack_timeout, *self.waits, *([self.call_every] if self.call_every else []))
        if any(wait <= timedelta(0) for wait in waits):
            raise ValueError("ack_timeout, waits and call_every must be positive")

    def wait_after(self, layer: int) -> timedelta:
        return self.waits[layer] if layer < len(self.waits) else self.ack_timeout


@dataclass(frozen=True, slots=True)
class CallDue:
    """One phone call to place now."""

    alert_id: int
    step: int
    layer: str
    person: Person
    priority: Priority
    idempotency_key: str
    due_at: datetime


@dataclass(frozen=True, slots=True)
class CallMade:
    """One call an escalation placed: its step, layer, person and time."""

    step: int
    layer: str
    person: str
    at: datetime


@dataclass(frozen=True, slots=True)
class EscalatedBy:
    """Someone asked for the next step now ("escalate now")."""

    by: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Escalation:
    """The escalation of one paged alert occurrence (the state's unit).

    Invariants: `status` is one of OPEN, ACKED, RESOLVED, EXHAUSTED; `next_at` is set only
    while OPEN and `stopped_at` only once it is not; `next_step` never goes back; `calls` only
    grows. `policy`: the named escalation policy it follows ("": the default); `roster`: the
    job whose own roster it follows (None: the policy's), set by `job_roster`."""

    priority: Priority
    opened_at: datetime
    status: str = OPEN
    next_step: int = 0
    next_at: datetime | None = None
    stopped_at: datetime | None = None
    acked_by: str | None = None
    calls: tuple[CallMade, ...] = ()
    text: str = ""
    policy: str = ""
    roster: str | None = None
    escalated_by: tuple[EscalatedBy, ...] = ()

    def stopped(self, status: str, now: datetime) -> Escalation:
        """Pure: this escalation stopped as `status` at `now` (unchanged unless OPEN)."""
        if self.status != OPEN:
            return self
        return replace(self, status=status, stopped_at=now, next_at=None)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "priority": self.priority.value,
            "status": self.status,
            "opened_at": _iso(self.opened_at),
            "next_step": self.next_step,
            "next_at": None if self.next_at is None else _iso(self.next_at),
            "stopped_at": None if self.stopped_at is None else _iso(self.stopped_at),
            "acked_by": self.acked_by,
            "calls": [
                {"step": c.step, "layer": c.layer, "person": c.person, "at": _iso(c.at)}
                for c in self.calls
            ],
        }
        if self.text:
            data["text"] = self.text
        if self.policy:
            data["policy"] = self.policy
        if self.roster is not None:
            data["roster"] = self.roster
        if self.escalated_by:
            data["escalated_by"] = [{"by": e.by, "at": _iso(e.at)} for e in self.escalated_by]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Escalation:
        status = data["status"]
        if status not in (OPEN, ACKED, RESOLVED, EXHAUSTED):
            raise ValueError(f"unknown escalation status {status!r}")
        return cls(
            priority=Priority(data["priority"]),
            opened_at=_time(data["opened_at"]),
            status=status,
            next_step=int(data["next_step"]),
            next_at=_maybe_time(data.get("next_at")),
            stopped_at=_maybe_time(data.get("stopped_at")),
            acked_by=data.get("acked_by"),
            calls=tuple(
                CallMade(int(c["step"]), c["layer"], c["person"], _time(c["at"]))
                for c in data.get("calls", ())
            ),
            text=data.get("text") or "",
            policy=data.get("policy") or "",
            roster=data.get("roster"),
            escalated_by=tuple(
                EscalatedBy(e["by"], _time(e["at"])) for e in data.get("escalated_by", ())
            ),
        )


@dataclass(frozen=True, slots=True)
class EscalationState:
    """Every running (and recently stopped) escalation, by alert id; persisted by the caller
    as `to_json()` (layout version STATE_VERSION, unchanged since it was a plain dict)."""

    incidents: Mapping[int, Escalation] = field(default_factory=dict)

    def get(self, alert_id: int) -> Escalation | None:
        return self.incidents.get(alert_id)

    def with_(self, alert_id: int, escalation: Escalation) -> EscalationState:
        """Pure: this state with `alert_id`'s escalation replaced."""
        return EscalationState({**self.incidents, alert_id: escalation})

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "incidents": {str(k): v.to_json() for k, v in sorted(self.incidents.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EscalationState:
        if data.get("version") != STATE_VERSION:
            raise ValueError(f"unknown escalation state version {data.get('version')!r}")
        return cls({int(k): Escalation.from_json(v) for k, v in data["incidents"].items()})


def new_state() -> EscalationState:
    return EscalationState()


def _iso(at: datetime) -> str:
    if at.tzinfo is None:
        raise ValueError("escalation times must be timezone-aware")
    return at.isoformat()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _maybe_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _aware(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("escalation times must be timezone-aware")
    return at


def _open(
    state: EscalationState,
    alert_id: int,
    priority: Priority,
    now: datetime,
    policy: EscalationPolicy,
) -> Escalation | None:
    """The escalation a firing alert opens; None if known or below the threshold."""
    if alert_id in state.incidents or not priority.at_least(policy.min_priority):
        return None
    return Escalation(priority=priority, opened_at=_aware(now), next_at=now)


def open_incident(
    state: EscalationState,
    alert_id: int,
    priority: Priority,
    now: datetime,
    policy: EscalationPolicy,
) -> EscalationState:
    """Pure: starts escalating a firing alert; a no-op if known or below
    `policy.min_priority`."""
    opened = _open(state, alert_id, priority, now, policy)
    return state if opened is None else state.with_(alert_id, opened)


def _stop(state: EscalationState, alert_id: int, status: str, now: datetime) -> EscalationState:
    found = state.get(alert_id)
    return state if found is None else state.with_(alert_id, found.stopped(status, _aware(now)))


def acknowledge(state: EscalationState, alert_id: int, who: str, now: datetime) -> EscalationState:
    """Pure: stops the escalation of `alert_id` (card button, CLI or API ack)."""
    found = state.get(alert_id)
    if found is None or found.status != OPEN:
        return state
    return state.with_(alert_id, replace(found.stopped(ACKED, _aware(now)), acked_by=who))


def postpone(state: EscalationState, alert_id: int, until: datetime) -> EscalationState:
    """Pure: the next step of `alert_id`'s open incident comes no earlier than `until` (its
    page is held back, e.g. a checkpoint within its limit); a stopped incident is unchanged."""
    found = state.get(alert_id)
    if found is None or found.status != OPEN or found.next_at is None:
        return state
    return state.with_(alert_id, replace(found, next_at=max(found.next_at, _aware(until))))


def total_steps(roster: Roster, policy: EscalationPolicy) -> int:
    """Pure: the steps of the timeline (calls of one layer at one time each)."""
    passes = len(roster.layers) * policy.calls_per_layer * policy.repeat
    if passes and policy.call_every is not None:
        elapsed = sum(
            (
                policy.wait_after(i // policy.calls_per_layer % len(roster.layers))
                for i in range(passes - 1)
            ),
            timedelta(0),
        )
        left = policy.stop_after - elapsed
        passes += max(0, math.floor(left / policy.call_every))
    return passes


def step_layer(roster: Roster, policy: EscalationPolicy, step: int) -> tuple[int, timedelta]:
    """Pure: the layer (its index) step `step` calls, and how long it then waits for an ack."""
    layers = len(roster.layers)
    passes = layers * policy.calls_per_layer * policy.repeat
    if step >= passes - 1 and policy.call_every is not None:
        return layers - 1, policy.call_every
    index = step // policy.calls_per_layer % layers
    return index, policy.wait_after(index)


def escalate_now(
    state: EscalationState, alert_id: int, now: datetime, by: str = ""
) -> EscalationState:
    """Pure: the next step of `alert_id`'s open incident is due at `now`, recorded as asked
    by `by` when given (raises KeyError when there is no such incident, ValueError when it
    is not open)."""
    found = state.incidents[alert_id]
    if found.status != OPEN:
        raise ValueError(f"its escalation is {found.status}")
    asked = (*found.escalated_by, EscalatedBy(by, _aware(now))) if by else found.escalated_by
    return state.with_(alert_id, replace(found, next_at=now, escalated_by=asked))


def plan(
    state: EscalationState,
    now: datetime,
    *,
    roster: Roster,
    policy: EscalationPolicy,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[EscalationState, list[CallDue]]:
    """Pure: advances every open incident whose next step is due; returns the calls to place.

    At most one step per incident per call: after downtime we call the current step once
    and wait again rather than firing every missed step at once. A step whose layer has
    nobody on call (a schedule with a gap) is passed over to the next one at once.
    """
    return _advance(state, _aware(now), Escalator(roster, policy), named or {})


def _advance(
    state: EscalationState, now: datetime, default: Escalator, named: Mapping[str, Escalator]
) -> tuple[EscalationState, list[CallDue]]:
    due: list[CallDue] = []
    incidents = dict(state.incidents)
    for alert_id in sorted(incidents):
        found = incidents[alert_id]
        if found.status != OPEN or found.next_at is None or found.next_at > now:
            continue
        escalator = named.get(found.policy, default)
        roster, policy = escalator.roster, escalator.policy
        steps = total_steps(roster, policy)
        step = found.next_step
        people: tuple[Person, ...] = ()
        while step < steps:
            index, wait = step_layer(roster, policy, step)
            layer = roster.layers[index]
            people = layer.on_call(now)
            if people:
                break
            step += 1
        if step >= steps:
            incidents[alert_id] = found.stopped(EXHAUSTED, now)
            continue
        calls = [
            CallDue(
                alert_id=alert_id,
                step=step,
                layer=layer.name,
                person=person,
                priority=found.priority,
                idempotency_key=f"esc:{alert_id}:{step}:{person.name}",
                due_at=now,
            )
            for person in people
        ]
        due.extend(calls)
        made = tuple(CallMade(step, layer.name, c.person.name, now) for c in calls)
        incidents[alert_id] = replace(
            found, calls=(*found.calls, *made), next_step=step + 1, next_at=now + wait
        )
    return EscalationState(incidents), due


@dataclass(frozen=True, slots=True)
class IncidentPage:
    """A fresh page of a firing alert: opens its incident; `text` is what the calls say."""

    alert_id: int
    priority: Priority
    text: str
    policy: str = ""  # the escalation policy's name ("": the default roster and policy)


def batch(
    state: EscalationState,
    now: datetime,
    *,
    pages: Sequence[IncidentPage] = (),
    resolved: Collection[int] = (),
    forget_before: datetime | None = None,
    roster: Roster,
    policy: EscalationPolicy,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[EscalationState, list[CallDue]]:
    """Pure: one batch of the alert policy: opens the incidents of `pages`, ends those of
    `resolved` alerts, forgets incidents stopped before `forget_before`, and plans (see
    `plan`).

    Pages go first: an alert id is one occurrence, which fires before it resolves, so a page
    and a resolve of one alert in one batch mean it already resolved and must not be called.
    A resolved incident is dropped rather than kept as stopped: its occurrence never pages
    again (a firing after its resolve is a stale replay), so nothing can need it.
    """
    named = named or {}
    for page in pages:
        chosen = named.get(page.policy)
        threshold = chosen.policy if chosen is not None else policy
        opened = _open(state, page.alert_id, page.priority, now, threshold)
        if opened is not None:
            policy_name = page.policy if chosen is not None else ""
            state = state.with_(page.alert_id, replace(opened, text=page.text, policy=policy_name))
    gone = set(resolved)
    if forget_before is not None:
        gone |= _stale(state, forget_before)
    if gone:
        state = EscalationState({k: v for k, v in state.incidents.items() if k not in gone})
    return _advance(state, _aware(now), Escalator(roster, policy), named)


def next_wakeup(state: EscalationState) -> datetime | None:
    """Pure: when `plan` next has something to do (for the caller's timer), or None."""
    times = [
        found.next_at
        for found in state.incidents.values()
        if found.status == OPEN and found.next_at is not None
    ]
    return min(times) if times else None


def _stale(state: EscalationState, before: datetime) -> set[int]:
    return {
        alert_id
        for alert_id, found in state.incidents.items()
        if found.status != OPEN and found.stopped_at is not None and found.stopped_at < before
    }


@dataclass(frozen=True, slots=True)
class Escalator:
    """`plan` and friends bound to one roster and policy."""

    roster: Roster
    policy: EscalationPolicy

    def open(
        self, state: EscalationState, alert_id: int, priority: Priority, now: datetime
    ) -> EscalationState:
        return open_incident(state, alert_id, priority, now, self.policy)

    def plan(
        self, state: EscalationState, now: datetime, named: Mapping[str, Escalator] | None = None
    ) -> tuple[EscalationState, list[CallDue]]:
        return plan(state, now, roster=self.roster, policy=self.policy, named=named)

    def batch(
        self,
        state: EscalationState,
        now: datetime,
        *,
        pages: Sequence[IncidentPage] = (),
        resolved: Collection[int] = (),
        forget_before: datetime | None = None,
        named: Mapping[str, Escalator] | None = None,
    ) -> tuple[EscalationState, list[CallDue]]:
        return batch(
            state,
            now,
            pages=pages,
            resolved=resolved,
            forget_before=forget_before,
            roster=self.roster,
            policy=self.policy,
            named=named,
        )


def first_on_call(roster: Roster, at: datetime) -> list[tuple[str, str, datetime | None]]:
    """Pure: who the first step would call at `at`: (name, layer, until), `until` known for
    a schedule's person only."""
    if not roster.layers:
        return []
    layer = roster.layers[0]
    pick = layer.pick
    until = pick.until(at) if pick is not None else None
    if pick is not None and until is not None:
        until = until.astimezone(pick.schedule.tz)
    return [(person.name, layer.name, until) for person in layer.on_call(at)]


# The call notifications (kind "call") the gateway writes for the phone channel.


def call_text(priority: str, alertname: str, job: str, summary: str) -> str:
    """What the voice says: short, speakable, no URLs."""
    where = f" on job {job}" if job else ""
    words = f"trainsentry {priority} alert {alertname}{where}."
    if summary:
        words += f" {summary}."
    return words + " Acknowledge it in Feishu to stop the calls."


def call_payload(call: CallDue, text: str, message_id: str | None = None) -> CallPayload:
    """Pure: the payload of a kind="call" notification (the phone channel's contract)."""
    payload: CallPayload = {
        "priority": call.priority.value,
        "status": "firing",
        "alert_id": call.alert_id,
        "step": call.step,
        "layer": call.layer,
        "person": {
            "name": call.person.name,
            "phone": call.person.phone,
            "feishu_open_id": call.person.feishu_open_id,
        },
        "text": text,
    }
    if message_id:
        payload["message_id"] = message_id
    return payload
