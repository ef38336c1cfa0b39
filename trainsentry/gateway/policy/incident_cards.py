"""What an incident's cards say, and when each channel is told (pure).

`incident_payload` is the payload a channel renders: the cause alert's fields (as one
alert's notice had them) with the incident's priority, status and title word, and the
`incident` block (how many alerts, nodes and GPUs, named and clipped, the console link).
`incident_drafts` decides per channel: the card, a redraw in place (channels that update a
card), a new card on a change of state or priority, at most one follow-up per
`grouping.follow_up_interval` otherwise, and the one page.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import NotificationDraft
from trainsentry.gateway.policy.incident import FIRING, RESOLVED, IncidentState, Router
from trainsentry.gateway.policy.payload_build import (
    alert_from_json,
    idempotency_key,
    status_name,
)
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.story import culprits, story_line


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def headline(state: IncidentState, notice: str, detail: Mapping[str, Any]) -> None:
    """The title word: a lone alert's own notice (its twin copies and its firing again
    after an unknown resolution are that alert); else firing while any alert fires."""
    if state.total - state.copies <= 1:
        state.headline = notice
        state.detail = dict(detail)
    else:
        state.headline = FIRING if state.status == FIRING else RESOLVED
        state.detail = {}


def _mounts(state: IncidentState, shown: int) -> dict[str, Any]:
    """Pure: the kinds of alert (alertnames) an incident holds when more than one, and the
    mountpoints its alerts name, each counted and the first named (no field otherwise)."""
    found: dict[str, Any] = {}
    if len(state.names) > 1:  # the kinds of alert in it, when more than one
        names = sorted(state.names, key=lambda n: (-state.names[n], n))
        found.update(alertnames=len(state.names), alertname_names=names[:shown])
    if state.mounts:
        mounts = sorted(state.mounts, key=lambda m: (-state.mounts[m], m))
        found.update(mountpoints=len(state.mounts), mountpoint_names=mounts[:shown])
    return found


def _ports(state: IncidentState, shown: int) -> dict[str, Any]:
    """Pure: the HCA ports an incident's alerts fire on, counted and the first named (no
    field when there are none, so a card without ports is as it was)."""
    if not state.ports:
        return {}
    ports = sorted(state.ports, key=lambda p: (-state.ports[p], p))
    return {"ports": len(state.ports), "port_names": ports[:shown]}


def incident_block(state: IncidentState, policy: Policy) -> dict[str, Any]:
    """Pure: the `incident` field of a card's payload (`IncidentInfo` in
    notifiers/payload_contract.py)."""
    shown = policy.grouping.names_shown
    nodes = sorted(state.nodes, key=lambda n: (-state.nodes[n], n))
    gpus = sorted(state.gpus, key=lambda g: (-state.gpus[g], g))
    alerts = max(1, state.total - state.copies) if state.total else 0  # twins are one alert
    firing = min(state.firing, alerts)
    block: dict[str, Any] = {
        "id": state.id,
        "status": state.status,
        "alerts": alerts,
        "firing": firing,
        "resolved": alerts - firing,
        "nodes": len(state.nodes),
        "node_names": nodes[:shown],
        "gpus": len(state.gpus),
        "gpu_names": gpus[:shown],
        **_ports(state, shown),
        **_mounts(state, shown),
        "untracked": state.untracked,
        "cause": state.cause.split("/", 1)[0],
        "opened_at": state.opened_at.isoformat(),
    }
    if state.resolved_at is not None and state.status == RESOLVED:
        block["resolved_at"] = state.resolved_at.isoformat()
    if state.storm_note:
        block["note"] = state.storm_note
    if state.spent:  # resolved though jobs' alerts of it fired on (incident.py `_retire`)
        block["spent"] = state.spent
    if line := story_line(state.domain, state.story):
        block["story"] = line
    if gone := culprits(state.story):
        block["culprits"] = gone
    if state.jobs:
        block["jobs"] = state.jobs[:shown]
    if state.unknown:
        block["unknown"] = unknown_text(state)
    if policy.grouping.url:
        block["url"] = policy.grouping.url.format(
            incident=state.id, alert_id=state.lead_alert_id or ""
        )
    return block


def unknown_text(state: IncidentState) -> str:
    """Pure: the alerts whose resolution is not believed yet, and why (their node's reporting
    targets down, or the node not proven alive yet)."""
    parts = []
    for entry in list(state.unknown.values())[:5]:
        alert = alert_from_json(entry["alert"])
        gpu = alert.labels.get("gpu", "")
        what = f"{alert.name} ({entry['node']}{f' GPU {gpu}' if gpu else ''})"
        down = sorted(set(state.blind.get(entry["node"], {}).values()))
        verb = "fires" if len(down) == 1 else "fire"
        why = f"while {', '.join(down)} {verb}" if down else "until its node proves alive"
        parts.append(f"{what}: resolved? unknown {why}")
    more = len(state.unknown) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def incident_payload(state: IncidentState, policy: Policy, route_id: str) -> dict[str, Any]:
    """Pure: what a channel renders for an incident: its cause alert's fields (as one alert's
    notice has them), the incident's priority, status and title word, and `incident`."""
    alert = alert_from_json(state.lead["alert"]) if state.lead.get("alert") else None
    classification = state.classification
    resolved = state.status == RESOLVED
    body: dict[str, Any] = {
        "priority": state.priority.value,
        "status": status_name(resolved),
        "event": state.headline,
        "reason": str(classification.get("reason", "")),
        "rule_id": str(classification.get("rule_id", "")),
        "rule_ids": list(classification.get("rule_ids") or ()),
        "route": route_id,
        "at": (state.updated_at or state.opened_at).isoformat(),
        "incident": incident_block(state, policy),
    }
    if state.jobs:  # a TrainingJob, never a cluster-wide alert's scrape job ("dcgm-exporter")
        body["job"] = state.job
    if alert is not None:
        body.update(
            fingerprint=alert.fingerprint,
            alertname=alert.name,
            labels=dict(alert.labels),
            annotations=dict(alert.annotations),
            starts_at=alert.starts_at.isoformat(),
            ends_at=_iso(alert.ends_at) if resolved else None,
            generator_url=alert.generator_url,
            node=alert.node,  # as the store resolved it (the policy's node_labels)
        )
    if state.lead_alert_id is not None:
        body["alert_id"] = state.lead_alert_id
    if state.lead.get("topology"):
        body["topology"] = dict(state.lead["topology"])  # the cause alert's node's place
    body.update(state.detail)
    if state.acked_by:
        body["acked_by"] = state.acked_by
    return body


def _what_now(
    state: IncidentState,
    channel: str,
    told: Mapping[str, Any] | None,
    updatable: Collection[str],
    now: datetime,
    interval: timedelta,
) -> str | datetime:
    """Pure: "card", "redraw", "" (nothing owed) or when a follow-up becomes due."""
    if told is None:
        return "card"
    if channel in updatable:
        return "redraw" if state.version > int(told["v"]) else ""
    if told["mark"] != state.mark:
        return "card"
    if state.version > int(told["v"]) and state.status == FIRING:
        due = datetime.fromisoformat(told["at"]) + interval
        return "follow-up" if now >= due else due
    return ""


def incident_drafts(
    state: IncidentState,
    policy: Policy,
    now: datetime,
    *,
    route: Router,
    updatable: Collection[str],
    paging_channels: Collection[str],
    kind: str,
) -> list[NotificationDraft]:
    """Pure apart from `state` (its `told`, `due_at` and page flags move on): the drafts an
    announced incident owes its channels now.

    - A channel that was never told gets the card.
    - A channel in `updatable` (the Feishu app) gets a redraw of its card (`redraw: true`;
      the channel finds the card by the incident's group) whenever the incident changed.
    - Any other channel gets a new card when the incident's state, priority or title word
      changed (`mark`), else at most one follow-up per `follow_up_interval` while it fires;
      a follow-up not due yet sets `due_at` (the ticker comes back for it).
    - A paging channel gets the page when one is due (a fresh firing made it P0), once.
    """
    drafts: list[NotificationDraft] = []
    # Whose drafts these are: a hang alert's being diagnosed, when one caused them (they
    # wait for its verdict, never for another alert's hold), else the lead's.
    owner = state.trigger_alert_id or state.lead_alert_id
    if state.announced and not state.folded:
        channels, route_id, extra = route(state.priority, state.lead_labels, state.page_due)
        body: dict[str, Any] | None = None  # built for the first channel owed a draft
        interval = timedelta(seconds=policy.grouping.follow_up_interval)
        due: list[datetime] = []
        for channel in channels:
            trigger = state.trigger or f"v{state.version}"
            what: str | datetime = "page"
            if channel in paging_channels:
                if not state.page_due:
                    continue
                state.paged, state.page_alert_id = True, owner
                trigger = f"page:{trigger}"
            else:
                what = _what_now(state, channel, state.told.get(channel), updatable, now, interval)
                if isinstance(what, datetime):
                    due.append(what)
                    continue
                if not what:
                    continue
                if what == "follow-up":
                    trigger = f"follow-up:{state.version}"
                state.told[channel] = {
                    "v": state.version,
                    "at": now.isoformat(),
                    "mark": state.mark,
                }
            if body is None:
                body = {**incident_payload(state, policy, route_id), **extra}
            drafts.append(
                NotificationDraft(
                    channel=channel,
                    kind=kind,
                    priority=state.priority,
                    idempotency_key=idempotency_key("incident", state.uid, trigger, channel),
                    payload=dict(body, redraw=True) if what == "redraw" else dict(body),
                    alert_id=state.page_alert_id if channel in paging_channels else owner,
                    group_key=f"incident:{state.id}",
                    reason=f"{body.get('rule_id', '')}: {body.get('reason', '')}",
                )
            )
        state.due_at = min(due) if due else None
    state.dirty = state.page_due = False
    state.trigger = ""
    state.trigger_alert_id = None
    return drafts
