"""Run-time on-call overrides and swaps (table `oncall_overrides`): added and removed through
the API or CLI. A removal only marks the row (who, when), so the rows are the audit trail:
who changed the schedule, when, and what."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import oncall_overrides

MAX_LISTED = 1000


@dataclass(frozen=True)
class StoredChange:
    id: int
    schedule: str
    kind: str  # override | swap
    who: str
    replaces: str | None
    starts_at: datetime
    ends_at: datetime
    reason: str
    created_by: str
    created_at: datetime
    removed_by: str | None = None
    removed_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        def iso(moment: datetime | None) -> str | None:
            return None if moment is None else moment.isoformat()

        return {
            "id": self.id,
            "schedule": self.schedule,
            "kind": self.kind,
            "who": self.who,
            "replaces": self.replaces,
            "start": iso(self.starts_at),
            "end": iso(self.ends_at),
            "reason": self.reason,
            "created_by": self.created_by,
            "created_at": iso(self.created_at),
            "removed_by": self.removed_by,
            "removed_at": iso(self.removed_at),
        }


def _change(row: Any) -> StoredChange:
    return StoredChange(
        id=int(row.id),
        schedule=row.schedule,
        kind=row.kind,
        who=row.who,
        replaces=row.replaces,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        reason=row.reason or "",
        created_by=row.created_by,
        created_at=row.created_at,
        removed_by=row.removed_by,
        removed_at=row.removed_at,
    )


async def add_change(
    conn: AsyncConnection,
    *,
    schedule: str,
    kind: str,
    who: str,
    replaces: str | None,
    starts_at: datetime,
    ends_at: datetime,
    reason: str,
    created_by: str,
    now: datetime,
) -> StoredChange:
    """Stores one override or swap (already validated); returns it with its id."""
    values = {
        "schedule": schedule,
        "kind": kind,
        "who": who,
        "replaces": replaces,
        "starts_at": starts_at,
        "ends_at": ends_at,
        "reason": reason,
        "created_by": created_by,
        "created_at": now,
    }
    result = await conn.execute(insert(oncall_overrides).values(**values))
    new_id = result.inserted_primary_key[0] if result.inserted_primary_key else None
    return StoredChange(id=int(new_id or 0), **values)  # type: ignore[arg-type]


async def changes_in_force(
    conn: AsyncConnection, schedules: Sequence[str] | None, after: datetime
) -> list[StoredChange]:
    """Changes not removed that end after `after`, oldest first (of `schedules`, or all)."""
    query = select(oncall_overrides).where(
        oncall_overrides.c.removed_at.is_(None), oncall_overrides.c.ends_at > after
    )
    if schedules is not None:
        query = query.where(oncall_overrides.c.schedule.in_(list(schedules)))
    rows = await conn.execute(query.order_by(oncall_overrides.c.id).limit(MAX_LISTED))
    return [_change(row) for row in rows]


async def list_changes(
    conn: AsyncConnection, schedule: str | None, *, removed: bool, limit: int = MAX_LISTED
) -> list[StoredChange]:
    """The stored changes, newest first; with `removed`, the removed ones too."""
    query = select(oncall_overrides)
    if schedule is not None:
        query = query.where(oncall_overrides.c.schedule == schedule)
    if not removed:
        query = query.where(oncall_overrides.c.removed_at.is_(None))
    rows = await conn.execute(query.order_by(oncall_overrides.c.id.desc()).limit(limit))
    return [_change(row) for row in rows]


async def change_schedule(conn: AsyncConnection, change_id: int) -> str | None:
    """The schedule of a change in force (not removed); None: no such change in force."""
    query = select(oncall_overrides.c.schedule).where(
        oncall_overrides.c.id == change_id, oncall_overrides.c.removed_at.is_(None)
    )
    found = (await conn.execute(query)).scalar()
    return None if found is None else str(found)


async def remove_change(
    conn: AsyncConnection, change_id: int, by: str, now: datetime
) -> StoredChange | None:
    """Marks a change removed (who, when); None if there is none, or it is removed already."""
    result = await conn.execute(
        update(oncall_overrides)
        .where(oncall_overrides.c.id == change_id, oncall_overrides.c.removed_at.is_(None))
        .values(removed_by=by, removed_at=now)
    )
    if result.rowcount != 1:
        return None
    row = (
        await conn.execute(select(oncall_overrides).where(oncall_overrides.c.id == change_id))
    ).first()
    return None if row is None else _change(row)
