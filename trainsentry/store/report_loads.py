"""The weekly report's loads: the rows of a period, read from the store (the only I/O of the
report's statistics; reports/stats.py computes the numbers from them, pure).

Rows are turned into plain values here (`Occurrence`, `PageRow`, `StormRow`), so the
computing side never sees a database row. A `Scope` limits every load to namespaces or jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Priority
from trainsentry.labels import node_of
from trainsentry.store.schema import alerts, notifications

_PRIORITIES: tuple[str, ...] = tuple(p.value for p in Priority)


HARDWARE_COMPONENTS = frozenset({"gpu", "fabric", "node"})


NO_JOB = "(no job)"


_IN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Scope:
    """Which alerts a report covers: everything, or the given namespaces / `ns/name` jobs."""

    name: str = "cluster"
    namespaces: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        return not self.namespaces and not self.jobs

    def covers(self, namespace: str, job: str) -> bool:
        if self.everything:
            return True
        return namespace in self.namespaces or f"{namespace}/{job}" in self.jobs


@dataclass(frozen=True, slots=True)
class Occurrence:
    id: int
    fingerprint: str
    alertname: str
    priority: str
    component: str
    namespace: str
    job: str
    labels: Mapping[str, str]
    summary: str
    starts_at: datetime
    created_at: datetime
    resolved_at: datetime | None
    acked_at: datetime | None
    acked_by: str | None
    #: The hang diagnosis' verdict ("hang", "checkpoint", "ok", ...), "" when none was made.
    verdict: str = ""
    #: When the stall began, as the probe's trigger said (its `stalled_since` annotation,
    #: kept only when it lies within a day before `starts_at`); None for other alerts.
    stalled_since: datetime | None = None
    #: The node the store resolved when it recorded the occurrence (the policy's
    #: `node_labels`, store/writes.py); None: not read from the store, the default labels.
    stored_node: str | None = None

    @property
    def job_ref(self) -> str:
        if not self.job:
            return NO_JOB
        return f"{self.namespace}/{self.job}" if self.namespace else self.job

    @property
    def node(self) -> str:
        return node_of(self.labels) if self.stored_node is None else self.stored_node

    @property
    def hardware(self) -> bool:
        return self.component in HARDWARE_COMPONENTS


@dataclass(frozen=True, slots=True)
class PageRow:
    alert_id: int | None
    status: str
    acked_at: datetime | None


@dataclass(frozen=True, slots=True)
class StormRow:
    job: str
    event: str
    at: datetime
    total: int
    priority: str


def _priority(row_priority: str | None, labels: Mapping[str, str]) -> str:
    for value in (row_priority, labels.get("priority")):
        if value in _PRIORITIES:
            return str(value)
    return Priority.P3.value  # unclassified alerts count as informational


def _occurrence(row: Any) -> Occurrence:
    labels = {str(k): str(v) for k, v in (row.labels or {}).items()}
    annotations = row.annotations or {}
    return Occurrence(
        id=int(row.id),
        fingerprint=row.fingerprint,
        alertname=row.alertname or labels.get("alertname", ""),
        priority=_priority(row.priority, labels),
        component=labels.get("component", "") or "unknown",
        namespace=row.job_namespace or "",
        job=row.job_name or "",
        labels=labels,
        summary=str(annotations.get("summary", "")),
        starts_at=row.starts_at,
        created_at=row.created_at,
        resolved_at=row.resolved_at,
        acked_at=row.acked_at,
        acked_by=row.acked_by,
        verdict=str(row.verdict.get("verdict", "")) if isinstance(row.verdict, dict) else "",
        stalled_since=_stalled_since(annotations.get("stalled_since"), row.starts_at),
        stored_node=row.node,
    )


def _stalled_since(raw: Any, starts_at: datetime) -> datetime | None:
    """The trigger's stall start if it is a time within a day before `starts_at`, else None
    (annotations are attacker-controlled: anything else is ignored, never an error)."""
    if not isinstance(raw, str) or len(raw) > 64:
        return None
    try:
        since = datetime.fromisoformat(raw)
    except ValueError:
        return None
    if since.tzinfo is None or not starts_at - timedelta(days=1) <= since <= starts_at:
        return None
    return since


def _scope_clause(scope: Scope) -> Any:
    if scope.everything:
        return None
    clauses: list[Any] = []
    if scope.namespaces:
        clauses.append(alerts.c.job_namespace.in_(sorted(scope.namespaces)))
    for ref in sorted(scope.jobs):
        namespace, _, name = ref.rpartition("/")
        clauses.append(and_(alerts.c.job_namespace == namespace, alerts.c.job_name == name))
    return or_(*clauses)


async def load_occurrences(
    conn: AsyncConnection, start: datetime, end: datetime, scope: Scope = Scope()
) -> list[Occurrence]:
    """Occurrences that started in [start, end), oldest first."""
    query = (
        select(alerts)
        .where(alerts.c.starts_at >= start, alerts.c.starts_at < end)
        .order_by(alerts.c.starts_at, alerts.c.id)
    )
    clause = _scope_clause(scope)
    if clause is not None:
        query = query.where(clause)
    return [_occurrence(row) for row in await conn.execute(query)]


async def load_history(
    conn: AsyncConnection, fingerprints: Iterable[str], start: datetime, lookback: timedelta
) -> list[Occurrence]:
    """Earlier occurrences of `fingerprints` that were still open or resolved at most
    `lookback` before `start` (what recurrence and flapping need to look back at)."""
    found: list[Occurrence] = []
    wanted = sorted(set(fingerprints))
    for i in range(0, len(wanted), _IN_CHUNK):
        query = select(alerts).where(
            alerts.c.fingerprint.in_(wanted[i : i + _IN_CHUNK]),
            alerts.c.starts_at < start,
            or_(alerts.c.resolved_at.is_(None), alerts.c.resolved_at >= start - lookback),
        )
        found.extend(_occurrence(row) for row in await conn.execute(query))
    return sorted(found, key=lambda o: (o.starts_at, o.id))


async def load_pages(
    conn: AsyncConnection,
    start: datetime,
    end: datetime,
    channels: Sequence[str],
    scope: Scope = Scope(),
) -> list[PageRow]:
    query = (
        select(notifications.c.alert_id, notifications.c.status, alerts.c.acked_at)
        .select_from(notifications.outerjoin(alerts, notifications.c.alert_id == alerts.c.id))
        .where(
            notifications.c.channel.in_(list(channels)),
            notifications.c.created_at >= start,
            notifications.c.created_at < end,
        )
    )
    clause = _scope_clause(scope)
    if clause is not None:
        query = query.where(clause)
    return [
        PageRow(None if row.alert_id is None else int(row.alert_id), row.status, row.acked_at)
        for row in await conn.execute(query)
    ]


def _storm_job(key: str) -> tuple[str, str]:
    """("ns", "name") of a storm job key such as "trainingjob:ns/name"."""
    _, _, ref = key.partition(":")
    namespace, _, name = ref.rpartition("/")
    return namespace, name


async def load_storms(
    conn: AsyncConnection, start: datetime, end: datetime, scope: Scope = Scope()
) -> list[StormRow]:
    query = select(
        notifications.c.group_key, notifications.c.payload, notifications.c.priority
    ).where(
        notifications.c.kind == "storm",
        notifications.c.created_at >= start,
        notifications.c.created_at < end,
    )
    rows: list[StormRow] = []
    for row in await conn.execute(query):
        payload = row.payload or {}
        job = str(payload.get("job") or row.group_key.removeprefix("storm:"))
        if not scope.covers(*_storm_job(job)):
            continue
        try:
            at = datetime.fromisoformat(str(payload["at"]))
        except (KeyError, ValueError):
            continue
        total = int((payload.get("storm") or {}).get("total", 0) or 0)
        # the policy names them storm_started / storm_summary / storm_ended
        event = str(payload.get("event", "")).removeprefix("storm_")
        rows.append(StormRow(job, event, at, total, row.priority))
    return rows


async def load_first_notices(
    conn: AsyncConnection, alert_ids: Iterable[int]
) -> dict[int, datetime]:
    """alert id -> when its first notification (any channel) was sent; alerts with none sent
    (a hang the diagnosis did not page) are absent."""
    found: dict[int, datetime] = {}
    wanted = sorted(set(alert_ids))
    for i in range(0, len(wanted), _IN_CHUNK):
        query = (
            select(notifications.c.alert_id, func.min(notifications.c.sent_at))
            .where(
                notifications.c.alert_id.in_(wanted[i : i + _IN_CHUNK]),
                notifications.c.sent_at.is_not(None),
            )
            .group_by(notifications.c.alert_id)
        )
        for alert_id, first in await conn.execute(query):
            if first is not None:
                found[int(alert_id)] = first
    return found
