"""The alert policy in one call: classify → dedup/flap → storm → route → notification drafts.

`decide` handles one `AlertChange`; `decide_tick` handles the timers (held resolutions,
storm summaries due, storms calming down). Both are pure: states and `now` in, new states
and `NotificationDraft`s out. `fold_into` is `decide` for the planner's batches: the job's
storm state is a mutable `StormFold` (storm_fold.py) it updates in place, frozen once per
batch, with the same results. Idempotency keys depend only on what is announced (alert
fingerprint + occurrence + notice, or job + storm episode + summary number) and the
channel, so replaying a change or a late tick yields the same keys.

The payload builders are in payload.py; `PolicyMetrics` (gateway/metrics.py) counts results.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
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
from trainsentry.gateway.policy.dedup import Decision, FingerprintState, Notice
from trainsentry.gateway.policy.infra import INFRA_KIND, InfraFold, InfraMessage, InfraState
from trainsentry.gateway.policy.payload import (
    ALERT_KIND,
    STORM_KIND,
    alert_from_json,
    alert_payload,
    alert_to_json,
    idempotency_key,
    storm_payload,
    storm_summary,
)
from trainsentry.gateway.policy.route import JobRoute, apply_job_route, route
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import (
    StormEntry,
    StormMessage,
    StormState,
    Verdict,
    due,
    job_key,
)
from trainsentry.gateway.policy.storm_fold import (
    S,
    StormFold,
    collapse_any,
    due_any,
    observe_any,
    verdict_any,
)
from trainsentry.notifiers.payload import JobRoutePayload

INFRA_FOLDED = "infra_folded"  # fingerprint context: its resolve went to an incident


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DecideResult(ChangeResult):
    storm_state: StormState


@dataclass(frozen=True, slots=True)
class TickResult:
    fingerprint_states: dict[str, FingerprintState]  # only the changed ones
    storm_states: dict[str, StormState]  # only the changed ones, by job key
    drafts: list[NotificationDraft]
    decisions: tuple[Decision, ...] = ()
    storm_messages: tuple[StormMessage, ...] = ()
    collapsed: int = 0
    unconfigured: tuple[str, ...] = ()


@dataclass(slots=True)
class _Out:
    """What one call produces, gathered as the steps run."""

    policy: Policy
    channels: Collection[str] | None
    drafts: list[NotificationDraft] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    messages: list[StormMessage] = field(default_factory=list)
    collapsed: int = 0
    unconfigured: list[str] = field(default_factory=list)
    # TrainingJobs' own routes (spec.alerting), by job; each applies to its own job's alerts
    job_routes: Mapping[JobRef, JobRoute] = field(default_factory=dict)
    job_extra: JobRoutePayload | None = None  # of the last `_route`
    place: Mapping[str, str] | None = None  # the alert's node's place in the topology
    infra: InfraFold | None = None  # set when the alert's node has a place
    infra_folded: int = 0

    def _route(
        self, priority: Priority, labels: Mapping[str, str], *, paging: bool
    ) -> tuple[tuple[str, ...], str]:
        decision = route(priority, labels, self.policy, configured=self.channels, paging=paging)
        self.unconfigured.extend(decision.unconfigured)
        self.job_extra = None
        job = JobRef.from_labels(labels) if self.job_routes else None
        if job is not None and (job_route := self.job_routes.get(job)) is not None:
            decision, self.job_extra = apply_job_route(
                decision,
                priority,
                job,
                job_route,
                self.policy.routing.jobs,
                paging_channels=self.policy.routing.paging_channels,
            )
        return decision.channels, decision.route_id

    def alert_notice(
        self,
        decision: Decision,
        alert: Alert,
        alert_id: int | None,
        classification: Classification,
        *,
        paging: bool,
        storm: Mapping[str, Any] | None = None,
    ) -> None:
        assert decision.notice is not None
        channels, route_id = self._route(classification.priority, alert.labels, paging=paging)
        payload = alert_payload(decision, alert, alert_id, classification, route_id=route_id)
        if self.job_extra is not None:
            payload["job_route"] = self.job_extra
        if self.place:
            payload["topology"] = dict(self.place)
        if storm is not None:
            payload["storm"] = storm_summary(storm)
        occurrence = decision.occurrence.isoformat()
        for channel in channels:
            self.drafts.append(
                NotificationDraft(
                    channel=channel,
                    kind=ALERT_KIND,
                    priority=classification.priority,
                    idempotency_key=idempotency_key(
                        ALERT_KIND, alert.fingerprint, occurrence, decision.notice.value, channel
                    ),
                    payload=dict(payload),
                    alert_id=alert_id,
                    group_key=f"alert:{alert.fingerprint}",
                    reason=f"{classification.rule_id}: {classification.reason}",
                )
            )

    def infra_messages(self, messages: Iterable[InfraMessage]) -> None:
        for message in messages:
            channels, route_id = self._route(
                message.priority, message.labels, paging=message.paging
            )
            extra = {"job_route": self.job_extra} if self.job_extra is not None else {}
            for channel in channels:
                payload = dict(message.payload, route=route_id, **extra)
                self.drafts.append(
                    NotificationDraft(
                        channel=channel,
                        kind=INFRA_KIND,
                        priority=message.priority,
                        idempotency_key=idempotency_key(*message.ident, channel),
                        payload=payload,
                        alert_id=message.alert_id,
                        group_key=f"infra:{message.key}",
                        reason=payload["reason"],
                    )
                )

    def storm_messages(self, messages: Iterable[StormMessage]) -> None:
        for message in messages:
            self.messages.append(message)
            channels, route_id = self._route(message.priority, message.labels, paging=False)
            payload = storm_payload(message, self.policy, route_id=route_id)
            if self.job_extra is not None:
                payload["job_route"] = self.job_extra
            for channel in channels:
                self.drafts.append(
                    NotificationDraft(
                        channel=channel,
                        kind=STORM_KIND,
                        priority=message.priority,
                        idempotency_key=idempotency_key(
                            STORM_KIND,
                            message.kind.value,
                            message.job,
                            message.episode,
                            str(message.seq),
                            channel,
                        ),
                        payload=dict(payload),
                        group_key=f"storm:{message.job}",
                        reason=payload["reason"],
                    )
                )


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
    out: _Out,
) -> tuple[FingerprintState, S]:
    """Turns one dedup decision into storm bookkeeping and drafts."""
    policy = out.policy
    out.decisions.append(decision)
    changes: dict[str, Any] = {}
    if decision.transition is AlertStatus.FIRING:
        storm, messages = observe_any(storm, decision.at, classification.priority, policy)
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
        storm = _deliver(decision, fp, storm, alert, alert_id, classification, out, changes)
    return (replace(fp, **changes) if changes else fp), storm


def _deliver(
    decision: Decision,
    fp: FingerprintState,
    storm: S,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    out: _Out,
    changes: dict[str, Any],
) -> S:
    """Sends a notice on its own, as the storm's one P0 page, or folds it into a summary."""
    policy = out.policy
    resolving = decision.transition is AlertStatus.RESOLVED or decision.notice is Notice.RESOLVED
    folded = (
        bool((changes.get("context") or fp.context).get(INFRA_FOLDED))
        if resolving
        else out.infra is not None
        and out.infra.fold_firing(alert, alert_id, classification, decision.at)
    )
    if folded:
        out.infra_folded += 1  # the infrastructure incident speaks for it
        return storm
    if resolving:
        if storm.active or fp.collapsed:
            out.collapsed += 1
            entry = StormEntry(
                alert, classification.priority, AlertStatus.RESOLVED, decision.at, alert_id
            )
            return collapse_any(storm, entry, policy)
        out.alert_notice(decision, alert, alert_id, classification, paging=False)
        return storm

    fresh_page = decision.notice is Notice.FIRING
    storm, how = verdict_any(storm, classification.priority, fresh_page=fresh_page)
    changes["collapsed"] = how is Verdict.COLLAPSE
    if how is Verdict.COLLAPSE:
        out.collapsed += 1
        entry = StormEntry(
            alert, classification.priority, AlertStatus.FIRING, decision.at, alert_id
        )
        return collapse_any(storm, entry, policy)
    storm_info = None
    if how is Verdict.PAGE:
        storm_info = {
            "job": storm.job,
            "total": storm.window_count(decision.at, policy.storm),
            "episode": storm.episode,
            "note": "alert storm on this job: this is its one P0 page; the rest is summarised",
        }
    out.alert_notice(decision, alert, alert_id, classification, paging=fresh_page, storm=storm_info)
    return storm


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


def decide(
    change: AlertChange,
    *,
    fingerprint_state: FingerprintState | None,
    storm_state: StormState | None,
    distinct_nodes_in_window: int,
    policy: Policy,
    now: datetime,
    channels: Collection[str] | None = None,
    job_routes: Mapping[JobRef, JobRoute] | None = None,
    place: Mapping[str, str] | None = None,
    infra: InfraFold | None = None,
) -> DecideResult:
    """Everything the policy does with one alert change.

    `fingerprint_state`: the stored state of `change.alert.fingerprint` (None if new).
    `storm_state`: the stored state of the alert's job, key `storm.job_key(labels)`.
    `distinct_nodes_in_window`: distinct nodes of the job with this alertname within
    `policy.blast_radius.window`, this alert included. `channels`: configured channel names.
    `job_routes`: the TrainingJobs' own routes (route.JobRoute), applied to their own alerts.
    `place`: the alert's node's place in the topology (shown on its cards); `infra`: the
    infrastructure incidents of that place (infra.py), which may take the alert's notices.
    """
    storm = storm_state if storm_state is not None else StormState.new(change.alert.labels)
    storm, fields = _decide(
        change,
        fingerprint_state,
        storm,
        distinct_nodes_in_window,
        policy,
        now,
        _Out(
            policy=policy, channels=channels, job_routes=job_routes or {}, place=place, infra=infra
        ),
    )
    return DecideResult(storm_state=storm, **fields)


def fold_into(
    storm: StormFold,
    change: AlertChange,
    *,
    fingerprint_state: FingerprintState | None,
    distinct_nodes_in_window: int,
    policy: Policy,
    now: datetime,
    channels: Collection[str] | None = None,
    job_routes: Mapping[JobRef, JobRoute] | None = None,
    place: Mapping[str, str] | None = None,
    infra: InfraFold | None = None,
) -> ChangeResult:
    """`decide` for one change of a batch, its job's storm state kept in `storm` (the job's
    `StormFold` for the batch, changed in place) instead of copied twice per alert.

    Pure apart from `storm`. Invariant: folding a job's changes in order into
    `StormFold.of(state)` and freezing it gives the storm state that chaining `decide` over
    the same changes gives, and each change's result equals `decide`'s, storm state aside
    (tests/gateway/policy/test_storm_fold.py). Infrastructure incidents, job routes and the
    rest run exactly as in `decide`: only where the job's storm state lives differs.
    """
    out = _Out(
        policy=policy, channels=channels, job_routes=job_routes or {}, place=place, infra=infra
    )
    _, fields = _decide(
        change, fingerprint_state, storm, distinct_nodes_in_window, policy, now, out
    )
    return ChangeResult(**fields)


def _decide(
    change: AlertChange,
    fingerprint_state: FingerprintState | None,
    storm: S,
    distinct_nodes_in_window: int,
    policy: Policy,
    now: datetime,
    out: _Out,
) -> tuple[S, dict[str, Any]]:
    """The steps of `decide`, for either kind of storm state; the result's fields."""
    alert = change.alert
    key = job_key(alert.labels)
    if storm.job != key:
        raise ValueError(f"storm state of {storm.job} given for an alert of {key}")
    classification = classify(alert, policy, distinct_nodes_in_window=distinct_nodes_in_window)
    storm, messages = due_any(storm, now, policy)
    out.storm_messages(messages)
    fp, decisions = dedup.advance(fingerprint_state, change, policy, now)
    for decision in decisions:
        if decision.released and fingerprint_state is not None:
            held_alert, held_id, held_class = _held_subject(
                fingerprint_state, alert, classification
            )
            fp, storm = _apply(decision, fp, storm, held_alert, held_id, held_class, out)
            continue
        used = classification
        if decision.transition is AlertStatus.RESOLVED and "classification" in fp.context:
            used = Classification.from_json(fp.context["classification"])
        fp, storm = _apply(decision, fp, storm, alert, change.alert_id, used, out)
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
) -> TickResult:
    """The timers: held resolutions whose hold passed, storm summaries due, storms that
    calmed down. Pass the states with `hold_until <= now` and the storm states with
    `next_due(policy) <= now` (passing more is harmless). Returns only changed states."""
    out = _Out(policy=policy, channels=channels, job_routes=job_routes or {})
    storms = {state.job: state for state in storm_states}
    changed_storms: set[str] = set()
    changed_fps: dict[str, FingerprintState] = {}
    for fp in fingerprint_states:
        released, decisions = dedup.tick(fp, now)
        if not decisions:
            if released != fp:
                changed_fps[fp.fingerprint] = released
            continue
        alert, alert_id, classification = _held_subject(fp, None, None)
        key = job_key(alert.labels)
        storm = storms.get(key) or StormState.new(alert.labels)
        for decision in decisions:
            released, storm = _apply(
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
    return TickResult(
        fingerprint_states=changed_fps,
        storm_states={key: storms[key] for key in sorted(changed_storms)},
        drafts=out.drafts,
        decisions=tuple(out.decisions),
        storm_messages=tuple(out.messages),
        collapsed=out.collapsed,
        unconfigured=tuple(dict.fromkeys(out.unconfigured)),
    )
