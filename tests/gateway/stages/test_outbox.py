"""The durable outbox against a real local HTTP receiver, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tests.support.receiver import Receiver
from trainsentry.alerts import NotificationDraft, Priority, utcnow
from trainsentry.gateway.policy.outbox_retry import DeliveryRules
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.notifiers.ratelimit import RateLimit, SlidingWindow
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store import create_engine
from trainsentry.store.outbox import PENDING, SendOutcome, claim_notifications, record_outcomes
from trainsentry.store.schema import notifications
from trainsentry.store.writes import insert_notifications

# Scaled time: give up after 0.3 s of failing, back off from 10 ms to 50 ms.
FAST_RETRY = DeliveryRules(
    give_up_after=dict.fromkeys(Priority, 0.3), base_delay=0.01, max_delay=0.05
)


def drafts(count: int, group: str = "g", prefix: str = "n") -> list[NotificationDraft]:
    return [
        NotificationDraft(
            channel="webhook",
            kind="alert",
            priority=Priority.P1,
            idempotency_key=f"{prefix}-{i}",
            payload={"priority": "P1", "status": "firing", "seq": i, "group": group},
            group_key=group,
        )
        for i in range(count)
    ]


def ranked(key: str, group: str, priority: Priority) -> NotificationDraft:
    """One draft of `priority` in its own group, its payload naming it by `key`."""
    return NotificationDraft(
        channel="webhook",
        kind="alert",
        priority=priority,
        idempotency_key=key,
        payload={"priority": priority.value, "key": key},
        group_key=group,
    )


async def enqueue(engine: AsyncEngine, items: list[NotificationDraft]) -> None:
    async with engine.begin() as conn:
        await insert_notifications(conn, items, utcnow())


async def statuses(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = (await conn.execute(select(notifications.c.status))).all()
    out: dict[str, int] = {}
    for (status,) in rows:
        out[status] = out.get(status, 0) + 1
    return out


async def drain(outbox: Outbox, rounds: int = 200) -> None:
    for _ in range(rounds):
        if not await outbox.run_once():
            async with outbox._engine.connect() as conn:
                pending = (
                    await conn.execute(
                        select(notifications.c.id).where(notifications.c.status == "pending")
                    )
                ).first()
            if pending is None:
                return
            await asyncio.sleep(0.02)
    raise AssertionError("outbox did not drain")


async def test_retries_then_sends_once(engine: AsyncEngine, receiver: Receiver) -> None:
    receiver.fail_first = 2
    await enqueue(engine, drafts(1))
    outbox = Outbox(engine, {"webhook": WebhookNotifier(receiver.url)}, rules=FAST_RETRY)
    await drain(outbox)
    await outbox.aclose()
    assert receiver.requests == 3 and receiver.unique == 1
    async with engine.connect() as conn:
        row = (await conn.execute(select(notifications))).one()
    assert row.status == "sent" and row.attempts == 3 and "500" in row.last_error


async def test_permanent_error_and_exhausted_retries_end_dead(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.fail_first = 10**6
    await enqueue(engine, drafts(2))
    notifier = WebhookNotifier(receiver.url.replace("/hook", "/missing"))  # 404: permanent
    outbox = Outbox(engine, {"webhook": notifier}, rules=FAST_RETRY)
    await drain(outbox)
    assert await statuses(engine) == {"dead": 2}
    assert receiver.requests == 0

    await enqueue(engine, drafts(1, group="h", prefix="m"))
    outbox2 = Outbox(engine, {"webhook": WebhookNotifier(receiver.url)}, rules=FAST_RETRY)
    started = asyncio.get_running_loop().time()
    await drain(outbox2)
    failing_for = asyncio.get_running_loop().time() - started
    assert await statuses(engine) == {"dead": 3}
    # 500 every time: dead once it has failed for 0.3 s (the last try placed at that moment)
    assert 0.3 <= failing_for < 1.5
    assert receiver.requests >= 4
    await outbox.aclose()
    await outbox2.aclose()


async def test_order_is_kept_per_group_across_retries(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.rate_limit_every = 3  # every third request is told to slow down
    await enqueue(engine, drafts(6, group="a", prefix="a") + drafts(6, group="b", prefix="b"))
    outbox = Outbox(engine, {"webhook": WebhookNotifier(receiver.url)}, rules=FAST_RETRY)
    await drain(outbox)
    await outbox.aclose()
    for group in ("a", "b"):
        seen = [b["payload"]["seq"] for b in receiver.bodies if b["payload"]["group"] == group]
        assert seen == list(range(6)), group
    assert receiver.duplicates == 0


async def test_rate_limits_are_never_exceeded(engine: AsyncEngine, receiver: Receiver) -> None:
    items = [d for i in range(8) for d in drafts(1, group=f"g{i}", prefix=f"r{i}")]
    await enqueue(engine, items)
    outbox = Outbox(
        engine,
        {"webhook": WebhookNotifier(receiver.url)},
        rules=FAST_RETRY,
        rate_limits={"webhook": [(3, 0.5)]},
    )
    await drain(outbox)
    await outbox.aclose()
    stamps = receiver.times
    assert len(stamps) == 8
    # A send counts from its answer, which comes after the receiver saw it: so the receiver
    # never sees 4 within half a second, however the requests are delayed on the way.
    for i in range(len(stamps) - 3):
        assert stamps[i + 3] - stamps[i] >= 0.5


async def test_a_p0_is_claimed_before_an_older_backlog_but_not_before_its_own_group(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    backlog = [ranked(f"p3-{i}", f"alert:{i}", Priority.P3) for i in range(6)]
    await enqueue(engine, backlog)
    await enqueue(
        engine, [ranked("p1", "alert:p1", Priority.P1), ranked("late", "alert:0", Priority.P0)]
    )
    await enqueue(engine, [ranked("p0", "alert:p0", Priority.P0)])
    # one row per claim, as a rate-limited channel's backlog would be claimed
    outbox = Outbox(
        engine, {"webhook": WebhookNotifier(receiver.url)}, rules=FAST_RETRY, claim_batch=1
    )
    await drain(outbox)
    await outbox.aclose()
    sent = [body["payload"]["key"] for body in receiver.bodies]
    assert sent[:2] == ["p0", "p1"]
    # alert 0's P0 update waits for that alert's older P3 card, then goes before the rest
    assert sent[2:4] == ["p3-0", "late"]
    assert sent[4:] == [f"p3-{i}" for i in range(1, 6)]


async def test_a_claim_takes_no_more_rows_than_its_limit(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    # Rate-limited channels rely on it: more rows than the limit could outlive their lease.
    await enqueue(engine, [d for i in range(5) for d in drafts(1, group=f"g{i}", prefix=f"c{i}")])
    outbox = Outbox(engine, {"webhook": WebhookNotifier(receiver.url)}, claim_batch=2)
    claimed = await outbox.claim()
    assert [row.idempotency_key for row in claimed] == ["c0-0", "c1-0"]
    assert await statuses(engine) == {"sending": 2, "pending": 3}
    await outbox.aclose()


class _Between:
    """A connection that runs `between` right after its first statement: another claimer's
    whole turn placed inside a claim, between its select of the due rows and its update."""

    def __init__(self, conn: AsyncConnection, between: Callable[[], Awaitable[None]]) -> None:
        self._conn = conn
        self._between: Callable[[], Awaitable[None]] | None = between
        self.dialect = conn.dialect

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        result = await self._conn.execute(*args, **kwargs)
        if self._between is not None:
            between, self._between = self._between, None
            await between()
        return result


async def test_a_claim_never_takes_a_row_whose_retry_is_not_due_yet(engine: AsyncEngine) -> None:
    """Two claimers of one channel (the channel's loop and `Outbox.drain` of the demo and the
    tests): while one selects the due rows, the other claims the same row, fails to send it
    and schedules its retry a second later. On SQLite nothing locks the selected rows, so the
    first one's update must check again that they are still due: before, it took the row back
    at once and the retry went out without its back-off (a call retried before an ack could
    stop it; the flake of test_stopping_cancels_a_call_waiting_for_its_retry[sqlite-ack])."""
    t0 = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
    lease = t0 + timedelta(seconds=60)
    async with engine.begin() as conn:
        await insert_notifications(conn, drafts(1), t0)
    taken: dict[str, list[Any]] = {}

    async def other_claimer_tries_and_fails() -> None:
        async with engine.begin() as conn:
            taken["other"] = rows = await claim_notifications(
                conn, "webhook", limit=1, now=t0, worker_id="other", lease_until=lease
            )
        if rows:  # on PostgreSQL the row is locked (SKIP LOCKED): it takes nothing
            retry = SendOutcome(
                rows[0].id,
                PENDING,
                1,
                last_error="RetryableError: HTTP 500",
                next_attempt_at=t0 + timedelta(seconds=1),
                failing_since=t0,
            )
            async with engine.begin() as conn:
                await record_outcomes(conn, "other", [retry], t0)

    async with engine.begin() as conn:
        between = cast(AsyncConnection, _Between(conn, other_claimer_tries_and_fails))
        taken["first"] = await claim_notifications(
            between, "webhook", limit=1, now=t0, worker_id="first", lease_until=lease
        )
    # one claim of the first try; the retry waits for its time
    assert [r.attempts for r in taken["other"] + taken["first"]] == [0]


async def test_a_claimed_batch_is_sent_most_urgent_first(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    items = [
        ranked(f"k{i}", f"alert:{i}", priority)
        for i, priority in enumerate([Priority.P3, Priority.P2, Priority.P0, Priority.P3])
    ]
    await enqueue(engine, items)
    # one claim takes all four; the rate limit lets them out one at a time, in claim order
    outbox = Outbox(
        engine,
        {"webhook": WebhookNotifier(receiver.url)},
        rules=FAST_RETRY,
        rate_limits={"webhook": [(1, 0.05)]},
    )
    await drain(outbox)
    await outbox.aclose()
    assert [body["payload"]["key"] for body in receiver.bodies] == ["k2", "k1", "k0", "k3"]


async def test_a_restart_with_the_same_host_and_pid_releases_the_earlier_runs_leases(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    """A container restarted in place keeps its hostname, and the gateway is PID 1 again:
    rows the crashed run left `sending` go out at once, not after their lease."""
    await enqueue(engine, drafts(2, group="a", prefix="a") + drafts(2, group="b", prefix="b"))
    crashed = Outbox(engine, {"webhook": WebhookNotifier(receiver.url)}, lease_seconds=600)
    assert len(await crashed.claim()) == 2  # the oldest of each group, then "killed"
    restarted = Outbox(engine, {"webhook": WebhookNotifier(receiver.url)}, lease_seconds=600)
    assert restarted.worker_id.split(":")[:2] == crashed.worker_id.split(":")[:2]
    assert await restarted.release_leases_of_earlier_runs() == 2
    await drain(restarted)
    assert receiver.unique == 4 and await statuses(engine) == {"sent": 4}
    await crashed.aclose()
    await restarted.aclose()


async def test_expired_lease_is_taken_over(engine: AsyncEngine, receiver: Receiver) -> None:
    await enqueue(engine, drafts(3))
    now = datetime.now(UTC)
    crashed = Outbox(
        engine,
        {"webhook": WebhookNotifier(receiver.url)},
        worker_id="crashed",
        lease_seconds=30,
        send_deadline=10,
        clock=lambda: now,
    )
    claimed = await crashed.claim()  # claimed, then the worker "dies" before sending
    assert len(claimed) == 1  # one group: only the oldest row may be in flight
    later = now + timedelta(seconds=31)
    survivor = Outbox(
        engine,
        {"webhook": WebhookNotifier(receiver.url)},
        worker_id="survivor",
        clock=lambda: later,
    )
    assert await survivor.claim() == []  # the group is blocked while the lease holds
    await drain(survivor)
    assert receiver.unique == 3 and await statuses(engine) == {"sent": 3}
    await crashed.aclose()
    await survivor.aclose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
async def test_two_replicas_send_each_notification_exactly_once(
    db_url: str, engine: AsyncEngine, receiver: Receiver
) -> None:
    receiver.delay = 0.002
    items = [d for g in range(40) for d in drafts(10, group=f"g{g}", prefix=f"p{g}")]
    await enqueue(engine, items)
    second_engine = create_engine(db_url)
    outboxes = [
        Outbox(
            eng,
            {"webhook": WebhookNotifier(receiver.url)},
            worker_id=f"replica-{i}",
            claim_batch=25,
            rng=random.Random(i),
        )
        for i, eng in enumerate((engine, second_engine))
    ]
    await asyncio.gather(*(drain(o, rounds=2000) for o in outboxes))
    for outbox in outboxes:
        await outbox.aclose()
    await second_engine.dispose()
    assert receiver.unique == 400 and receiver.duplicates == 0
    async with engine.connect() as conn:
        workers = {row.claimed_by for row in await conn.execute(select(notifications.c.claimed_by))}
    assert workers == {None}


def test_gate_math_with_two_limits() -> None:
    """The outbox's per-channel gate with a per-second and a per-minute limit (Feishu's)."""
    window = SlidingWindow([RateLimit(5, 1.0), RateLimit(100, 60.0)], margin=0.0, slack_s=0.0)
    for _ in range(5):
        assert window.delay(0.0) == 0
        window.record(0.0)
    assert window.delay(0.0) == pytest.approx(1.0)
    assert window.delay(1.0) == 0
    for second in range(1, 20):
        for _ in range(5):
            window.record(float(second))
    assert window.delay(20.0) == pytest.approx(40.0)  # 100 in the last minute: wait for the oldest
