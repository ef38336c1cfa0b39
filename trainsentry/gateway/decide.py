"""The alert policy in one call: classify → dedup/flap → storm → route → notification drafts.

`decide` handles one `AlertChange`; `decide_tick` handles the timers (held resolutions,
storm summaries due, storms calming down). Both are pure: states and `now` in, new states
and `NotificationDraft`s out. Idempotency keys depend only on what is announced (alert
fingerprint + occurrence + notice, or job + storm episode + summary number) and the
channel, so replaying a change or a late tick yields the same keys.

`PolicyMetrics` turns results into Prometheus counters (the gateway calls `observe`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from trainsentry.alerts import (
    GO_ZERO_TIME,
    Alert,
    AlertChange,
    AlertStatus,
    NotificationDraft,
    Priority,
)
from trainsentry.gateway import dedup
from trainsentry.gateway.classify import Classification, classify
from trainsentry.gateway.dedup import Decision, FingerprintState, Notice
from trainsentry.gateway.policy import Policy
from trainsentry.gateway.route import route
from trainsentry.gateway.storm import (
    StormEntry,
    StormMessage,
    StormMessageKind,
    StormState,
    Verdict,
    collapse,
    due,
    job_key,
    observe_new,
    verdict,
)

ALERT_KIND = "alert"  # NotificationDraft.kind of one alert's notice (payload contract)
STORM_KIND = "storm"  # NotificationDraft.kind of a storm message


def idempotency_key(*parts: str) -> str:
    """A stable key for a notification: same parts, same key, across replays and replicas."""
    digest = hashlib.sha256("\x1f".join(("v1", *parts)).encode("utf-8")).hexdigest()
    return digest[:40]


def alert_to_json(alert: Alert) -> dict[str, Any]:
    return {
        "fingerprint": alert.fingerprint,
        "status": alert.status.value,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "starts_at": alert.starts_at.isoformat(),
        "ends_at": None if alert.ends_at is None else alert.ends_at.isoformat(),
        "generator_url": alert.generator_url,
    }


def alert_from_json(data: Mapping[str, Any]) -> Alert:
    return Alert(
        fingerprint=data["fingerprint"],
        status=AlertStatus(data["status"]),
        labels=dict(data["labels"]),
        annotations=dict(data["annotations"]),
        starts_at=datetime.fromisoformat(data["starts_at"]),
        ends_at=None if data.get("ends_at") is None else datetime.fromisoformat(data["ends_at"]),
        generator_url=data.get("generator_url", ""),
    )


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

    def _route(
        self, priority: Priority, labels: Mapping[str, str], *, paging: bool
    ) -> tuple[tuple[str, ...], str]:
        decision = route(priority, labels, self.policy, configured=self.channels, paging=paging)
        self.unconfigured.extend(decision.unconfigured)
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
        if storm is not None:
            payload["storm"] = dict(storm)
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


def _iso(value: datetime | None) -> str | None:
    if value is None or value == GO_ZERO_TIME:
        return None
    return value.isoformat()


def alert_payload(
    decision: Decision,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    *,
    route_id: str = "",
) -> dict[str, Any]:
    """What a channel needs to render one alert notice (see notifiers/payload.py)."""
    notice = decision.notice
    # A flapping notice is not a resolution (that is held), whichever change triggered it.
    resolved = notice is Notice.RESOLVED
    payload: dict[str, Any] = {
        "priority": classification.priority.value,
        "status": (AlertStatus.RESOLVED if resolved else AlertStatus.FIRING).value,
        "event": notice.value if notice is not None else "",
        "fingerprint": alert.fingerprint,
        "alertname": alert.name,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "starts_at": alert.starts_at.isoformat(),
        "ends_at": _iso(alert.ends_at),
        "generator_url": alert.generator_url,
        "reason": classification.reason,
        "rule_id": classification.rule_id,
        "rule_ids": list(classification.rule_ids),
        "route": route_id,
        "recurrences": decision.recurrences,
        "flap_transitions": decision.flap_transitions,
        "expired": decision.expired,
        "at": decision.at.isoformat(),
    }
    if notice is Notice.RECURRENCE:
        payload["count"] = decision.recurrences + 1
    elif notice is Notice.FLAPPING:
        payload["count"] = decision.flap_transitions
    if decision.held_until is not None:
        payload["held_until"] = decision.held_until.isoformat()
    if alert.job is not None:
        payload["job"] = str(alert.job)
    if alert_id is not None:
        payload["alert_id"] = alert_id
    return payload


def storm_payload(message: StormMessage, policy: Policy, *, route_id: str = "") -> dict[str, Any]:
    """What a channel needs to render a storm message (see notifiers/payload.py)."""
    rules = policy.storm
    summary = message.summary
    only_resolved = summary.get("total", 0) > 0 and summary.get("firing", 1) == 0
    ended = message.kind is StormMessageKind.ENDED
    reason = {
        StormMessageKind.STARTED: (
            f"alert storm: {summary.get('total', 0)} new alerts of {message.job} within "
            f"{rules.window:g}s (more than {rules.threshold}); one summary every "
            f"{rules.summary_interval:g}s until it calms down"
        ),
        StormMessageKind.SUMMARY: f"alert storm summary #{message.seq} for {message.job}",
        StormMessageKind.ENDED: f"alert storm over for {message.job}",
    }[message.kind]
    return {
        "priority": message.priority.value,
        "status": (AlertStatus.RESOLVED if ended or only_resolved else AlertStatus.FIRING).value,
        "event": message.kind.value,
        "labels": dict(message.labels),
        "job": message.job,
        "reason": reason,
        "rule_id": "storm",
        "route": route_id,
        "storm": dict(summary),
        "at": message.at.isoformat(),
    }


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
) -> DecideResult:
    """Everything the policy does with one alert change.

    `fingerprint_state`: the stored state of `change.alert.fingerprint` (None if new).
    `storm_state`: the stored state of the alert's job, key `storm.job_key(labels)`.
    `distinct_nodes_in_window`: distinct nodes of the job with this alertname within
    `policy.blast_radius.window`, this alert included. `channels`: configured channel names.
    """
    alert = change.alert
    key = job_key(alert.labels)
    storm = storm_state if storm_state is not None else StormState.new(alert.labels)
    if storm.job != key:
        raise ValueError(f"storm state of {storm.job} given for an alert of {key}")
    classification = classify(alert, policy, distinct_nodes_in_window=distinct_nodes_in_window)
    out = _Out(policy=policy, channels=channels)

    storm, messages = due(storm, now, policy)
    out.storm_messages(messages)
    fp, decisions = dedup.decide(fingerprint_state, change, policy, now)
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
) -> TickResult:
    """The timers: held resolutions whose hold passed, storm summaries due, storms that
    calmed down. Pass the states with `hold_until <= now` and the storm states with
    `next_due(policy) <= now` (passing more is harmless). Returns only changed states."""
    out = _Out(policy=policy, channels=channels)
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


class PolicyMetrics:
    """Counters for the policy's decisions (issue 3, part 6). One instance per registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        kwargs: dict[str, Any] = {} if registry is None else {"registry": registry}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.classified = Counter(
            "trainsentry_alerts_classified_total",
            "Alert changes classified, by priority.",
            ["priority"],
            **kwargs,
        )
        self.notices = Counter(
            "trainsentry_policy_notices_total",
            "Alert notices the policy decided to announce (before storm collapse), by kind.",
            ["notice"],
            **kwargs,
        )
        self.suppressed = Counter(
            "trainsentry_notifications_suppressed_total",
            "Alert changes not announced, by reason (repeat, stale, flapping, held, "
            "resolve-unseen, storm).",
            ["reason"],
            **kwargs,
        )
        self.storms = Counter(
            "trainsentry_storms_total",
            "Alert storms entered (per job).",
            **kwargs,
        )
        self.storm_messages = Counter(
            "trainsentry_storm_messages_total",
            "Storm messages produced, by kind.",
            ["kind"],
            **kwargs,
        )
        self.drafts = Counter(
            "trainsentry_notifications_drafted_total",
            "Notification drafts produced for the outbox, by channel and kind.",
            ["channel", "kind"],
            **kwargs,
        )
        self.unconfigured = Counter(
            "trainsentry_route_unconfigured_total",
            "Notifications routed to a channel this gateway has no notifier for.",
            ["channel"],
            **kwargs,
        )

    def _child(self, counter: Counter, *values: str) -> Any:
        # prometheus_client's labels() costs more than the policy's own work per alert
        key = (id(counter), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*values)
        return child

    def observe(self, result: DecideResult | TickResult) -> None:
        child = self._child
        if isinstance(result, DecideResult):
            child(self.classified, result.classification.priority.value).inc()
        for decision in result.decisions:
            if decision.notice is not None:
                child(self.notices, decision.notice.value).inc()
            elif decision.suppressed is not None:
                child(self.suppressed, decision.suppressed.value).inc()
        if result.collapsed:
            child(self.suppressed, "storm").inc(result.collapsed)
        for message in result.storm_messages:
            child(self.storm_messages, message.kind.value).inc()
            if message.kind is StormMessageKind.STARTED:
                self.storms.inc()
        for draft in result.drafts:
            child(self.drafts, draft.channel, draft.kind).inc()
        for channel in result.unconfigured:
            child(self.unconfigured, channel).inc()
