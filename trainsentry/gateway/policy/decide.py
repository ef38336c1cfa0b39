"""The alert policy's entry points: classify → dedup/flap → incident → storm → route → drafts.

The planner (stages/planning/plan.py) runs exactly these, and so do the tests (issue 45:
tests/architecture/test_layout.py refuses a test-only entry point). `fold_into` decides one
`AlertChange` of a batch: the job's storm state is a mutable `StormFold` (storm_fold.py) it
updates in place, frozen once per batch; the batch's incidents (`IncidentBook`, incident.py)
are drafted once at its end (`flush`), so 20 alerts of one group in one batch are one card.
`decide_tick` handles the timers (held resolutions, storm summaries due, storms calming down,
incidents' follow-ups). All are pure: states and `now` in, new states and
`NotificationDraft`s out. An alert's notice changes its incident; the incident is what is
announced (incident.py `incident_drafts`). Idempotency keys depend only on what is
announced (the incident + the change shown, or job + storm episode + summary number) and the
channel.

The payload builders are in payload_build.py; `PolicyMetrics` (gateway/metrics.py) counts results.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import (
    Alert,
    AlertChange,
    AlertStatus,
    JobRef,
    NotificationDraft,
    Priority,
)
from trainsentry.gateway.policy import dedup
from trainsentry.gateway.policy.classify import Classification, classify
from trainsentry.gateway.policy.dedup import Decision, FingerprintState
from trainsentry.gateway.policy.drafts import Drafts
from trainsentry.gateway.policy.incident import (
    IncidentBook,
    cause_of,
)
from trainsentry.gateway.policy.infra import InfraFold, InfraMessage, InfraState
from trainsentry.gateway.policy.notice_incident import INFRA_FOLDED, deliver
from trainsentry.gateway.policy.payload_build import (
    alert_from_json,
    alert_to_json,
)
from trainsentry.gateway.policy.route import JobRoute
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import (
    StormMessage,
    StormState,
    due,
    job_key,
)
from trainsentry.gateway.policy.storm_fold import (
    S,
    StormFold,
    due_any,
    observe_any,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeResult:
    """What the policy made of one alert change (its job's storm state aside)."""

    fingerprint_state: FingerprintState
    drafts: list[NotificationDraft]
    classification: Classification
    decisions: tuple[Decision, ...]
    storm_messages: tuple[StormMessage, ...] = ()
    collapsed: int = 0  # notices folded into a storm summary instead of sent
    unconfigured: tuple[str, ...] = ()  # routed channels this gateway has no notifier for
    infra_states: dict[str, InfraState] = field(default_factory=dict)  # only the changed ones
    infra_messages: tuple[InfraMessage, ...] = ()
    infra_folded: int = 0  # notices folded into an infrastructure incident instead of sent


@dataclass(frozen=True, slots=True)
class TickResult:
    fingerprint_states: dict[str, FingerprintState]  # only the changed ones
    storm_states: dict[str, StormState]  # only the changed ones, by job key
    drafts: list[NotificationDraft]
    decisions: tuple[Decision, ...] = ()
    storm_messages: tuple[StormMessage, ...] = ()
    collapsed: int = 0
    unconfigured: tuple[str, ...] = ()


def _context(alert: Alert, alert_id: int | None, classification: Classification) -> dict[str, Any]:
    return {
        "alert": alert_to_json(alert),
        "alert_id": alert_id,
        "classification": classification.to_json(),
    }


def _apply(
    decision: Decision,
    fp: FingerprintState,
    storm: S,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    out: Drafts,
) -> tuple[FingerprintState, S]:
    """Turns one dedup decision into storm bookkeeping and its incident's change."""
    policy = out.policy
    out.decisions.append(decision)
    changes: dict[str, Any] = {}
    if decision.transition is AlertStatus.FIRING:
        storm, messages = observe_any(
            storm, decision.at, classification.priority, policy, cause_of(alert)
        )
        out.storm_messages(messages)
        changes["alert_id"] = alert_id
        changes["context"] = _context(alert, alert_id, classification)
    elif decision.transition is AlertStatus.RESOLVED:
        # A resolve keeps the priority it had while firing.
        context = dict(fp.context) or _context(alert, alert_id, classification)
        context["alert"] = alert_to_json(alert)
        # Folded when it resolves, whether its notice goes now or is held (a flapping alert's
        # resolve released later by the timer stays folded: the flag is kept with the state).
        if out.infra is not None and out.infra.fold_resolved(alert, decision.at):
            context[INFRA_FOLDED] = True
        changes["context"] = context
    if decision.notice is not None:
        storm = deliver(decision, fp, storm, alert, alert_id, classification, out, changes)
    return (fp.amended(changes) if changes else fp), storm


def _release(
    decision: Decision,
    fp: FingerprintState,
    storm: S,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    out: Drafts,
) -> tuple[FingerprintState, S]:
    """`_apply` for a held resolution released at `decision.at` (the hold's end): the
    storm's timers are brought to that time first, so it is folded into the storm if the
    storm was still on then, else into a summary after its end. Invariant: a late tick (or
    a late webhook of the same alert) folds it where a timely one would have, so the cards
    do not depend on when the release is processed (nor on a replay that shifts it)."""
    storm, messages = due_any(storm, decision.at, out.policy)
    out.storm_messages(messages)
    return _apply(decision, fp, storm, alert, alert_id, classification, out)


def _held_subject(
    fp: FingerprintState, fallback: Alert | None, fallback_class: Classification | None
) -> tuple[Alert, int | None, Classification]:
    """The alert, its id and its classification as remembered in the state's context."""
    context = fp.context
    if "alert" in context:
        alert = alert_from_json(context["alert"])
    elif fallback is not None:
        alert = fallback
    else:
        alert = Alert(fp.fingerprint, fp.status, {}, {}, fp.occurrence, None)
    if "classification" in context:
        classification = Classification.from_json(context["classification"])
    elif fallback_class is not None:
        classification = fallback_class
    else:
        classification = Classification(Priority.P3, "unknown", "no classification remembered")
    return alert, context.get("alert_id", fp.alert_id), classification


def fold_into(
    storm: StormFold,
    change: AlertChange,
    *,
    fingerprint_state: FingerprintState | None,
    distinct_nodes_in_window: int,
    policy: Policy,
    now: datetime,
    incidents: IncidentBook,
    channels: Collection[str] | None = None,
    job_routes: Mapping[JobRef, JobRoute] | None = None,
    place: Mapping[str, str] | None = None,
    infra: InfraFold | None = None,
    updatable: Collection[str] = (),
) -> ChangeResult:
    """Everything the policy does with one change of a batch, its incident's drafts aside:
    the caller calls `flush` on the batch's `incidents` once, after its changes.

    `storm`: the job's `StormFold` for the batch (key `storm.job_key(labels)`, changed in
    place, frozen once at the batch's end), instead of a state copied twice per alert.
    `fingerprint_state`: the stored state of `change.alert.fingerprint` (None if new).
    `distinct_nodes_in_window`: distinct nodes of the job with this alertname within
    `policy.blast_radius.window`, this alert included. `incidents`: the batch's incidents
    (changed in place). `channels`: configured channel names. `job_routes`: the
    TrainingJobs' own routes (route.JobRoute), applied to their own alerts. `place`: the
    alert's node's place in the topology (shown on its cards); `infra`: the infrastructure
    incidents of that place (infra.py), which may take the alert's notices. `updatable`: the
    channels that update a card in place.

    Pure apart from `storm` and `incidents`. Invariant: folding a job's changes in order
    into one `StormFold` gives each change the result and the job the storm state that
    planning them one batch each gives (tests/gateway/policy/test_storm_fold.py).
    """
    out = Drafts(
        policy=policy,
        channels=channels,
        job_routes=job_routes or {},
        place=place,
        infra=infra,
        incidents=incidents,
        group_key=change.group_key,
        updatable=updatable,
    )
    _, fields = _decide(
        change, fingerprint_state, storm, distinct_nodes_in_window, policy, now, out
    )
    return ChangeResult(**fields)


def flush(
    incidents: IncidentBook,
    *,
    policy: Policy,
    now: datetime,
    channels: Collection[str] | None = None,
    job_routes: Mapping[JobRef, JobRoute] | None = None,
    updatable: Collection[str] = (),
    infra_open: Collection[str] = (),
) -> tuple[list[NotificationDraft], tuple[str, ...]]:
    """The drafts the batch's changed incidents owe (once per batch: `fold_into` leaves
    them), and the routed channels this gateway lacks. `infra_open`: the keys of the
    elements whose infrastructure incident is open (those the held incidents wait for, at
    least: infra_hold.py)."""
    out = Drafts(
        policy=policy,
        channels=channels,
        job_routes=job_routes or {},
        incidents=incidents,
        updatable=updatable,
        infra_open=infra_open,
    )
    out.flush(now)
    return out.drafts, tuple(dict.fromkeys(out.unconfigured))


def _decide(
    change: AlertChange,
    fingerprint_state: FingerprintState | None,
    storm: S,
    distinct_nodes_in_window: int,
    policy: Policy,
    now: datetime,
    out: Drafts,
) -> tuple[S, dict[str, Any]]:
    """The steps of `fold_into`; the result's fields."""
    alert = change.alert
    key = job_key(alert.labels)
    if storm.job != key:
        raise ValueError(f"storm state of {storm.job} given for an alert of {key}")
    classification = classify(alert, policy, distinct_nodes_in_window=distinct_nodes_in_window)
    fp, decisions = dedup.advance(fingerprint_state, change, policy, now)
    for decision in decisions:
        if decision.released and fingerprint_state is not None:
            # a hold `now` has passed: released into the storm as it was when the hold ended
            held_alert, held_id, held_class = _held_subject(
                fingerprint_state, alert, classification
            )
            fp, storm = _release(decision, fp, storm, held_alert, held_id, held_class, out)
    storm, messages = due_any(storm, now, policy)
    out.storm_messages(messages)
    for decision in decisions:
        if decision.released:
            continue
        used = classification
        if decision.transition is AlertStatus.RESOLVED and "classification" in fp.context:
            used = Classification.from_json(fp.context["classification"])
        fp, storm = _apply(decision, fp, storm, alert, change.alert_id, used, out)
    book = out.incidents
    if book is not None and change.alert_id not in book.members:
        # no notice placed it (a repeat, a resolve never seen firing): it is still in one
        book.add_quiet(change.alert_id, alert, classification, change.group_key, change.at)
    infra = out.infra
    if infra is not None:
        out.infra_messages(infra.messages)
    return storm, {
        "fingerprint_state": fp,
        "drafts": out.drafts,
        "classification": classification,
        "decisions": tuple(out.decisions),
        "storm_messages": tuple(out.messages),
        "collapsed": out.collapsed,
        "unconfigured": tuple(dict.fromkeys(out.unconfigured)),
        "infra_states": dict(infra.changed) if infra is not None else {},
        "infra_messages": tuple(infra.messages) if infra is not None else (),
        "infra_folded": out.infra_folded,
    }


def decide_tick(
    fingerprint_states: Iterable[FingerprintState],
    storm_states: Iterable[StormState],
    *,
    policy: Policy,
    now: datetime,
    channels: Collection[str] | None = None,
    job_routes: Mapping[JobRef, JobRoute] | None = None,
    incidents: IncidentBook | None = None,
    updatable: Collection[str] = (),
    infra_open: Collection[str] = (),
) -> TickResult:
    """The timers: held resolutions whose hold passed, storm summaries due, storms that
    calmed down, incidents' follow-ups due. Pass the states with `hold_until <= now`, the
    storm states with `next_due(policy) <= now` and, in `incidents`, the incidents of those
    alerts and those whose `due_at` passed (`IncidentBook.wake`; passing more is harmless);
    `infra_open` as `flush` takes it. Returns only changed states (the incidents change in
    place)."""
    out = Drafts(
        policy=policy,
        channels=channels,
        job_routes=job_routes or {},
        incidents=incidents if incidents is not None else IncidentBook(policy),
        updatable=updatable,
        infra_open=infra_open,
    )
    storms = {state.job: state for state in storm_states}
    changed_storms: set[str] = set()
    changed_fps: dict[str, FingerprintState] = {}
    # held resolutions in the order their holds ended (each brings its storm to that time)
    for fp in sorted(fingerprint_states, key=lambda state: state.hold_until or now):
        released, decisions = dedup.tick(fp, now)
        if not decisions:
            if released != fp:
                changed_fps[fp.fingerprint] = released
            continue
        alert, alert_id, classification = _held_subject(fp, None, None)
        key = job_key(alert.labels)
        storm = storms.get(key) or StormState.new(alert.labels)
        for decision in decisions:
            released, storm = _release(
                decision, released, storm, alert, alert_id, classification, out
            )
        storms[key] = storm
        changed_storms.add(key)
        changed_fps[fp.fingerprint] = released
    for key, storm in list(storms.items()):
        updated, messages = due(storm, now, policy)
        if messages or updated != storm:
            storms[key] = updated
            changed_storms.add(key)
            out.storm_messages(messages)
    out.flush(now)
    return TickResult(
        fingerprint_states=changed_fps,
        storm_states={key: storms[key] for key in sorted(changed_storms)},
        drafts=out.drafts,
        decisions=tuple(out.decisions),
        storm_messages=tuple(out.messages),
        collapsed=out.collapsed,
        unconfigured=tuple(dict.fromkeys(out.unconfigured)),
    )
