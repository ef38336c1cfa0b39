"""Pure: the console's views (model.py) from store rows (store/console.py). No I/O; the time
is passed in. Labels and annotations stay plain strings here; the templates escape them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from trainsentry.gateway.absent import EscalationOff
from trainsentry.gateway.access import VIA_TEXT
from trainsentry.gateway.policy.escalation import Escalator
from trainsentry.gateway.ui.model import (
    PRIORITIES,
    AlertView,
    Card,
    Delivery,
    Diagnosis,
    Filters,
    Hardware,
    JobGroup,
    JobView,
    Link,
    Muted,
    NowView,
    OnCall,
    OnShift,
    RankCell,
    Storm,
    TimelineEntry,
    Window,
)
from trainsentry.labels import GPU_ID_LABELS, first_label
from trainsentry.notifiers.links import safe_url  # one rule for cards and the console
from trainsentry.store.console import AlertDetail, AlertRow, OpenCounts

MAX_FILTER = 200
MAX_GRID = 4096  # ranks drawn one cell each; a larger job shows its culprits only
MAX_CHOICES = 200


class BadQuery(ValueError):
    """A query parameter the console refuses (a 400 naming it)."""


def text_param(raw: str | None, name: str) -> str:
    """Pure: a free-text parameter: at most MAX_FILTER printable characters."""
    value = (raw or "").strip()
    if len(value) > MAX_FILTER:
        raise BadQuery(f"{name} is longer than {MAX_FILTER} characters")
    if value and not value.isprintable():
        raise BadQuery(f"{name} holds characters that are not printable")
    return value


def parse_filters(query: Mapping[str, str]) -> Filters:
    """Pure: the Now page's filters from the query string (400 on a bad one)."""
    priority = (query.get("priority") or "").strip()
    if priority and priority not in PRIORITIES:
        raise BadQuery(f"priority must be one of {', '.join(PRIORITIES)}")
    return Filters(
        priority=priority,
        namespace=text_param(query.get("namespace"), "namespace"),
        job=text_param(query.get("job"), "job"),
        component=text_param(query.get("component"), "component"),
    )


def age(since: datetime, now: datetime) -> str:
    """Pure: "42 s", "5 min", "3 h 10 min", "2 d 4 h"."""
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours = minutes // 60
    if hours < 48:
        return f"{hours} h {minutes % 60} min" if minutes % 60 else f"{hours} h"
    return f"{hours // 24} d {hours % 24} h"


def card(row: AlertRow, now: datetime) -> Card:
    labels = row.labels
    return Card(
        id=row.id,
        alertname=row.alertname or labels.get("alertname", ""),
        priority=_priority(row),
        summary=row.annotations.get("summary", "") or row.annotations.get("description", ""),
        started=row.starts_at,
        age=age(row.starts_at, now),
        acked_by=row.acked_by if row.acked_at is not None else None,
        node=row.node,
        gpu=first_label(labels, GPU_ID_LABELS),
        component=labels.get("component", ""),
        namespace=row.namespace,
        job=row.job,
        resolved=row.resolved_at,
    )


def _priority(row: AlertRow) -> str:
    for value in (row.priority, row.labels.get("priority")):
        if value in PRIORITIES:
            return str(value)
    return "P3"


def _order(c: Card) -> tuple[int, float]:
    return PRIORITIES.index(c.priority), -c.started.timestamp()


def now_view(
    rows: Sequence[AlertRow],
    storms: Mapping[str, Any],
    filters: Filters,
    now: datetime,
    *,
    truncated: bool,
    mutes: Mapping[int, Mapping[str, Any]] | None = None,
    counts: OpenCounts | None = None,
) -> NowView:
    """Pure: the open alerts grouped by job (most urgent group first; in a group, most urgent
    then newest first), the component filter applied, and the storms of the jobs. `rows` may
    be the most urgent of more: `counts` then gives the totals, each job's open and unacked
    alerts, and the filter choices, so the page says how many it does not draw."""
    choices: dict[str, set[str]] = {"namespace": set(), "job": set(), "component": set()}
    grouped: dict[tuple[str, str], list[Card]] = {}
    for row in rows:
        c = card(row, now)
        mute = (mutes or {}).get(row.id)
        if mute and mute.get("state") == "muted":
            c = replace(c, muted_by=str(mute.get("reason") or mute.get("window_id") or ""))
        choices["namespace"].add(c.namespace)
        choices["job"].add(c.job)
        choices["component"].add(c.component)
        if filters.component and c.component != filters.component:
            continue
        grouped.setdefault((c.namespace, c.job), []).append(c)
    groups = []
    for (namespace, job), cards in grouped.items():
        cards.sort(key=_order)
        drawn = len(cards), sum(1 for c in cards if c.acked_by is None)
        total, unacked = counts.by_job.get((namespace, job), drawn) if counts else drawn
        groups.append(
            JobGroup(
                namespace=namespace,
                job=job,
                cards=cards,
                counts=dict(Counter(c.priority for c in cards)),
                storm=_storm(storms, namespace, job),
                unacked=unacked,
                total=max(total, len(cards)),
            )
        )
    groups.sort(key=lambda g: (PRIORITIES.index(g.top), not g.job, -g.total, g.title))
    shown = sum(len(g.cards) for g in groups)
    by_priority = Counter(c.priority for g in groups for c in g.cards)
    if counts is not None:
        by_priority = Counter({p: n for p, n in counts.by_priority.items() if n})
        choices = {k: set(v) for k, v in counts.choices.items()}
    total_open = max(sum(by_priority.values()), shown)
    return NowView(
        groups=groups,
        total=total_open,
        counts=dict(by_priority),
        filters=filters,
        truncated=truncated or total_open > shown,
        choices={k: sorted(v - {""})[:MAX_CHOICES] for k, v in choices.items()},
        shown=shown,
    )


def _storm(storms: Mapping[str, Any], namespace: str, job: str) -> Storm | None:
    """The job's storm when it is active: the policy keys storms by `job_key`
    (gateway/policy/storm.py); alerts without a training job show the cluster's storm."""
    key = f"trainingjob:{namespace}/{job}" if job else "cluster"
    state = storms.get(key)
    if isinstance(state, dict) and state.get("active"):
        tally = state.get("tally") or {}
        total = tally.get("total", 0) if isinstance(tally, dict) else 0
        return Storm(since=str(state.get("episode") or ""), total=int(total or 0))
    return None


def on_call(escalator: Escalator | EscalationOff, now: datetime) -> OnCall | None:
    """Pure: who the phone escalation would call now, layer by layer (None: the gateway has
    no escalation configured, so it does not know who is on call)."""
    if isinstance(escalator, EscalationOff):
        return None
    layers = [
        (layer.name, [person.name for person in layer.on_call(now)])
        for layer in escalator.roster.layers
    ]
    return OnCall(layers=layers, source="the phone escalation's roster")


def schedules_on_call(answers: Iterable[Mapping[str, Any]]) -> OnCall:
    """Pure: who is on call on each schedule, from `OncallService.who` (the shape of
    `GET /api/v1/oncall`: stored overrides and swaps included), primary first."""
    schedules = [
        (
            str(answer.get("schedule", "")),
            [
                OnShift(str(p.get("name", "")), str(p.get("layer", "")), _when(p.get("until")))
                for p in answer.get("on_call") or ()
            ],
        )
        for answer in answers
    ]
    return OnCall(layers=[], source="the on-call schedules", schedules=schedules)


def _matchers(raw: Any) -> str:
    if not isinstance(raw, Mapping):
        return ""
    parts = []
    for name, value in sorted(raw.items()):
        if isinstance(value, Mapping) and "regex" in value:
            parts.append(f"{name}~{value['regex']}")
        else:
            parts.append(f"{name}={value}")
    return ", ".join(parts)


def windows(found: Iterable[Mapping[str, Any]]) -> list[Window]:
    """Pure: the maintenance windows not over yet (`MaintenanceService.windows()`, the
    API's shape), the active ones first."""
    drawn = [
        Window(
            id=str(w.get("id", "")),
            reason=str(w.get("reason") or ""),
            matchers=_matchers(w.get("matchers")),
            created_by=str(w.get("created_by") or ""),
            active=bool(w.get("active")),
            until=_when((w.get("current") or {}).get("end") or w.get("ends_at")),
        )
        for w in found
    ]
    return sorted(drawn, key=lambda w: not w.active)


def muted(mute: Mapping[str, Any] | None) -> Muted | None:
    """Pure: the window that muted an alert (`store.maintenance_windows.mutes_of`), if any."""
    if not mute:
        return None
    return Muted(
        window_id=str(mute.get("window_id") or ""),
        reason=str(mute.get("reason") or ""),
        state=str(mute.get("state") or ""),
        until=_when(mute.get("until")),
    )


def event_text(kind: str, detail: Any) -> str:
    """Pure: an event's line in a timeline; who acted is named with how they signed in
    (`via`, gateway/access.py) when the event keeps it."""
    if not isinstance(detail, dict):
        return ""
    if kind in ("acked", "comment"):
        comment = detail.get("comment")
        joined = " (it joined the acknowledged incident)" if detail.get("joined") else ""
        via = VIA_TEXT.get(str(detail.get("via")))
        who = str(detail.get("by", ""))
        if via and not who.endswith(f"({via})"):
            who += f" ({via})"
        return f"by {who}{joined}" + (f": {comment}" if comment else "")
    if kind == "silenced":
        minutes = round(float(detail.get("seconds") or 0) / 60)
        return f"by {detail.get('by', '')} for {minutes} min (silence {detail.get('silence_id')})"
    parts = [f"{k}={v}" for k, v in sorted(detail.items()) if not isinstance(v, dict | list)]
    return ", ".join(parts)[:300]


def delivery(note: Mapping[str, Any]) -> Delivery:
    payload = note.get("payload") or {}
    person = payload.get("person") if isinstance(payload, dict) else None
    to = ""
    if isinstance(person, dict):
        to = str(person.get("name") or "")
    return Delivery(
        channel=str(note["channel"]),
        kind=str(note["kind"]),
        status=str(note["status"]),
        created=note["created_at"],
        sent=note.get("sent_at"),
        attempts=int(note.get("attempts") or 0),
        to=to,
        error=str(note.get("last_error") or ""),
        reason=str(note.get("reason") or ""),
    )


def _links(detail: AlertDetail) -> list[Link]:
    annotations = detail.alert.annotations
    found = [
        ("Runbook", annotations.get("runbook_url")),
        ("Grafana", annotations.get("grafana_url") or annotations.get("dashboard_url")),
        ("Prometheus", detail.generator_url),
    ]
    return [Link(text, url) for text, raw in found if (url := safe_url(raw))]


def _when(raw: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(raw)) if raw else None
    except ValueError:
        return None


def policy_entries(state: Mapping[str, Any] | None, alert: AlertRow) -> list[TimelineEntry]:
    """Pure: what the policy did with the occurrence, from its fingerprint's state
    (gateway/policy/dedup.py `FingerprintState`), when that state is about this occurrence:
    it flapped (its notices folded into one with the count) or went into a storm summary."""
    if not state or _when(state.get("occurrence")) != alert.starts_at:
        return []
    found = []
    transitions = [t for t in map(_when, state.get("transitions") or []) if t is not None]
    if state.get("flapping") and transitions:
        found.append(TimelineEntry(
            transitions[-1], "flapping",
            f"{len(transitions)} status changes in the flap window: one notice with the count; "
            "its resolution is announced after a quiet spell",
        ))  # fmt: skip
    changed = _when(state.get("changed_at"))
    if state.get("collapsed") and changed is not None:
        found.append(TimelineEntry(
            changed, "storm", "folded into its job's storm summary (no card of its own)"
        ))  # fmt: skip
    return found


def alert_view(
    detail: AlertDetail,
    now: datetime,
    policy_state: Mapping[str, Any] | None = None,
    mute: Mapping[str, Any] | None = None,
) -> AlertView:
    alert = detail.alert
    events = [
        TimelineEntry(e["at"], str(e["kind"]), event_text(str(e["kind"]), e.get("detail")))
        for e in detail.events
    ]
    return AlertView(
        card=card(alert, now),
        status=alert.status,
        labels=sorted(alert.labels.items()),
        annotations=sorted(alert.annotations.items()),
        timeline=sorted(events + policy_entries(policy_state, alert), key=lambda entry: entry.at),
        deliveries=[delivery(n) for n in detail.notifications],
        links=_links(detail),
        priority_reason=detail.priority_reason,
        diagnosis=diagnosis(detail.verdict) if detail.verdict else None,
        acked_at=alert.acked_at,
        muted=muted(mute),
    )


def _ints(values: Iterable[Any]) -> list[int]:
    out = []
    for value in values or ():
        try:
            out.append(int(value))
        except (TypeError, ValueError):
            continue
    return out


def diagnosis(verdict: Mapping[str, Any]) -> Diagnosis:
    """Pure: the hang diagnosis drawn: one cell per rank (culprits, ranks without a dump,
    ranks that never started the collective, slow ranks, the ranks that arrived), from the
    verdict the gateway stored (stages/hang_enrichment.HangVerdict.to_dict)."""
    report = verdict.get("report") or {}
    hang = report.get("hang") or {}
    culprits = _ints(verdict.get("culprit_ranks") or [])
    slow = [s for s in report.get("slow_ranks") or [] if isinstance(s, dict)]
    states: dict[int, tuple[str, str]] = {}
    for rank in _ints(hang.get("arrived_ranks") or []):
        states[rank] = ("arrived", "entered the collective and waits")
    for s in slow:
        lag = s.get("lag_ms") or 0
        states[int(s.get("rank", -1))] = ("slow", f"persistently last (lag {float(lag):.0f} ms)")
    for rank in _ints(report.get("not_started_ranks") or []):
        states[rank] = ("notstarted", "enqueued the collective, never started it")
    for rank in _ints(hang.get("ranks_without_dump") or []):
        states[rank] = ("nodump", "did not answer for a dump")
    for rank in _ints(hang.get("missing_ranks") or []):
        states[rank] = ("culprit", "never entered the collective")
    for rank in culprits:  # a slow verdict's culprits stay drawn as slow
        state, note = states.get(rank, ("", "blamed by the analyzer"))
        if state != "slow":
            states[rank] = ("culprit", note)
    total = int(report.get("ranks") or 0) or (max(states) + 1 if states else 0)
    shown = min(total, MAX_GRID)
    # a hang names the stuck group's members; other verdicts looked at every rank
    default = ("unknown", "no record of this rank") if hang else ("ok", "nothing wrong seen")
    cells = [RankCell(r, *states.get(r, default)) for r in range(shown)]
    op = str(hang.get("op") or "").split(" ")[0]
    seq = hang.get("seq")
    waited = hang.get("waited_s")
    return Diagnosis(
        verdict=str(verdict.get("verdict") or "unknown"),
        summary=str(verdict.get("summary") or ""),
        culprits=culprits,
        cells=cells,
        ranks=total,
        grid_truncated=total > shown,
        collective=f"{op} #{seq}" if op and seq is not None else op,
        group=str(hang.get("description") or hang.get("communicator") or ""),
        waited_s=float(waited) if isinstance(waited, int | float) else None,
        failed=[str(f) for f in verdict.get("ranks_failed") or []][:50],
        slow=slow[:20],
    )


def hardware(rows: Sequence[AlertRow], top: int = 10) -> list[Hardware]:
    """Pure: the nodes, GPUs and IB ports the job's alerts named most, `top` of each."""
    nodes: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    ports: Counter[str] = Counter()
    for row in rows:
        labels = row.labels
        node = row.node
        if node:
            nodes[node] += 1
        gpu = first_label(labels, GPU_ID_LABELS)
        if gpu:
            gpus[f"{node} GPU {gpu}" if node else f"GPU {gpu}"] += 1
        if labels.get("port") and (labels.get("component") == "fabric" or labels.get("device")):
            ports[" ".join(p for p in (node, labels.get("device", ""), "port") if p)
                  + f" {labels['port']}"] += 1  # fmt: skip
    found = [
        Hardware(kind, name, count)
        for kind, counter in (("node", nodes), ("GPU", gpus), ("IB port", ports))
        for name, count in counter.most_common(top)
    ]
    return found


def job_view(
    namespace: str, job: str, rows: Sequence[AlertRow], now: datetime, days: int
) -> JobView:
    return JobView(
        namespace=namespace,
        job=job,
        cards=[card(row, now) for row in rows],
        hardware=hardware(rows),
        by_alertname=Counter(row.alertname for row in rows).most_common(15),
        days=days,
    )
