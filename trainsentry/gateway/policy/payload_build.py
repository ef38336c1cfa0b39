"""What the policy writes into a notification: payload builders and idempotency keys.

Pure: an alert as its incident keeps it (`alert_to_json`), a storm message's payload, the
words and keys both use; an incident's card is drafted by incident_cards.py from its cause's
fields (the contract channels read is notifiers/payload_contract.py). Idempotency keys depend
only on what is announced and the channel, so replaying a change or a late tick yields the
same keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any, cast

from trainsentry.alerts import Alert, AlertStatus
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
        "node": alert.node,
    }


def alert_from_json(data: Mapping[str, Any]) -> Alert:
    """The alert `alert_to_json` wrote, its node as resolved then (states written before the
    node was kept: the default labels')."""
    return Alert(
        fingerprint=data["fingerprint"],
        status=AlertStatus(data["status"]),
        labels=dict(data["labels"]),
        annotations=dict(data["annotations"]),
        starts_at=datetime.fromisoformat(data["starts_at"]),
        ends_at=None if data.get("ends_at") is None else datetime.fromisoformat(data["ends_at"]),
        generator_url=data.get("generator_url", ""),
        resolved_node=data.get("node"),
    )


def status_name(resolved: bool) -> StatusName:
    """Pure: the payload's `status` (the values of `AlertStatus`)."""
    return "resolved" if resolved else "firing"


def storm_summary(summary: Mapping[str, Any]) -> StormSummary:
    """Pure: a storm summary as the payload carries it. `storm.render_summary` builds it (a
    plain dict, so its extra keys pass); the channels' contract tests check its shape."""
    return cast(StormSummary, dict(summary))


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
