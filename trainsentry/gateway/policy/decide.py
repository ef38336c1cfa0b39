"""The alert policy in one call: classify → dedup/flap → storm → route → notification drafts.

`decide` handles one `AlertChange`; `decide_tick` handles the timers (held resolutions,
storm summaries due, storms calming down). Both are pure: states and `now` in, new states
and `NotificationDraft`s out. Idempotency keys depend only on what is announced (alert
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
    collapse,
    due,
    job_key,
    observe_new,
    verdict,
)
from trainsentry.notifiers.payload import JobRoutePayload


@dataclass(frozen=True, slots=True)
class DecideResult:
    fingerprint_state: FingerprintState
    storm_state: StormState
    drafts: list[NotificationDraft]
    classification: Classification
    decisions: tuple[Decision, ...]
    storm_messages: tuple[StormMessage, ...] = ()
    collapsed: int = 0  # notices folded into a storm summary instead of sent
    unconfigured: tuple[str, ...] = ()  # routed channels this gateway has no notifier for


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
    storm: StormState,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    out: _Out,
) -> tuple[FingerprintState, StormState]:
    """Turns one dedup decision into storm bookkeeping and drafts."""
    policy = out.policy
    out.decisions.append(decision)
    changes: dict[str, Any] = {}
    if decision.transition is AlertStatus.FIRING:
        storm, messages = observe_new(storm, decision.at, classification.priority, policy)
        out.storm_messages(messages)
        changes["alert_id"] = alert_id
        changes["context"] = _context(alert, alert_id, classification)
    elif decision.transition is AlertStatus.RESOLVED:
        # A resolve keeps the priority it had while firing.
        context = dict(fp.context) or _context(alert, alert_id, classification)
        context["alert"] = alert_to_json(alert)
        changes["context"] = context
    if decision.notice is not None:
        storm = _deliver(decision, fp, storm, alert, alert_id, classification, out, changes)
    return (replace(fp, **changes) if changes else fp), storm


def _deliver(
    decision: Decision,
    fp: FingerprintState,
    storm: StormState,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    out: _Out,
    changes: dict[str, Any],
) -> StormState:
    """Sends a notice on its own, as the storm's one P0 page, or folds it into a summary."""
    policy = out.policy
    resolving = decision.transition is AlertStatus.RESOLVED or decision.notice is Notice.RESOLVED
    if resolving:
        if storm.active or fp.collapsed:
            out.collapsed += 1
            entry = StormEntry(
                alert, classification.priority, AlertStatus.RESOLVED, decision.at, alert_id
            )
            return collapse(storm, entry, policy)
        out.alert_notice(decision, alert, alert_id, classification, paging=False)
        return storm

    fresh_page = decision.notice is Notice.FIRING
    storm, how = verdict(storm, classification.priority, fresh_page=fresh_page)
    changes["collapsed"] = how is Verdict.COLLAPSE
    if how is Verdict.COLLAPSE:
        out.collapsed += 1
        entry = StormEntry(
            alert, classification.priority, AlertStatus.FIRING, decision.at, alert_id
        )
        return collapse(storm, entry, policy)
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
) -> DecideResult:
    """Everything the policy does with one alert change.

    `fingerprint_state`: the stored state of `change.alert.fingerprint` (None if new).
    `storm_state`: the stored state of the alert's job, key `storm.job_key(labels)`.
    `distinct_nodes_in_window`: distinct nodes of the job with this alertname within
    `policy.blast_radius.window`, this alert included. `channels`: configured channel names.
    `job_routes`: the TrainingJobs' own routes (route.JobRoute), applied to their own alerts.
    """
    alert = change.alert
    key = job_key(alert.labels)
    storm = storm_state if storm_state is not None else StormState.new(alert.labels)
    if storm.job != key:
        raise ValueError(f"storm state of {storm.job} given for an alert of {key}")
    classification = classify(alert, policy, distinct_nodes_in_window=distinct_nodes_in_window)
    out = _Out(policy=policy, channels=channels, job_routes=job_routes or {})

    storm, messages = due(storm, now, policy)
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

    return DecideResult(
        fingerprint_state=fp,
        storm_state=storm,
        drafts=out.drafts,
        classification=classification,
        decisions=tuple(out.decisions),
        storm_messages=tuple(out.messages),
        collapsed=out.collapsed,
        unconfigured=tuple(dict.fromkeys(out.unconfigured)),
    )


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
