"""What the policy writes into a notification: payload builders and idempotency keys.

Pure: an alert's decision (or a storm message) in, the JSON payload a channel renders out
(the contract channels read is notifiers/payload_contract.py). Idempotency keys depend only on what
is announced and the channel, so replaying a change or a late tick yields the same keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from trainsentry.alerts import GO_ZERO_TIME, Alert, AlertStatus
from trainsentry.gateway.policy.classify import Classification
from trainsentry.gateway.policy.dedup import Decision, Notice
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import StormMessage, StormMessageKind, job_title
from trainsentry.notifiers.payload_contract import NotificationPayload, StatusName, StormSummary

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


def _iso(value: datetime | None) -> str | None:
    if value is None or value == GO_ZERO_TIME:
        return None
    return value.isoformat()


def status_name(resolved: bool) -> StatusName:
    """Pure: the payload's `status` (the values of `AlertStatus`)."""
    return "resolved" if resolved else "firing"


def storm_summary(summary: Mapping[str, Any]) -> StormSummary:
    """Pure: a storm summary as the payload carries it. `storm.render_summary` builds it (a
    plain dict, so its extra keys pass); the channels' contract tests check its shape."""
    return cast(StormSummary, dict(summary))


def alert_payload(
    decision: Decision,
    alert: Alert,
    alert_id: int | None,
    classification: Classification,
    *,
    route_id: str = "",
) -> NotificationPayload:
    """What a channel needs to render one alert notice (see notifiers/payload_contract.py)."""
    notice = decision.notice
    # A flapping notice is not a resolution (that is held), whichever change triggered it.
    resolved = notice is Notice.RESOLVED
    payload: NotificationPayload = {
        "priority": classification.priority.value,
        "status": status_name(resolved),
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


def storm_payload(
    message: StormMessage, policy: Policy, *, route_id: str = ""
) -> NotificationPayload:
    """What a channel needs to render a storm message (see notifiers/payload_contract.py)."""
    rules = policy.storm
    summary = message.summary
    only_resolved = summary.get("total", 0) > 0 and summary.get("firing", 1) == 0
    ended = message.kind is StormMessageKind.ENDED
    job = job_title(message.job)
    reason = {
        StormMessageKind.STARTED: (
            f"alert storm: {summary.get('total', 0)} new alerts of {job} within "
            f"{rules.window:g}s (more than {rules.threshold}); one summary every "
            f"{rules.summary_interval:g}s until it calms down"
        ),
        StormMessageKind.SUMMARY: f"alert storm summary #{message.seq} for {job}",
        StormMessageKind.ENDED: f"alert storm over for {job}",
    }[message.kind]
    # the job in the words its incidents' cards use (one name for one job)
    named = {**summary, "job": job}
    return {
        "priority": message.priority.value,
        "status": status_name(ended or only_resolved),
        "event": message.kind.value,
        "labels": dict(message.labels),
        "job": job,
        "reason": reason,
        "rule_id": "storm",
        "route": route_id,
        "storm": storm_summary(named),
        "at": message.at.isoformat(),
    }
