"""Pure: the console's incidents (model.py) from store rows (store/console_incidents.py): the
Now page's alerts grouped into their incidents, and one incident's page. No I/O; the time is
passed in. Labels and annotations stay plain strings here; the templates escape them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from trainsentry.gateway.ui.model import (
    PRIORITIES,
    AlertView,
    Card,
    IncidentGroup,
    IncidentPage,
    NowView,
    TimelineEntry,
)
from trainsentry.gateway.ui.views import age, card, delivery, event_text
from trainsentry.store.console import AlertRow
from trainsentry.store.console_incidents import IncidentSummary


def _rank(priority: str) -> int:
    return PRIORITIES.index(priority) if priority in PRIORITIES else len(PRIORITIES)


def incident_groups(
    cards: Sequence[Card],
    members: Mapping[int, int],
    incidents: Mapping[int, IncidentSummary],
    now: datetime,
) -> tuple[list[IncidentGroup], list[Card]]:
    """Pure: a job's drawn cards (in their order) put into their incidents (`members`:
    alert id -> incident id), the most urgent incident first, then the newest; and the
    cards in no incident known (the policy has not placed them yet, or they were stored
    before incidents)."""
    inside: dict[int, list[Card]] = {}
    loose: list[Card] = []
    for c in cards:
        found = members.get(c.id)
        if found is not None and found in incidents:
            inside.setdefault(found, []).append(c)
        else:
            loose.append(c)
    groups = []
    for incident_id, drawn in inside.items():
        summary = incidents[incident_id]
        groups.append(
            IncidentGroup(
                id=incident_id,
                title=summary.alertname,
                priority=summary.priority,
                firing=max(summary.alerts_firing, len(drawn)),
                total=max(summary.alerts_total, len(drawn)),
                nodes=summary.nodes,
                acked_by=summary.acked_by if summary.acked_at is not None else None,
                started=summary.opened_at,
                age=age(summary.opened_at, now),
                cards=drawn,
                note=summary.note,
            )
        )
    groups.sort(key=lambda g: (_rank(g.priority), -g.started.timestamp(), g.id))
    return groups, loose


def _entry(event: Mapping[str, Any]) -> TimelineEntry:
    kind = str(event["kind"])
    where = f" on {event['node']}" if event.get("node") else ""
    about = f"{event.get('alertname') or ''}{where} (alert {event['alert_id']})"
    text = event_text(kind, event.get("detail"))
    return TimelineEntry(event["at"], kind, f"{about}: {text}" if text else about)


def incident_page(
    summary: IncidentSummary,
    rows: Sequence[AlertRow],
    events: Sequence[Mapping[str, Any]],
    notes: Sequence[Mapping[str, Any]],
    now: datetime,
    cause_view: AlertView | None = None,
) -> IncidentPage:
    """Pure: one incident's page: `rows` its alerts as drawn (firing first), `events` its
    alerts' events (oldest first, each with its alert's id, name and node), `notes` the
    notifications and calls made for its alerts; `cause_view` its cause alert in full."""
    return IncidentPage(
        id=summary.id,
        title=summary.alertname,
        cause=summary.cause,
        priority=summary.priority,
        status=summary.status,
        job=summary.job,
        started=summary.opened_at,
        age=age(summary.opened_at, now),
        resolved=summary.resolved_at,
        acked_by=summary.acked_by if summary.acked_at is not None else None,
        acked_at=summary.acked_at,
        firing=summary.alerts_firing,
        total=max(summary.alerts_total, len(rows)),
        nodes=summary.nodes,
        gpus=summary.gpus,
        note=summary.note,
        alerts=[card(row, now) for row in rows],
        timeline=[_entry(e) for e in events],
        deliveries=[delivery(n) for n in notes],
        cause_view=cause_view,
        escalate_alert=summary.page_alert_id or summary.cause_alert_id,
    )


def with_incidents(
    view: NowView,
    members: Mapping[int, int],
    incidents: Mapping[int, IncidentSummary],
    now: datetime,
) -> NowView:
    """Pure: the Now page's job groups with their drawn cards put into their incidents."""
    groups = []
    for group in view.groups:
        inside, loose = incident_groups(group.cards, members, incidents, now)
        groups.append(replace(group, incidents=inside, loose=loose))
    return replace(view, groups=groups)
