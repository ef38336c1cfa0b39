"""What happens to a stored alert after intake: acknowledgements, events, hang verdicts.

Every function runs inside the caller's transaction (an `AsyncConnection` from
`engine.begin()`), so a stage can commit an ack together with the escalation it stops and
the notifications it queues.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import alert_events, alerts, notifications


async def lock_alert(conn: AsyncConnection, alert_id: int) -> Row[Any] | None:
    """The alert's row (all columns), locked for this transaction on PostgreSQL; None if
    there is no such alert."""
    query = select(alerts).where(alerts.c.id == alert_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    return (await conn.execute(query)).first()


async def acknowledge(conn: AsyncConnection, alert_id: int, who: str, now: datetime) -> None:
    """Records who acknowledged the alert and when, with an `acked` event."""
    await conn.execute(
        update(alerts).where(alerts.c.id == alert_id).values(acked_at=now, acked_by=who)
    )
    await record_event(conn, alert_id, "acked", now, {"by": who})


async def record_event(
    conn: AsyncConnection, alert_id: int, kind: str, at: datetime, detail: Mapping[str, Any]
) -> None:
    """One entry of the alert's history (`alert_events`)."""
    await conn.execute(
        alert_events.insert().values(alert_id=alert_id, kind=kind, at=at, detail=dict(detail))
    )


async def acked_among(conn: AsyncConnection, alert_ids: Sequence[int]) -> set[int]:
    """Those of `alert_ids` someone has acknowledged."""
    if not alert_ids:
        return set()
    query = select(alerts.c.id).where(alerts.c.id.in_(alert_ids), alerts.c.acked_at.is_not(None))
    return {int(alert_id) for (alert_id,) in await conn.execute(query)}


async def save_verdict(
    conn: AsyncConnection,
    alert_id: int,
    verdict: Mapping[str, Any],
    payload_update: Mapping[str, Any],
    now: datetime,
    *,
    cancel: bool,
) -> int:
    """Stores a hang diagnosis with its alert and releases the alert's held notifications:
    every pending one gets `payload_update` merged into its payload and is due `now`, or,
    with `cancel`, becomes `cancelled` (not a page after all). Returns how many it touched."""
    await conn.execute(update(alerts).where(alerts.c.id == alert_id).values(verdict=dict(verdict)))
    rows = (
        await conn.execute(
            select(notifications.c.id, notifications.c.payload).where(
                notifications.c.alert_id == alert_id,
                notifications.c.status == "pending",
            )
        )
    ).all()
    for row in rows:
        payload = {**dict(row.payload), **payload_update}
        values: dict[str, Any] = {"payload": payload, "next_attempt_at": now}
        if cancel:
            values["status"] = "cancelled"
        await conn.execute(
            update(notifications)
            .where(notifications.c.id == row.id, notifications.c.status == "pending")
            .values(**values)
        )
    return len(rows)
