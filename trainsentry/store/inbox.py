"""The policy inbox: alert changes the intake committed and the alert policy has not handled.

The intake adds a row per recorded event in its transaction; the policy worker claims rows,
runs the policy and deletes them in one transaction, so each change is planned exactly once
whatever crashes in between. On PostgreSQL claimed rows are locked with SKIP LOCKED: replicas
share the inbox instead of waiting for each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Alert, AlertChange, AlertStatus, ChangeKind
from trainsentry.store.bulk import decode_json, decode_time, fetch
from trainsentry.store.schema import policy_inbox


@dataclass(frozen=True, slots=True)
class Claimed:
    event_ids: list[int]
    changes: list[AlertChange]


_CLAIM = (
    "SELECT i.event_id, e.kind, e.at, a.id, a.fingerprint, a.labels, a.annotations, "
    "a.starts_at, a.ends_at, a.generator_url "
    "FROM policy_inbox i JOIN alert_events e ON e.id = i.event_id "
    "JOIN alerts a ON a.id = e.alert_id ORDER BY i.event_id LIMIT ?"
)


async def claim_inbox(conn: AsyncConnection, limit: int) -> Claimed:
    """The oldest `limit` waiting changes, locked for this transaction, in event order."""
    sql = _CLAIM if conn.dialect.name == "sqlite" else _CLAIM + " FOR UPDATE OF i SKIP LOCKED"
    # Read through the driver (bulk.decode_*): this runs once per alert change.
    rows = await fetch(conn, sql, (limit,))
    event_ids: list[int] = []
    changes: list[AlertChange] = []
    for event_id, kind_text, at, alert_id, fp, labels, notes, starts, ends, url in rows:
        kind = ChangeKind(kind_text)
        # The occurrence as stored now; its status is the one this change moved it to.
        status = AlertStatus.FIRING if kind is ChangeKind.FIRING else AlertStatus.RESOLVED
        alert = Alert(
            fingerprint=fp,
            status=status,
            labels=decode_json(labels),
            annotations=decode_json(notes),
            starts_at=decode_time(starts),
            ends_at=decode_time(ends) if ends is not None else None,
            generator_url=url,
        )
        event_ids.append(int(event_id))
        changes.append(AlertChange(int(alert_id), kind, alert, decode_time(at)))
    return Claimed(event_ids, changes)


async def clear_inbox(conn: AsyncConnection, event_ids: list[int]) -> None:
    for start in range(0, len(event_ids), 5000):
        chunk = event_ids[start : start + 5000]
        await conn.execute(delete(policy_inbox).where(policy_inbox.c.event_id.in_(chunk)))


async def inbox_depth(conn: AsyncConnection) -> int:
    return int((await conn.execute(select(func.count()).select_from(policy_inbox))).scalar_one())
