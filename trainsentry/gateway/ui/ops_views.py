"""Pure: the views (model.py) of the console's On call, Silences and windows, Nodes and
History pages, from what the services and the store gave. No I/O; the time is passed in.
Labels, names and reasons stay plain strings here; the templates escape them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from trainsentry.gateway.policy.cordon import NodeDecision
from trainsentry.gateway.policy.health import NodeHealth
from trainsentry.gateway.policy.infra import InfraState
from trainsentry.gateway.ui.model import (
    PRIORITIES,
    HistoryIncident,
    InfraRow,
    LayerRow,
    NodeRow,
    NodesPage,
    OnCall,
    OncallPage,
    OnShift,
    OverrideRow,
    Preview,
    ScheduleView,
    SilenceRow,
)
from trainsentry.gateway.ui.views import BadQuery, age, card
from trainsentry.maintenance.match import active_span, labels_match, rule_of
from trainsentry.maintenance.types import MaintenanceWindow
from trainsentry.maintenance.windows import match_item
from trainsentry.oncall.config import FieldError, OncallConfigError, parse_timezone
from trainsentry.oncall.schedule import entries_at, layer_member_at, on_call, wall_to_instant
from trainsentry.oncall.types import Layer, Override, Schedule, Swap
from trainsentry.store.console import AlertRow
from trainsentry.store.console_incidents import IncidentSummary
from trainsentry.store.oncall_overrides import StoredChange

MAX_OVERRIDES = 200  # overrides and swaps drawn per schedule
MAX_PREVIEW = 50  # matched alerts drawn in a window's preview
MAX_NODES = 500  # nodes drawn on the Nodes page
MAX_MATCHER_LINES = 32  # as the API's window.matchers
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


# On call ---------------------------------------------------------------------------------


def _span(delta: timedelta) -> str:
    hours = int(delta.total_seconds() // 3600)
    if hours and hours % 168 == 0:
        return f"{hours // 168} w"
    if hours and hours % 24 == 0:
        return f"{hours // 24} d"
    return f"{hours} h" if hours else f"{int(delta.total_seconds() // 60)} min"


def _layer(layer: Layer, schedule: Schedule, now: datetime) -> LayerRow:
    restrict = ", ".join(str(r) for r in layer.restrict.ranges) if layer.restrict else ""
    return LayerRow(
        name=layer.name,
        members=list(layer.members),
        shift=_span(layer.shift),
        start=layer.start_wall.strftime("%Y-%m-%d %H:%M"),
        restrict=restrict,
        now=layer_member_at(layer, schedule.tz, now) or "",
    )


def _shifts(schedule: Schedule, at: datetime) -> list[OnShift]:
    return [OnShift(p.name, p.layer, p.until) for p in on_call(schedule, at)]


def _overrides(
    configured: Schedule, stored: Iterable[StoredChange], now: datetime
) -> list[OverrideRow]:
    rows = [
        OverrideRow(
            id=s.id,
            kind=s.kind,
            who=s.who,
            replaces=s.replaces or "",
            start=s.starts_at,
            end=s.ends_at,
            reason=s.reason,
            created_by=s.created_by,
            active=s.starts_at <= now,
        )
        for s in stored
        if s.ends_at > now and s.schedule == configured.name
    ]
    changes: list[Override | Swap] = [*configured.overrides, *configured.swaps]
    for change in changes:
        if change.end > now:
            rows.append(
                OverrideRow(
                    id=None,
                    kind="swap" if isinstance(change, Swap) else "override",
                    who=change.who,
                    replaces=change.replaces if isinstance(change, Swap) else "",
                    start=change.start,
                    end=change.end,
                    reason="",
                    created_by="configuration",
                    active=change.start <= now,
                )
            )
    return sorted(rows, key=lambda row: (row.start, row.id or 0))[:MAX_OVERRIDES]


def schedule_view(
    current: Schedule, configured: Schedule, stored: Iterable[StoredChange], now: datetime
) -> ScheduleView:
    """Pure: one schedule: who is on call now (`current`: the configured schedule with the
    stored overrides and swaps merged in, as GET /api/v1/oncall answers), who is next (the
    answer at the instant the primary changes), its layers (as configured) and the
    overrides and swaps not over yet (stored ones removable)."""
    shifts = _shifts(current, now)
    next_at = shifts[0].until if shifts else None
    return ScheduleView(
        name=current.name,
        timezone=str(current.tz),
        now=shifts,
        next_at=next_at,
        next=[
            OnShift(name, layer, None)
            for name, layer in (entries_at(current, next_at) if next_at is not None else ())
        ],
        layers=[_layer(layer, current, now) for layer in current.layers],
        overrides=_overrides(configured, stored, now),
    )


def oncall_page(
    current: Mapping[str, Schedule],
    configured: Mapping[str, Schedule],
    stored: Sequence[StoredChange],
    people: Iterable[str],
    now: datetime,
    roster: OnCall | None = None,
) -> OncallPage:
    """Pure: the On call page: each schedule (by name), the people an override may name."""
    return OncallPage(
        schedules=[
            schedule_view(current[name], configured[name], stored, now) for name in sorted(current)
        ],
        people=sorted(people),
        roster=roster,
    )


def override_request(form: Mapping[str, str]) -> tuple[str, dict[str, Any], str]:
    """Pure: (schedule, the request `POST /api/v1/oncall/overrides` takes, reason) from the
    console's form. The times are the form's local wall times (no offset: the schedule's
    time zone, as the API reads them); the service checks the rest."""
    schedule = (form.get("schedule") or "").strip()
    if not schedule:
        raise BadQuery("schedule is required")
    body: dict[str, Any] = {
        "kind": (form.get("kind") or "override").strip(),
        "who": (form.get("who") or "").strip() or None,
        "start": (form.get("start") or "").strip() or None,
        "end": (form.get("end") or "").strip() or None,
    }
    if body["kind"] == "swap":
        body["replaces"] = (form.get("replaces") or "").strip() or None
    return schedule, body, (form.get("reason") or "").strip()


# Silences and windows ------------------------------------------------------------------


def silences(
    events: Iterable[Mapping[str, Any]], now: datetime, states: Mapping[str, str] | None = None
) -> list[SilenceRow]:
    """Pure: the silences whose length has not run out, from the gateway's `silenced` events
    (newest first), each with the alert it was made from and its state in Alertmanager
    (`states`, as far as it answered)."""
    rows = []
    for event in events:
        detail = event.get("detail") if isinstance(event.get("detail"), dict) else {}
        assert isinstance(detail, dict)
        try:
            seconds = float(detail.get("seconds") or 0)
        except (TypeError, ValueError):
            continue
        at = event["at"]
        until = at + timedelta(seconds=seconds)
        if until <= now or not detail.get("silence_id"):
            continue
        namespace, job = event.get("job_namespace") or "", event.get("job_name") or ""
        rows.append(
            SilenceRow(
                silence_id=str(detail["silence_id"]),
                by=str(detail.get("by") or ""),
                at=at,
                until=until,
                alert_id=int(event["alert_id"]),
                alertname=str(event.get("alertname") or ""),
                node=str(event.get("node") or ""),
                job=f"{namespace}/{job}" if namespace and job else job,
                state=(states or {}).get(str(detail["silence_id"]), ""),
            )
        )
    return rows


def window_request(form: Mapping[str, str], by: str, now: datetime) -> dict[str, Any]:
    """Pure: the request `POST /api/v1/maintenance` takes, from the console's form: matchers
    one a line (`LABEL=VALUE` or `LABEL~REGEX`, as `trainsentry maintenance add --match`),
    a start (empty: now) and an end or a length in minutes, local to `timezone` (UTC when
    empty), the reason; `created_by` is the signed-in name. BadQuery names a field the form
    cannot make a request of; what is made is checked by the API's validation."""
    lines = [line.strip() for line in (form.get("matchers") or "").splitlines() if line.strip()]
    if not lines:
        raise BadQuery("matchers: one a line, LABEL=VALUE or LABEL~REGEX")
    if len(lines) > MAX_MATCHER_LINES:
        raise BadQuery(f"matchers: at most {MAX_MATCHER_LINES}")
    matchers: dict[str, Any] = {}
    for number, line in enumerate(lines, 1):
        found = match_item(line)
        if found is None:
            raise BadQuery(f"matchers: line {number}: write LABEL=VALUE or LABEL~REGEX")
        matchers[found[0]] = found[1]
    timezone = (form.get("timezone") or "").strip() or "UTC"
    start = (form.get("starts_at") or "").strip()
    if not start:
        start = now.astimezone(_zone(timezone)).replace(tzinfo=None, microsecond=0).isoformat()
    body: dict[str, Any] = {
        "matchers": matchers,
        "starts_at": start,
        "timezone": timezone,
        "reason": (form.get("reason") or "").strip(),
        "created_by": by,
    }
    end = (form.get("ends_at") or "").strip()
    minutes = (form.get("minutes") or "").strip()
    if bool(end) == bool(minutes):
        raise BadQuery("give an end or a length in minutes (one of them)")
    if end:
        body["ends_at"] = end
    else:
        if not (minutes.isascii() and minutes.isdigit() and 0 < int(minutes) <= 527040):
            raise BadQuery("minutes must be a whole number from 1 to 527040")
        try:
            begin = datetime.fromisoformat(start)
        except ValueError:
            raise BadQuery("starts_at must be a date and time (2026-11-20T09:00)") from None
        body["ends_at"] = (begin + timedelta(minutes=int(minutes))).isoformat()
    return body


def _zone(name: str) -> ZoneInfo:
    try:
        return parse_timezone(name, "timezone")
    except (FieldError, OncallConfigError) as exc:  # an unknown name: FieldError
        raise BadQuery(str(exc)) from None


def stretch(window: MaintenanceWindow, now: datetime) -> tuple[datetime, datetime] | None:
    """Pure: the window's stretch covering `now`, else its next one (None: none left)."""
    span = active_span(window, now)
    if span is not None:
        return span
    recurring = window.recurring
    if recurring is None:
        if window.starts_at is None or window.ends_at is None or window.ends_at <= now:
            return None
        return window.starts_at, window.ends_at
    wall = now.astimezone(recurring.tz).replace(tzinfo=None)
    found = rule_of(recurring).after(wall)
    if found is None:
        return None
    begin = wall_to_instant(found, recurring.tz)
    return begin, begin + recurring.duration


def matcher_text(window: MaintenanceWindow) -> str:
    """Pure: "node=gpu-node-17, alertname~GPU.*", as the API's request wrote them."""
    return ", ".join(
        f"{m.label}~{m.pattern.pattern}" if m.pattern is not None else f"{m.label}={m.value}"
        for m in window.matchers
    )


def preview(
    window: MaintenanceWindow,
    rows: Sequence[tuple[AlertRow, Mapping[str, str]]],
    open_total: int,
    now: datetime,
) -> Preview:
    """Pure: what `window` would match: its stretch now or next, and which of the open
    alerts `rows` (each with the labels a window sees: the alert's over its node's place)
    its matchers hold for."""
    matched = [row for row, labels in rows if labels_match(window, labels)]
    return Preview(
        matchers=matcher_text(window),
        active_now=active_span(window, now) is not None,
        first=stretch(window, now),
        matched=[card(row, now) for row in matched[:MAX_PREVIEW]],
        total=len(matched),
        checked=len(rows),
        open_total=open_total,
    )


# Nodes -----------------------------------------------------------------------------------


def _place(place: Mapping[str, str]) -> str:
    return ", ".join(f"{level}={name}" for level, name in place.items())


def nodes_page(
    ranked: Sequence[NodeHealth],
    places: Mapping[str, Mapping[str, str]],
    decisions: Mapping[str, NodeDecision],
    incidents_on: Mapping[str, Sequence[int]],
    summaries: Mapping[int, IncidentSummary],
    infra: Iterable[InfraState],
    *,
    half_life_s: float,
    cordon: str,
    threshold: float | None,
) -> NodesPage:
    """Pure: the Nodes page: the nodes with a cordon decision waiting (recommended) or in
    force (cordoned) first, then the sickest; each with its health, its cordon state, its
    open incidents and the open infrastructure incidents over it."""
    scored = {health.node: health for health in ranked}
    names = list(scored) + sorted(node for node in decisions if node not in scored)
    waiting = {"recommended": 0, "cordoned": 1}
    names.sort(key=lambda node: waiting.get(_status(decisions.get(node)), 2))
    open_infra = [state for state in infra if state.open]
    rows = []
    for node in names[:MAX_NODES]:
        health = scored.get(node) or NodeHealth(node)
        decision = decisions.get(node)
        rows.append(
            NodeRow(
                node=node,
                score=round(health.score, 1),
                faults=", ".join(f"{kind} {n}" for kind, n in sorted(health.faults.items())),
                gpus=", ".join(
                    f"{gpu} ({score:.1f})"
                    for gpu, score in sorted(health.gpus.items(), key=lambda kv: (-kv[1], kv[0]))
                ),
                last_fault=health.last_fault_at,
                place=_place(places.get(node) or {}),
                cordon=_status(decision),
                cordon_by=decision.by if decision else "",
                cordon_at=decision.at if decision else None,
                cordon_reason=decision.reason if decision else "",
                incidents=[
                    (i, summaries[i].priority, summaries[i].cause or summaries[i].alertname)
                    for i in incidents_on.get(node, ())
                    if i in summaries
                ],
                infra=[state.key for state in open_infra if node in state.nodes],
            )
        )
    return NodesPage(
        nodes=rows,
        total=len(names),
        infra=[
            InfraRow(
                key=state.key,
                nodes=list(state.nodes),
                peak=state.peak.value,
                since=state.episode,
                alertnames=", ".join(sorted(state.alertnames)),
            )
            for state in open_infra
        ],
        half_life_s=half_life_s,
        cordon=cordon,
        threshold=threshold,
    )


def _status(decision: NodeDecision | None) -> str:
    return decision.status.value if decision is not None else ""


# History ---------------------------------------------------------------------------------


def history(
    found: Sequence[IncidentSummary], alerts: Mapping[int, Sequence[AlertRow]], now: datetime
) -> list[HistoryIncident]:
    """Pure: History's rows: one per resolved incident, newest first, with how long it
    lasted, how long until it was acknowledged and by whom, and its first alerts."""
    rows = []
    for incident in found:
        end = incident.resolved_at or now
        to_ack = ""
        if incident.acked_at is not None:
            to_ack = age(incident.opened_at, max(incident.acked_at, incident.opened_at))
        rows.append(
            HistoryIncident(
                id=incident.id,
                title=incident.alertname or incident.cause,
                cause=incident.cause,
                priority=incident.priority if incident.priority in PRIORITIES else "P3",
                job=incident.job,
                opened=incident.opened_at,
                resolved=incident.resolved_at,
                duration=age(incident.opened_at, end),
                to_ack=to_ack,
                acked_by=incident.acked_by if incident.acked_at is not None else None,
                total=incident.alerts_total,
                nodes=incident.nodes,
                alerts=[card(row, now) for row in alerts.get(incident.id, ())],
            )
        )
    return rows
