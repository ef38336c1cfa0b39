"""Maintenance windows and the alerts they muted: all their SQL.

Invariants:
- a window row is written once (created) and changed only by `end_window` (ended early, who
  and when) and `claim_announcement` (its "ends soon" notice, once per stretch);
- a mute row is claimed (`claim_due_mutes`) with `FOR UPDATE SKIP LOCKED` on PostgreSQL and
  changed in the claiming transaction, so with several replicas each mute is released by one;
- `claim_announcement` is one conditional UPDATE: of replicas racing for the same stretch's
  notice, exactly one sees its row changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import alerts, maintenance_mutes, maintenance_windows

MUTED = "muted"  # held back; the notices in `drafts` are owed if it still fires at the end
NOTIFIED = "notified"  # still firing when its window ended: the notices were written
RESOLVED = "resolved"  # resolved while muted: nothing owed


@dataclass(frozen=True)
class WindowRow:
    id: str
    created_at: datetime
    created_by: str
    reason: str
    request: dict[str, Any]
    starts_at: datetime | None
    ends_at: datetime | None
    ended_at: datetime | None
    ended_by: str | None
    announced_end: datetime | None


@dataclass(frozen=True)
class DueMute:
    """A mute whose stretch ended, with its alert as stored now."""

    alert_id: int
    window_id: str
    until: datetime | None
    drafts: list[dict[str, Any]]
    firing: bool
    labels: dict[str, str]


@dataclass(frozen=True)
class MutedAlert:
    alert_id: int
    alertname: str
    priority: str | None
    labels: dict[str, str]


def _window(row: Any) -> WindowRow:
    return WindowRow(
        id=row.id,
        created_at=row.created_at,
        created_by=row.created_by,
        reason=row.reason,
        request=dict(row.request),
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        ended_at=row.ended_at,
        ended_by=row.ended_by,
        announced_end=row.announced_end,
    )


async def insert_window(conn: AsyncConnection, window: WindowRow) -> None:
    await conn.execute(
        maintenance_windows.insert().values(
            id=window.id,
            created_at=window.created_at,
            created_by=window.created_by,
            reason=window.reason,
            request=window.request,
            starts_at=window.starts_at,
            ends_at=window.ends_at,
        )
    )


async def list_windows(
    conn: AsyncConnection, *, now: datetime, include_past: bool = False, limit: int = 1000
) -> list[WindowRow]:
    """Windows not ended (one-off windows not past their end, recurring ones not ended
    early), oldest first; with `include_past` every window, newest first."""
    query = select(maintenance_windows)
    if include_past:
        query = query.order_by(maintenance_windows.c.created_at.desc())
    else:
        query = query.where(
            or_(maintenance_windows.c.ended_at.is_(None), maintenance_windows.c.ended_at > now),
            or_(maintenance_windows.c.ends_at.is_(None), maintenance_windows.c.ends_at > now),
        ).order_by(maintenance_windows.c.created_at, maintenance_windows.c.id)
    return [_window(row) for row in await conn.execute(query.limit(limit))]


async def get_window(conn: AsyncConnection, window_id: str) -> WindowRow | None:
    row = (
        await conn.execute(select(maintenance_windows).where(maintenance_windows.c.id == window_id))
    ).first()
    return None if row is None else _window(row)


async def end_window(
    conn: AsyncConnection, window_id: str, *, by: str, now: datetime
) -> WindowRow | None:
    """Ends a window now (kept: who and when); its open mutes are due now. An already ended
    window is returned unchanged. None: no such window.

    The mutes are updated before the window row: the ticker locks due mutes, then the window
    row (its "ends soon" claim), so this order cannot wait on it in a cycle."""
    window = await get_window(conn, window_id)
    if window is None or window.ended_at is not None:
        return window
    await conn.execute(
        update(maintenance_mutes)
        .where(maintenance_mutes.c.window_id == window_id, maintenance_mutes.c.state == MUTED)
        .values(until=now)
    )
    await conn.execute(
        update(maintenance_windows)
        .where(maintenance_windows.c.id == window_id, maintenance_windows.c.ended_at.is_(None))
        .values(ended_at=now, ended_by=by)
    )
    return await get_window(conn, window_id)


async def mute_states(conn: AsyncConnection, alert_ids: Iterable[int]) -> dict[int, str]:
    """Of these alerts, those a window muted: alert id -> state (locked on PostgreSQL, as the
    policy's states are)."""
    wanted = sorted(set(alert_ids))
    found: dict[int, str] = {}
    for start in range(0, len(wanted), 5000):
        query = select(maintenance_mutes.c.alert_id, maintenance_mutes.c.state).where(
            maintenance_mutes.c.alert_id.in_(wanted[start : start + 5000])
        )
        if not is_sqlite(conn):
            query = query.with_for_update()
        found.update({int(row.alert_id): row.state for row in await conn.execute(query)})
    return found


async def insert_mutes(
    conn: AsyncConnection,
    mutes: Sequence[tuple[int, str, datetime | None, list[dict[str, Any]]]],
    now: datetime,
) -> None:
    """New mutes: (alert id, window id, until, the notices held back). An alert muted before
    (a mute closed since) is muted again in the same row."""
    for alert_id, window_id, until, drafts in mutes:
        values = {
            "window_id": window_id,
            "muted_at": now,
            "until": until,
            "state": MUTED,
            "closed_at": None,
            "drafts": drafts,
        }
        changed = await conn.execute(
            update(maintenance_mutes)
            .where(maintenance_mutes.c.alert_id == alert_id)
            .values(**values)
        )
        if not changed.rowcount:
            await conn.execute(maintenance_mutes.insert().values(alert_id=alert_id, **values))


async def close_mutes(
    conn: AsyncConnection, alert_ids: Iterable[int], state: str, now: datetime
) -> None:
    ids = sorted(set(alert_ids))
    for start in range(0, len(ids), 5000):
        await conn.execute(
            update(maintenance_mutes)
            .where(
                maintenance_mutes.c.alert_id.in_(ids[start : start + 5000]),
                maintenance_mutes.c.state == MUTED,
            )
            .values(state=state, closed_at=now)
        )


async def claim_due_mutes(conn: AsyncConnection, now: datetime, limit: int = 500) -> list[DueMute]:
    """Open mutes whose stretch ended by `now`, with their alerts; locked, skipping rows
    another replica holds (PostgreSQL). The caller closes or re-mutes each, in its transaction."""
    query = (
        select(
            maintenance_mutes.c.alert_id,
            maintenance_mutes.c.window_id,
            maintenance_mutes.c.until,
            maintenance_mutes.c.drafts,
            alerts.c.status,
            alerts.c.labels,
        )
        .join(alerts, alerts.c.id == maintenance_mutes.c.alert_id)
        .where(
            maintenance_mutes.c.state == MUTED,
            or_(
                maintenance_mutes.c.until <= now,
                # muted by a window ended meanwhile (ended while the mute was being written)
                maintenance_mutes.c.window_id.in_(
                    select(maintenance_windows.c.id).where(
                        maintenance_windows.c.ended_at.is_not(None)
                    )
                ),
            ),
        )
        .order_by(maintenance_mutes.c.until, maintenance_mutes.c.alert_id)
        .limit(limit)
    )
    if not is_sqlite(conn):
        query = query.with_for_update(skip_locked=True, of=maintenance_mutes)
    return [
        DueMute(
            alert_id=int(row.alert_id),
            window_id=row.window_id,
            until=row.until,
            drafts=list(row.drafts),
            firing=row.status == "firing",
            labels={str(k): str(v) for k, v in dict(row.labels).items()},
        )
        for row in await conn.execute(query)
    ]


async def remute(conn: AsyncConnection, moves: Mapping[int, tuple[str, datetime | None]]) -> None:
    """Mutes whose alert another window still mutes: that window, until its stretch ends."""
    for alert_id, (window_id, until) in moves.items():
        await conn.execute(
            update(maintenance_mutes)
            .where(maintenance_mutes.c.alert_id == alert_id)
            .values(window_id=window_id, until=until)
        )


async def firing_muted(conn: AsyncConnection, window_id: str) -> list[MutedAlert]:
    """The alerts this window mutes now that still fire."""
    query = (
        select(alerts.c.id, alerts.c.alertname, alerts.c.priority, alerts.c.labels)
        .join(maintenance_mutes, alerts.c.id == maintenance_mutes.c.alert_id)
        .where(
            maintenance_mutes.c.window_id == window_id,
            maintenance_mutes.c.state == MUTED,
            alerts.c.status == "firing",
        )
        .order_by(alerts.c.id)
        .limit(1000)
    )
    return [
        MutedAlert(int(row.id), row.alertname, row.priority, dict(row.labels))
        for row in await conn.execute(query)
    ]


async def claim_announcement(conn: AsyncConnection, window_id: str, end: datetime) -> bool:
    """True for the one caller that records the "ends soon" notice of the stretch ending
    at `end` (a later stretch of a recurring window gets its own)."""
    changed = await conn.execute(
        update(maintenance_windows)
        .where(
            maintenance_windows.c.id == window_id,
            or_(
                maintenance_windows.c.announced_end.is_(None),
                maintenance_windows.c.announced_end != end,
            ),
        )
        .values(announced_end=end)
    )
    return bool(changed.rowcount)


async def mutes_of(conn: AsyncConnection, alert_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The read API's view: alert id -> which window muted it, and what became of it."""
    ids = sorted(set(alert_ids))
    found: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), 1000):
        query = (
            select(
                maintenance_mutes.c.alert_id,
                maintenance_mutes.c.window_id,
                maintenance_mutes.c.muted_at,
                maintenance_mutes.c.until,
                maintenance_mutes.c.state,
                maintenance_mutes.c.closed_at,
                maintenance_windows.c.reason,
                maintenance_windows.c.created_by,
            )
            .join(
                maintenance_windows,
                maintenance_windows.c.id == maintenance_mutes.c.window_id,
                isouter=True,
            )
            .where(maintenance_mutes.c.alert_id.in_(ids[start : start + 1000]))
        )
        for row in await conn.execute(query):
            found[int(row.alert_id)] = {
                "window_id": row.window_id,
                "reason": row.reason or "",
                "created_by": row.created_by or "",
                "muted_at": row.muted_at.isoformat(),
                "until": row.until.isoformat() if row.until else None,
                "state": row.state,
                "closed_at": row.closed_at.isoformat() if row.closed_at else None,
            }
    return found


async def quiet_open_windows(
    conn: AsyncConnection, *, now: datetime, quiet_since: datetime
) -> list[tuple[WindowRow, int, datetime]]:
    """Windows still open at `now` that muted alerts, all of which were resolved before
    `quiet_since`: (window, alerts muted, last resolution) (the weekly report lists them)."""
    windows = await list_windows(conn, now=now)
    found = []
    for window in windows:
        rows = list(
            await conn.execute(
                select(maintenance_mutes.c.state, alerts.c.resolved_at)
                .join(alerts, alerts.c.id == maintenance_mutes.c.alert_id)
                .where(maintenance_mutes.c.window_id == window.id)
            )
        )
        if not rows or any(r.resolved_at is None for r in rows):
            continue
        last = max(r.resolved_at for r in rows)
        if last < quiet_since:
            found.append((window, len(rows), last))
    return found
