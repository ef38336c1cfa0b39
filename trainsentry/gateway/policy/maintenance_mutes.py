"""Maintenance windows in the alert policy: which drafts a window mutes, what is owed when it
ends, and the "ends soon" notice. Pure: the windows, the time and the stored mutes are
parameters (stages/services/maintenance.py loads and writes them).

Rules (docs/oncall.md, "Maintenance windows"):
- a chat or phone notice about an alert (kind "alert", an alert id, a channel other than the
  archives) is muted when the alert already has an open mute, or when it is a firing notice
  and a window active at `now` matches the alert's labels; the notices muted first are kept
  with the mute, to be written if the alert still fires when the window ends;
- a resolve of a muted alert closes its mute and is itself muted: nothing was announced, so
  nothing is owed; so is a resolve arriving after the mute closed as resolved (a resolution
  the flap hold kept back); a resolve of an alert announced before the window went on, or
  notified at the window's end, is not muted;
- when a mute's stretch ends: an alert no longer firing owes nothing; one another window
  (or the window's next stretch) mutes now stays muted, under that window; else its held
  notices are written now, saying which window held them;
- storm summaries (no alert id) and archive rows are never muted;
- windows match the alert's labels merged over its place in the topology (the payload's
  `topology`, issue 23's levels such as `rack` or `leaf_switch`): `--match rack=r7` mutes the
  alerts of r7's nodes though they carry no `rack` label; where the alert has a label of the
  same name, the alert's label wins.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import NotificationDraft, Priority, parse_priority
from trainsentry.gateway.policy.payload_build import ALERT_KIND, idempotency_key
from trainsentry.gateway.policy.route import route
from trainsentry.gateway.policy.rules import Policy
from trainsentry.maintenance.match import active_span, labels_match
from trainsentry.maintenance.types import MaintenanceWindow

MAINTENANCE_EVENT = "maintenance_ending"  # payload `event` of the "ends soon" notice
MUTED, RESOLVED = "muted", "resolved"  # the states of a stored mute (store/maintenance_windows.py)


@dataclass(frozen=True)
class NewMute:
    window_id: str
    until: datetime | None  # the end of the window's stretch covering the mute's start
    drafts: tuple[NotificationDraft, ...]


@dataclass
class Muting:
    kept: list[NotificationDraft] = field(default_factory=list)
    new: dict[int, NewMute] = field(default_factory=dict)  # alert id -> its new mute
    resolved: set[int] = field(default_factory=set)  # open mutes whose alert resolved
    muted: int = 0  # drafts held back


def _active(
    windows: Sequence[MaintenanceWindow], now: datetime
) -> list[tuple[MaintenanceWindow, datetime]]:
    """Pure: the windows active at `now`, each with the end of its stretch (worked out once
    per batch: a recurring window's occurrence search is the expensive part)."""
    found = []
    for window in windows:
        span = active_span(window, now)
        if span is not None:
            found.append((window, span[1]))
    return found


def _first_match(
    active: Sequence[tuple[MaintenanceWindow, datetime]], labels: Mapping[str, str]
) -> tuple[MaintenanceWindow, datetime] | None:
    """Pure: `maintenance.match.muted_by` over windows already known to be active."""
    for window, end in active:
        if labels_match(window, labels):
            return window, end
    return None


def _strings(found: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, Mapping) else {}


def match_labels(labels: Mapping[str, str], payload: Mapping[str, Any]) -> dict[str, str]:
    """Pure: what a window's matchers see of an alert: its place in the topology
    (`payload["topology"]`, level -> name) with the alert's `labels` over it (they win where
    both have a name)."""
    return {**_strings(payload.get("topology")), **labels}


def _labels(draft: NotificationDraft) -> dict[str, str]:
    return match_labels(_strings(draft.payload.get("labels")), draft.payload)


def mute(
    drafts: Sequence[NotificationDraft],
    *,
    windows: Sequence[MaintenanceWindow],
    mutes: Mapping[int, str],
    now: datetime,
    spare_channels: Collection[str] = (),
) -> Muting:
    """Pure: splits the drafts of one planning batch into those sent and those muted.
    `mutes`: the stored mutes of the drafts' alerts, alert id -> state
    (store/maintenance_windows.py: muted, notified, resolved)."""
    out = Muting()
    active = _active(windows, now)
    for draft in drafts:
        alert_id = draft.alert_id
        if alert_id is None or draft.kind != ALERT_KIND or draft.channel in spare_channels:
            out.kept.append(draft)
            continue
        firing = draft.payload.get("status") == "firing"
        state = mutes.get(alert_id)
        if state == MUTED:
            out.muted += 1
            if not firing:
                out.resolved.add(alert_id)
            continue
        if state == RESOLVED and not firing:
            out.muted += 1  # its firing was never announced
            continue
        if alert_id in out.new:
            out.muted += 1
            if firing:
                held = out.new[alert_id]
                out.new[alert_id] = NewMute(held.window_id, held.until, (*held.drafts, draft))
            else:
                del out.new[alert_id]  # fired and resolved in one batch: nothing owed
            continue
        match = _first_match(active, _labels(draft)) if firing else None
        if match is None:
            out.kept.append(draft)
            continue
        out.new[alert_id] = NewMute(match[0].id, match[1], (draft,))
        out.muted += 1
    return out


@dataclass
class Release:
    notify: list[NotificationDraft] = field(default_factory=list)
    notified: set[int] = field(default_factory=set)  # still firing: notices written now
    resolved: set[int] = field(default_factory=set)  # no longer firing: nothing owed
    moved: dict[int, tuple[str, datetime | None]] = field(default_factory=dict)  # re-muted


def release(
    due: Sequence[tuple[int, str, bool, Mapping[str, str], Sequence[dict[str, Any]]]],
    *,
    windows: Sequence[MaintenanceWindow],
    now: datetime,
) -> Release:
    """Pure: mutes whose stretch ended, as (alert id, window id, still firing, labels, held
    drafts as `draft_to_json` wrote them): what each owes now."""
    out = Release()
    active = _active(windows, now)
    for alert_id, window_id, firing, labels, drafts in due:
        if not firing:
            out.resolved.add(alert_id)
            continue
        place = drafts[0].get("payload", {}) if drafts else {}  # the place it had when muted
        match = _first_match(active, match_labels(labels, place))
        if match is not None:
            out.moved[alert_id] = (match[0].id, match[1])
            continue
        out.notified.add(alert_id)
        for data in drafts:
            draft = draft_from_json(data)
            note = (
                f"It was held by maintenance window {window_id} until {now.isoformat()} "
                "and still fires."
            )
            draft.payload["maintenance"] = {"window_id": window_id, "ended_at": now.isoformat()}
            shown = draft.payload.get("reason")
            draft.payload["reason"] = f"{shown} {note}" if shown else note  # cards show it
            draft.reason = f"{draft.reason} ({note})" if draft.reason else note
            out.notify.append(draft)
    return out


def draft_to_json(draft: NotificationDraft) -> dict[str, Any]:
    """Pure: a draft as stored with its mute."""
    return {
        "channel": draft.channel,
        "kind": draft.kind,
        "priority": draft.priority.value,
        "idempotency_key": draft.idempotency_key,
        "payload": draft.payload,
        "alert_id": draft.alert_id,
        "group_key": draft.group_key,
        "reason": draft.reason,
        "extra": {k: v for k, v in draft.extra.items() if isinstance(v, str | int | float)},
    }


def draft_from_json(data: Mapping[str, Any]) -> NotificationDraft:
    """Pure: the inverse of `draft_to_json`."""
    return NotificationDraft(
        channel=str(data["channel"]),
        kind=str(data["kind"]),
        priority=parse_priority(str(data["priority"])) or Priority.P3,
        idempotency_key=str(data["idempotency_key"]),
        payload=dict(data["payload"]),
        alert_id=data.get("alert_id"),
        group_key=str(data.get("group_key", "")),
        reason=str(data.get("reason", "")),
        extra=dict(data.get("extra") or {}),
    )


def ending_soon(
    windows: Sequence[MaintenanceWindow], now: datetime, within_s: float
) -> list[tuple[MaintenanceWindow, datetime]]:
    """Pure: (window, end) of each window active at `now` whose stretch ends within
    `within_s` seconds."""
    return [(w, end) for w, end in _active(windows, now) if (end - now).total_seconds() <= within_s]


def ending_notice(
    window: MaintenanceWindow,
    end: datetime,
    firing: Sequence[tuple[int, str, str | None, Mapping[str, str]]],
    *,
    policy: Policy,
    channels: Collection[str] | None,
    now: datetime,
) -> list[NotificationDraft]:
    """Pure: the "ends soon" notice of a window's stretch ending at `end`, with the alerts it
    mutes that still fire ((alert id, alertname, priority, labels)), at the priority of the
    most urgent of them, routed like them but never to a phone. Empty when none fires."""
    if not firing:
        return []
    ranked = sorted(
        ((parse_priority(p or "") or Priority.P3, labels) for _, _, p, labels in firing),
        key=lambda pair: pair[0].level,
    )
    priority, most_urgent = ranked[0]
    decision = route(priority, most_urgent, policy, configured=channels, paging=False)
    names = ", ".join(f"{name or '?'} (#{alert_id})" for alert_id, name, _, _ in firing[:20])
    more = f" and {len(firing) - 20} more" if len(firing) > 20 else ""
    summary = (
        f"Maintenance window {window.id} ({window.reason or 'no reason given'}) ends at "
        f"{end.isoformat()}; {len(firing)} alert(s) it mutes still fire and will be sent "
        f"then: {names}{more}"
    )
    matchers = {m.label: m.value for m in window.matchers if m.value is not None}
    payload: dict[str, Any] = {
        "priority": priority.value,
        "status": "firing",
        "event": MAINTENANCE_EVENT,
        "alertname": "MaintenanceWindowEnding",
        "labels": {"alertname": "MaintenanceWindowEnding", **matchers},
        "annotations": {"summary": summary},
        "reason": "Alerts this maintenance window mutes still fire as it ends.",
        "route": decision.route_id,
        "at": now.isoformat(),
        "maintenance": {  # the card of the notice (feishu/card.py maintenance_card) reads it
            "window_id": window.id,
            "window_reason": window.reason or "",
            "ends_at": end.isoformat(),
            "firing": [alert_id for alert_id, _, _, _ in firing],
            "alerts": [f"{name or '?'} (#{alert_id})" for alert_id, name, _, _ in firing[:20]],
            "more": max(0, len(firing) - 20),
        },
    }
    return [
        NotificationDraft(
            channel=channel,
            kind=ALERT_KIND,
            priority=priority,
            idempotency_key=idempotency_key(MAINTENANCE_EVENT, window.id, end.isoformat(), channel),
            payload=dict(payload),
            group_key=f"maintenance:{window.id}",
            reason=f"maintenance window {window.id} ends soon",
        )
        for channel in decision.channels
    ]
