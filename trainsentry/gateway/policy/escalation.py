"""Phone escalation as a pure timeline: `plan(state, now) -> (new_state, calls_due)`.

The state is a JSON-serialisable dict the caller persists after every change; nothing here
does I/O or reads a clock. A restart reloads the state and carries on: a step that was
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

import copy
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import Person, Priority
from trainsentry.notifiers.payload import CallPayload
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


def new_state() -> dict[str, Any]:
    return {"version": STATE_VERSION, "incidents": {}}


def _iso(at: datetime) -> str:
    if at.tzinfo is None:
        raise ValueError("escalation times must be timezone-aware")
    return at.isoformat()


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"unknown escalation state version {state.get('version')!r}")
    return copy.deepcopy(state)


def _open(
    incidents: dict[str, Any],
    alert_id: int,
    priority: Priority,
    now: datetime,
    policy: EscalationPolicy,
) -> dict[str, Any] | None:
    """Adds the incident of a firing alert in place; None if known or below the threshold."""
    key = str(alert_id)
    if key in incidents or not priority.at_least(policy.min_priority):
        return None
    incident: dict[str, Any] = {
        "priority": priority.value,
        "status": OPEN,
        "opened_at": _iso(now),
        "next_step": 0,
        "next_at": _iso(now),
        "stopped_at": None,
        "acked_by": None,
        "calls": [],
    }
    incidents[key] = incident
    return incident


def open_incident(
    state: dict[str, Any],
    alert_id: int,
    priority: Priority,
    now: datetime,
    policy: EscalationPolicy,
) -> dict[str, Any]:
    """Starts escalating a firing alert; a no-op if known or below `policy.min_priority`."""
    new = _copy(state)
    _open(new["incidents"], alert_id, priority, now, policy)
    return new


def _stop(state: dict[str, Any], alert_id: int, status: str, now: datetime) -> dict[str, Any]:
    new = _copy(state)
    incident = new["incidents"].get(str(alert_id))
    if incident is not None and incident["status"] == OPEN:
        incident["status"] = status
        incident["stopped_at"] = _iso(now)
        incident["next_at"] = None
    return new


def acknowledge(state: dict[str, Any], alert_id: int, who: str, now: datetime) -> dict[str, Any]:
    """Stops the escalation of `alert_id` (card button, CLI or API ack)."""
    new = _stop(state, alert_id, ACKED, now)
    incident = new["incidents"].get(str(alert_id))
    if incident is not None and incident["status"] == ACKED and incident["acked_by"] is None:
        incident["acked_by"] = who
    return new


def postpone(state: dict[str, Any], alert_id: int, until: datetime) -> dict[str, Any]:
    """Pure: the next step of `alert_id`'s open incident comes no earlier than `until` (its
    page is held back, e.g. a checkpoint within its limit); a stopped incident is unchanged."""
    new = _copy(state)
    incident = new["incidents"].get(str(alert_id))
    if incident is not None and incident["status"] == OPEN and incident["next_at"] is not None:
        incident["next_at"] = _iso(max(_time(incident["next_at"]), until))
    return new


def resolve(state: dict[str, Any], alert_id: int, now: datetime) -> dict[str, Any]:
    """Stops the escalation because the alert resolved."""
    return _stop(state, alert_id, RESOLVED, now)


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


def escalate_now(state: dict[str, Any], alert_id: int, now: datetime) -> dict[str, Any]:
    """Pure: the next step of `alert_id`'s open incident is due at `now` (raises KeyError
    when there is no such incident, ValueError when it is not open)."""
    new = _copy(state)
    incident = new["incidents"][str(alert_id)]
    if incident["status"] != OPEN:
        raise ValueError(f"its escalation is {incident['status']}")
    incident["next_at"] = _iso(now)
    return new


def plan(
    state: dict[str, Any],
    now: datetime,
    *,
    roster: Roster,
    policy: EscalationPolicy,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[dict[str, Any], list[CallDue]]:
    """Advances every open incident whose next step is due; returns the calls to place.

    At most one step per incident per call: after downtime we call the current step once
    and wait again rather than firing every missed step at once. A step whose layer has
    nobody on call (a schedule with a gap) is passed over to the next one at once.
    """
    new = _copy(state)
    return new, _advance(new["incidents"], now, Escalator(roster, policy), named or {})


def _advance(
    incidents: dict[str, Any], now: datetime, default: Escalator, named: Mapping[str, Escalator]
) -> list[CallDue]:
    """`plan` in place."""
    due: list[CallDue] = []
    for key in sorted(incidents, key=int):
        incident = incidents[key]
        if incident["status"] != OPEN or incident["next_at"] is None:
            continue
        if _time(incident["next_at"]) > now:
            continue
        escalator = named.get(incident.get("policy") or "", default)
        roster, policy = escalator.roster, escalator.policy
        steps = total_steps(roster, policy)
        step = incident["next_step"]
        people: tuple[Person, ...] = ()
        while step < steps:
            index, wait = step_layer(roster, policy, step)
            layer = roster.layers[index]
            people = layer.on_call(now)
            if people:
                break
            step += 1
        if step >= steps:
            incident["status"] = EXHAUSTED
            incident["stopped_at"] = _iso(now)
            incident["next_at"] = None
            continue
        priority = Priority(incident["priority"])
        for person in people:
            call = CallDue(
                alert_id=int(key),
                step=step,
                layer=layer.name,
                person=person,
                priority=priority,
                idempotency_key=f"esc:{key}:{step}:{person.name}",
                due_at=now,
            )
            due.append(call)
            incident["calls"].append(
                {"step": step, "layer": layer.name, "person": person.name, "at": _iso(now)}
            )
        incident["next_step"] = step + 1
        incident["next_at"] = _iso(now + wait)
    return due


@dataclass(frozen=True, slots=True)
class IncidentPage:
    """A fresh page of a firing alert: opens its incident; `text` is what the calls say."""

    alert_id: int
    priority: Priority
    text: str
    policy: str = ""  # the escalation policy's name ("": the default roster and policy)


def batch(
    state: dict[str, Any],
    now: datetime,
    *,
    pages: Sequence[IncidentPage] = (),
    resolved: Collection[int] = (),
    forget_before: datetime | None = None,
    roster: Roster,
    policy: EscalationPolicy,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[dict[str, Any], list[CallDue]]:
    """One batch of the alert policy, copying the state once: opens the incidents of `pages`,
    ends those of `resolved` alerts, forgets incidents stopped before `forget_before`, and
    plans (see `plan`).

    Pages go first: an alert id is one occurrence, which fires before it resolves, so a page
    and a resolve of one alert in one batch mean it already resolved and must not be called.
    A resolved incident is dropped rather than kept as stopped: its occurrence never pages
    again (a firing after its resolve is a stale replay), so nothing can need it.
    """
    new = _copy(state)
    incidents = new["incidents"]
    named = named or {}
    for page in pages:
        chosen = named.get(page.policy)
        threshold = chosen.policy if chosen is not None else policy
        opened = _open(incidents, page.alert_id, page.priority, now, threshold)
        if opened is not None:
            opened["text"] = page.text
            if chosen is not None:
                opened["policy"] = page.policy
    for alert_id in resolved:
        incidents.pop(str(alert_id), None)
    if forget_before is not None:
        _forget(incidents, forget_before)
    return new, _advance(incidents, now, Escalator(roster, policy), named)


def next_wakeup(state: dict[str, Any]) -> datetime | None:
    """When `plan` next has something to do (for the caller's timer), or None."""
    times = [
        _time(incident["next_at"])
        for incident in state["incidents"].values()
        if incident["status"] == OPEN and incident["next_at"] is not None
    ]
    return min(times) if times else None


def forget_stopped(state: dict[str, Any], before: datetime) -> dict[str, Any]:
    """Drops incidents that stopped before `before`, keeping the state small."""
    new = _copy(state)
    _forget(new["incidents"], before)
    return new


def _forget(incidents: dict[str, Any], before: datetime) -> None:
    stale = [
        key
        for key, incident in incidents.items()
        if incident["status"] != OPEN
        and incident["stopped_at"] is not None
        and _time(incident["stopped_at"]) < before
    ]
    for key in stale:
        del incidents[key]


@dataclass(frozen=True, slots=True)
class Escalator:
    """`plan` and friends bound to one roster and policy."""

    roster: Roster
    policy: EscalationPolicy

    def open(
        self, state: dict[str, Any], alert_id: int, priority: Priority, now: datetime
    ) -> dict[str, Any]:
        return open_incident(state, alert_id, priority, now, self.policy)

    def plan(
        self, state: dict[str, Any], now: datetime, named: Mapping[str, Escalator] | None = None
    ) -> tuple[dict[str, Any], list[CallDue]]:
        return plan(state, now, roster=self.roster, policy=self.policy, named=named)

    def batch(
        self,
        state: dict[str, Any],
        now: datetime,
        *,
        pages: Sequence[IncidentPage] = (),
        resolved: Collection[int] = (),
        forget_before: datetime | None = None,
        named: Mapping[str, Escalator] | None = None,
    ) -> tuple[dict[str, Any], list[CallDue]]:
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


def layers_from(names_and_members: Sequence[tuple[str, Sequence[Person]]]) -> Roster:
    """A roster where every layer calls all its members (handy in tests and the demo)."""
    return Roster(tuple(Layer(name, tuple(members)) for name, members in names_and_members))


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
