"""Feishu card callbacks already acted on (table `callback_events`), so a replayed or
redelivered callback is acted on once, on whichever replica it lands.

Feishu signs a callback with a timestamp and refuses nothing it signed itself: within the
signature window (`callback.max_skew_s`) the same request can be sent again, and each copy
would ack again and create another Alertmanager silence. The first delivery of an event id
inserts its row; a repeat finds it (ON CONFLICT DO NOTHING, so two replicas racing on one id
agree: exactly one inserts). Rows older than `KEEP` are deleted on the way.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import dialect_insert
from trainsentry.store.schema import callback_events

KEEP = timedelta(days=1)
MAX_EVENT_ID = 128


async def first_delivery(conn: AsyncConnection, event_id: str, now: datetime) -> bool:
    """True the first time `event_id` is seen (it is recorded in the caller's transaction),
    False for a repeat. `event_id` is at most MAX_EVENT_ID characters."""
    await conn.execute(delete(callback_events).where(callback_events.c.received_at < now - KEEP))
    statement = (
        dialect_insert(conn, callback_events)
        .values(event_id=event_id, received_at=now)
        .on_conflict_do_nothing(index_elements=[callback_events.c.event_id])
    )
    result = await conn.execute(statement)
    return result.rowcount == 1


async def forget_delivery(conn: AsyncConnection, event_id: str) -> None:
    """Acting on the event failed: a redelivery of it is acted on again."""
    await conn.execute(delete(callback_events).where(callback_events.c.event_id == event_id))
