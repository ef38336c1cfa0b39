"""What happens to a stored alert after intake: acknowledgements, events, hang verdicts.

Every function runs inside the caller's transaction (an `AsyncConnection` from
`engine.begin()`), so a stage can commit an ack together with the escalation it stops and
the notifications it queues.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Row, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import alert_events, alerts, incident_alerts, notifications

#: `last_error` of a notification held back past its diagnosis (a checkpoint within its limit).
HELD_MARK = "held: checkpoint within its limit"


async def lock_alert(conn: AsyncConnection, alert_id: int) -> Row[Any] | None:
    """The alert's row (all columns), locked for this transaction on PostgreSQL; None if
    there is no such alert."""
    query = select(alerts).where(alerts.c.id == alert_id)
    if not is_sqlite(conn):
        query = query.with_for_update()
    return (await conn.execute(query)).first()


async def acknowledge(
    conn: AsyncConnection,
    alert_id: int,
    who: str,
    now: datetime,
    comment: str | None = None,
    said: Mapping[str, str] | None = None,
) -> None:
    """Records who acknowledged the alert and when, with an `acked` event (and the comment
    given with the ack, if any; `said`: what the acknowledger gave, when it differs)."""
    await conn.execute(
        update(alerts).where(alerts.c.id == alert_id).values(acked_at=now, acked_by=who)
    )
    detail = {"by": who, "comment": comment} if comment else {"by": who}
    await record_event(conn, alert_id, "acked", now, {**detail, **(said or {})})


async def ack_comment(conn: AsyncConnection, alert_id: int) -> str | None:
    """The comment given with the alert's ack, if any."""
    query = (
        select(alert_events.c.detail)
        .where(alert_events.c.alert_id == alert_id, alert_events.c.kind == "acked")
        .order_by(alert_events.c.id)
        .limit(1)
    )
    detail = (await conn.execute(query)).scalar()
    comment = (detail or {}).get("comment") if isinstance(detail, dict) else None
    return comment if isinstance(comment, str) else None


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
    hold_until: datetime | None = None,
) -> int:
    """Stores a hang diagnosis with its alert and releases the alert's held notifications:
    every pending one gets `payload_update` merged into its payload and is due `now`, or,
    with `cancel`, becomes `cancelled` (not a page after all), or, with `hold_until`, stays
    held until then, marked `HELD_MARK` (a checkpoint within its limit: `cancel_held` drops
    it when the stall ends first). Returns how many it touched."""
    await conn.execute(update(alerts).where(alerts.c.id == alert_id).values(verdict=dict(verdict)))
    values: dict[str, Any] = {"next_attempt_at": now}
    if cancel:
        values["status"] = "cancelled"
    elif hold_until is not None:
        values.update(next_attempt_at=hold_until, last_error=HELD_MARK)
    rows = await _update_pending(conn, notifications.c.alert_id == alert_id, payload_update, values)
    return len(rows)


async def _update_pending(
    conn: AsyncConnection,
    which: ColumnElement[bool],
    payload_update: Mapping[str, Any],
    values: Mapping[str, Any],
) -> Sequence[Row[Any, Any, Any]]:
    """The pending notifications `which` selects get `payload_update` merged into their
    payload and `values` set (a row sent meanwhile is left alone); returns their rows."""
    rows = (
        await conn.execute(
            select(notifications.c.id, notifications.c.alert_id, notifications.c.payload).where(
                which, notifications.c.status == "pending"
            )
        )
    ).all()
    for row in rows:
        await conn.execute(
            update(notifications)
            .where(notifications.c.id == row.id, notifications.c.status == "pending")
            .values(payload={**dict(row.payload), **payload_update}, **values)
        )
    return rows


async def cancel_held(conn: AsyncConnection, alert_ids: Sequence[int], why: str) -> set[int]:
    """Notifications `save_verdict` holds (`HELD_MARK`) of `alert_ids` are never sent: they
    become `cancelled` with `why`. Returns the alerts that had such a row (never paged)."""
    if not alert_ids:
        return set()
    rows = await conn.execute(
        update(notifications)
        .where(
            notifications.c.alert_id.in_(list(alert_ids)),
            notifications.c.status == "pending",
            notifications.c.last_error == HELD_MARK,
        )
        .values(status="cancelled", last_error=why)
        .returning(notifications.c.alert_id)
    )
    return {int(row.alert_id) for row in rows}


async def release_incident_held(
    conn: AsyncConnection, alert_id: int, payload_update: Mapping[str, Any], now: datetime
) -> set[int]:
    """The notifications held for a checkpoint's limit (`HELD_MARK`) of the other alerts of
    `alert_id`'s incident go out now, with `payload_update` merged into their payload (a
    hang found in the incident: its pages say so). Returns the alerts whose rows went."""
    incident = (
        select(incident_alerts.c.incident_id)
        .where(incident_alerts.c.alert_id == alert_id)
        .scalar_subquery()
    )
    members = select(incident_alerts.c.alert_id).where(incident_alerts.c.incident_id == incident)
    held = (
        notifications.c.alert_id.in_(members)
        & (notifications.c.alert_id != alert_id)
        & (notifications.c.last_error == HELD_MARK)
    )
    values = {"next_attempt_at": now, "last_error": None}
    rows = await _update_pending(conn, held, payload_update, values)
    return {int(row.alert_id) for row in rows}
