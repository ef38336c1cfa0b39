"""Per-fingerprint state machine: which status changes of one alert deserve a notification.

Pure: the state goes in, a new state and the decisions come out; time is a parameter.

Every change is ordered by (occurrence startsAt, firing < resolved). A change that does not
move that key forward is a repeat or a stale replay and is suppressed, so any interleaving
or replay of webhooks yields at most one notice per (fingerprint, occurrence, status).
A resolve resolves only the occurrence seen firing (the same startsAt); a resolve of an
occurrence never seen firing is suppressed (`RESOLVE_UNSEEN`), whatever its startsAt.

Transitions are timed by `AlertChange.at` (when the store recorded the change), not by the
clock at decision time, so replaying a change gives the same answer.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import AlertChange, AlertStatus, ChangeKind
from trainsentry.gateway.policy.rules import Policy

# Transitions kept for flap counting are pruned to the window; this bounds a pathological flood.
_MAX_TRANSITIONS = 256


class Notice(enum.StrEnum):
    FIRING = "firing"  # a fresh page
    RECURRENCE = "recurrence"  # fired again within R of resolving: shown, not a fresh page
    FLAPPING = "flapping"  # K transitions within T: one notice with the count
    RESOLVED = "resolved"


class Suppression(enum.StrEnum):
    REPEAT = "repeat"  # the same status again (Alertmanager's repeated group notifications)
    STALE = "stale"  # an older occurrence or a status already passed (out-of-order replay)
    FLAPPING = "flapping"  # a transition of an alert already announced as flapping
    HELD = "held"  # a flapping alert's resolution, waiting H before it is announced
    RESOLVE_UNSEEN = "resolve-unseen"  # resolved, but we never saw it firing


@dataclass(frozen=True, slots=True)
class Decision:
    fingerprint: str
    occurrence: datetime  # startsAt of the occurrence the decision is about
    at: datetime
    notice: Notice | None  # None: suppressed
    suppressed: Suppression | None = None
    transition: AlertStatus | None = None  # the status change applied to the state, if any
    recurrences: int = 0
    flap_transitions: int = 0
    expired: bool = False
    held_until: datetime | None = None
    released: bool = False  # a held resolution released by the timer

    @property
    def notify(self) -> bool:
        return self.notice is not None


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True, slots=True)
class FingerprintState:
    """What the policy remembers about one alert fingerprint (persisted by the store)."""

    fingerprint: str
    status: AlertStatus
    occurrence: datetime
    changed_at: datetime
    resolved_at: datetime | None = None
    recurrences: int = 0
    transitions: tuple[datetime, ...] = ()
    flapping: bool = False
    hold_until: datetime | None = None
    expired: bool = False
    # Set by decide.py: the occurrence went only into a storm summary, and what to show when
    # a held resolution is released (alert and classification as JSON).
    collapsed: bool = False
    alert_id: int | None = None
    context: Mapping[str, Any] = field(default_factory=dict)

    def amended(self, changes: Mapping[str, Any]) -> FingerprintState:
        """Pure: `dataclasses.replace(self, **changes)`, without its generic walk over the
        fields when `changes` names only what decide.py changes (`AMENDED`): a third of
        its cost, once per firing change of a storm (issue 46)."""
        if not changes.keys() <= AMENDED:
            return replace(self, **changes)
        return FingerprintState(
            self.fingerprint,
            self.status,
            self.occurrence,
            self.changed_at,
            self.resolved_at,
            self.recurrences,
            self.transitions,
            self.flapping,
            self.hold_until,
            self.expired,
            changes.get("collapsed", self.collapsed),
            changes.get("alert_id", self.alert_id),
            changes.get("context", self.context),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "status": self.status.value,
            "occurrence": self.occurrence.isoformat(),
            "changed_at": self.changed_at.isoformat(),
            "resolved_at": _iso(self.resolved_at),
            "recurrences": self.recurrences,
            "transitions": [t.isoformat() for t in self.transitions],
            "flapping": self.flapping,
            "hold_until": _iso(self.hold_until),
            "expired": self.expired,
            "collapsed": self.collapsed,
            "alert_id": self.alert_id,
            "context": dict(self.context),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FingerprintState:
        return cls(
            fingerprint=data["fingerprint"],
            status=AlertStatus(data["status"]),
            occurrence=datetime.fromisoformat(data["occurrence"]),
            changed_at=datetime.fromisoformat(data["changed_at"]),
            resolved_at=_dt(data.get("resolved_at")),
            recurrences=int(data.get("recurrences", 0)),
            transitions=tuple(datetime.fromisoformat(t) for t in data.get("transitions", ())),
            flapping=bool(data.get("flapping", False)),
            hold_until=_dt(data.get("hold_until")),
            expired=bool(data.get("expired", False)),
            collapsed=bool(data.get("collapsed", False)),
            alert_id=data.get("alert_id"),
            context=dict(data.get("context") or {}),
        )


# The fields decide.py sets on a state (`FingerprintState.amended`).
AMENDED = frozenset({"collapsed", "alert_id", "context"})
_RANK = {AlertStatus.FIRING: 0, AlertStatus.RESOLVED: 1}


def _target(kind: ChangeKind) -> AlertStatus:
    return AlertStatus.FIRING if kind is ChangeKind.FIRING else AlertStatus.RESOLVED


def _recent(transitions: tuple[datetime, ...], at: datetime, window: float) -> tuple[datetime, ...]:
    since = at - timedelta(seconds=window)
    kept = tuple(t for t in (*transitions, at) if t > since)
    return kept[-_MAX_TRANSITIONS:]


def tick(state: FingerprintState, now: datetime) -> tuple[FingerprintState, list[Decision]]:
    """Releases a held resolution whose hold has passed. The decision is timed at the hold's
    end, not at `now`, so a late tick announces the same thing."""
    if state.hold_until is None or now < state.hold_until:
        return state, []
    if state.status is not AlertStatus.RESOLVED:  # cannot happen; a firing cancels the hold
        return replace(state, hold_until=None), []
    decision = Decision(
        fingerprint=state.fingerprint,
        occurrence=state.occurrence,
        at=state.hold_until,
        notice=Notice.RESOLVED,
        recurrences=state.recurrences,
        flap_transitions=len(state.transitions),
        expired=state.expired,
        released=True,
    )
    return replace(state, flapping=False, hold_until=None, transitions=()), [decision]


def _first(change: AlertChange) -> tuple[FingerprintState, Decision]:
    alert = change.alert
    target = _target(change.kind)
    state = FingerprintState(
        fingerprint=alert.fingerprint,
        status=target,
        occurrence=alert.starts_at,
        changed_at=change.at,
        transitions=(change.at,) if target is AlertStatus.FIRING else (),
        expired=change.kind is ChangeKind.EXPIRED,
    )
    if target is AlertStatus.FIRING:
        notice = Decision(
            alert.fingerprint,
            alert.starts_at,
            change.at,
            Notice.FIRING,
            transition=AlertStatus.FIRING,
            flap_transitions=1,
        )
    else:
        notice = Decision(
            alert.fingerprint,
            alert.starts_at,
            change.at,
            None,
            suppressed=Suppression.RESOLVE_UNSEEN,
        )
    return state, notice


def _fire(
    state: FingerprintState, change: AlertChange, policy: Policy
) -> tuple[FingerprintState, Decision]:
    rules = policy.dedup
    at = change.at
    transitions = _recent(state.transitions, at, rules.flap_window)
    within_r = state.resolved_at is not None and (at - state.resolved_at) <= timedelta(
        seconds=rules.recurrence_window
    )
    recurrences = state.recurrences + 1 if within_r else 0
    new = replace(
        state,
        status=AlertStatus.FIRING,
        occurrence=change.alert.starts_at,
        changed_at=at,
        recurrences=recurrences,
        transitions=transitions,
        hold_until=None,
        expired=False,
    )
    base: dict[str, Any] = {
        "fingerprint": state.fingerprint,
        "occurrence": change.alert.starts_at,
        "at": at,
        "transition": AlertStatus.FIRING,
        "recurrences": recurrences,
        "flap_transitions": len(transitions),
    }
    if state.flapping:
        return new, Decision(notice=None, suppressed=Suppression.FLAPPING, **base)
    if len(transitions) >= rules.flap_transitions:
        return replace(new, flapping=True), Decision(notice=Notice.FLAPPING, **base)
    if within_r:
        return new, Decision(notice=Notice.RECURRENCE, **base)
    return new, Decision(notice=Notice.FIRING, **base)


def _resolve(
    state: FingerprintState, change: AlertChange, policy: Policy
) -> tuple[FingerprintState, Decision]:
    rules = policy.dedup
    at = change.at
    expired = change.kind is ChangeKind.EXPIRED
    transitions = _recent(state.transitions, at, rules.flap_window)
    new = replace(
        state,
        status=AlertStatus.RESOLVED,
        occurrence=max(state.occurrence, change.alert.starts_at),
        changed_at=at,
        resolved_at=at,
        transitions=transitions,
        expired=expired,
    )
    base: dict[str, Any] = {
        "fingerprint": state.fingerprint,
        "occurrence": new.occurrence,
        "at": at,
        "transition": AlertStatus.RESOLVED,
        "recurrences": state.recurrences,
        "flap_transitions": len(transitions),
        "expired": expired,
    }
    hold_until = at + timedelta(seconds=rules.flap_hold)
    if state.flapping:
        held = replace(new, hold_until=hold_until)
        return held, Decision(
            notice=None, suppressed=Suppression.HELD, held_until=hold_until, **base
        )
    if len(transitions) >= rules.flap_transitions:
        held = replace(new, flapping=True, hold_until=hold_until)
        return held, Decision(notice=Notice.FLAPPING, held_until=hold_until, **base)
    return new, Decision(notice=Notice.RESOLVED, **base)


def advance(
    state: FingerprintState | None, change: AlertChange, policy: Policy, now: datetime
) -> tuple[FingerprintState, list[Decision]]:
    """Applies one change. First releases a hold that `now` has passed (its notice comes
    first), then decides the change itself."""
    alert = change.alert
    if state is not None and state.fingerprint != alert.fingerprint:
        raise ValueError(f"state of {state.fingerprint} given for {alert.fingerprint}")
    decisions: list[Decision] = []
    if state is None:
        first, decision = _first(change)
        return first, [decision]
    state, released = tick(state, now)
    decisions.extend(released)

    target = _target(change.kind)
    new_key = (alert.starts_at, _RANK[target])
    current_key = (state.occurrence, _RANK[state.status])
    if new_key <= current_key:
        reason = Suppression.REPEAT if new_key == current_key else Suppression.STALE
        decisions.append(
            Decision(state.fingerprint, alert.starts_at, change.at, None, suppressed=reason)
        )
        return state, decisions
    resolving = target is AlertStatus.RESOLVED and state.status is AlertStatus.FIRING
    if resolving and alert.starts_at != state.occurrence:
        # A resolve needs the firing it resolves: an occurrence never seen firing (a forged
        # or misdirected "resolved") resolves nothing; the one firing fires on until its own
        # resolve, or its expiry, arrives (docs/policy.md).
        decisions.append(
            Decision(
                state.fingerprint,
                alert.starts_at,
                change.at,
                None,
                suppressed=Suppression.RESOLVE_UNSEEN,
            )
        )
        return state, decisions
    if target is state.status:
        # A newer occurrence in the same status (e.g. we missed its resolve): nothing to tell.
        state = replace(state, occurrence=alert.starts_at)
        decisions.append(
            Decision(
                state.fingerprint, alert.starts_at, change.at, None, suppressed=Suppression.REPEAT
            )
        )
        return state, decisions
    if target is AlertStatus.FIRING:
        state, decision = _fire(state, change, policy)
    else:
        state, decision = _resolve(state, change, policy)
    decisions.append(decision)
    return state, decisions
