"""A rate-limited channel's backlog must not hold back urgent rows (docs/gateway.md, outbox).

The background worker against the real loopback receiver and a real store (SQLite and
PostgreSQL): a backlog of P3 rows on a rate-limited channel takes seconds to send; a P0
written meanwhile, for another channel and for the same one, goes out at once.
"""

from __future__ import annotations

import asyncio
import time

from receiver import Receiver
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.alerts import NotificationDraft, Priority, utcnow
from trainsentry.gateway.outbox import Outbox
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store.schema import notifications
from trainsentry.store.writes import insert_notifications

BACKLOG = 24
LIMIT = (2, 0.5)  # the bulk channel sends 2 per 0.5 s: the backlog takes about 6.5 s


def draft(channel: str, key: str, priority: Priority) -> NotificationDraft:
    return NotificationDraft(
        channel=channel,
        kind="alert",
        priority=priority,
        idempotency_key=key,
        payload={"priority": priority.value, "key": key},
        group_key=f"alert:{key}",
    )


async def enqueue(engine: AsyncEngine, items: list[NotificationDraft]) -> None:
    async with engine.begin() as conn:
        await insert_notifications(conn, items, utcnow())


def arrivals(receiver: Receiver) -> dict[str, float]:
    """Key -> monotonic arrival time of each accepted request (the receiver never fails here)."""
    return {
        body["payload"]["key"]: at for body, at in zip(receiver.bodies, receiver.times, strict=True)
    }


async def wait_for(predicate: object, within: float) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_p0_is_not_held_back_by_a_rate_limited_backlog(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    await enqueue(engine, [draft("bulk", f"p3-{i}", Priority.P3) for i in range(BACKLOG)])
    outbox = Outbox(
        engine,
        {"bulk": WebhookNotifier(receiver.url), "urgent": WebhookNotifier(receiver.url)},
        rate_limits={"bulk": [LIMIT]},
    )
    outbox.start()
    try:
        await wait_for(lambda: len(receiver.bodies) >= 4, 10)
        written = time.monotonic()
        await enqueue(
            engine, [draft("urgent", "call", Priority.P0), draft("bulk", "card", Priority.P0)]
        )
        outbox.wake()  # as the policy worker does after writing outbox rows
        await wait_for(lambda: len(receiver.bodies) == BACKLOG + 2, 30)
        seen = arrivals(receiver)
        backlog = [at for key, at in seen.items() if key.startswith("p3-")]
        # Order, not seconds: both P0s went out while most of the backlog still waited (before,
        # the whole backlog was claimed at once and sent first). Another channel's P0 does not
        # wait for the rate-limited one at all; the same channel's takes its next turn.
        assert sum(at > seen["call"] for at in backlog) >= BACKLOG - 6
        assert sum(at > seen["card"] for at in backlog) >= BACKLOG - 8
        assert seen["call"] > written
    finally:
        await outbox.aclose()
    assert receiver.duplicates == 0


async def test_a_rate_limited_channel_claims_a_row_only_when_it_may_send_it(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    """A claimed row does not wait for a token, so its lease covers the send itself (a batch
    claimed ahead of a 100-per-minute limit could wait out its lease and be sent twice)."""
    await enqueue(engine, [draft("bulk", f"p3-{i}", Priority.P3) for i in range(BACKLOG // 2)])
    outbox = Outbox(engine, {"bulk": WebhookNotifier(receiver.url)}, rate_limits={"bulk": [LIMIT]})
    most_claimed = 0
    outbox.start()
    try:
        while len(receiver.bodies) < BACKLOG // 2:
            async with engine.connect() as conn:
                claimed = (
                    await conn.execute(
                        select(func.count()).where(notifications.c.status == "sending")
                    )
                ).scalar_one()
            most_claimed = max(most_claimed, claimed)
            await asyncio.sleep(0.02)
    finally:
        await outbox.aclose()
    assert most_claimed <= LIMIT[0]
