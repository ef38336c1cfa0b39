"""The durable outbox: rows written by the intake transaction are sent here by channel.

- Each channel has its own loop, which claims a row only when it can send it at once: a send
  slot of that channel is free and, on a rate-limited channel, the limit's next turn has come.
  So a slow or rate-limited channel never delays another, the most urgent due row is the next
  one claimed (not queued behind a claimed backlog), and a lease covers a send, not a wait.
- A row is claimed before it is sent (status `sending`, a lease with our worker id). On
  PostgreSQL the claim uses `FOR UPDATE SKIP LOCKED`, so with several gateway replicas each
  row is sent by exactly one of them. A lease that expires (the sender crashed) puts the row
  back to `pending`.
- Order is kept per (channel, group_key): a row is only claimed when no older row of its group
  is still pending or being sent.
- Failures are retried with exponential backoff and full jitter; `RateLimitedError` waits at
  least what the provider asked; `PermanentError` and `max_attempts` failures end as `dead`.
- Delivery is at-least-once: a crash between a provider's answer and our commit resends the
  rows whose outcome was not written yet (those in flight or waiting for the current write);
  the idempotency key travels with them for providers that deduplicate.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Row, and_, bindparam, exists, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.alerts import Priority, utcnow
from trainsentry.gateway.metrics import GatewayMetrics
from trainsentry.notifiers.base import (
    Notifier,
    NotifierError,
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    Withdrawn,
)
from trainsentry.notifiers.ratelimit import RateGate, RateLimit, Slot
from trainsentry.store.schema import notifications
from trainsentry.tasks import OwnedTask

log = logging.getLogger("trainsentry.outbox")

PENDING, SENDING, SENT, DEAD = "pending", "sending", "sent", "dead"
# A notification withdrawn before it went out (a stopped escalation's call): final, no failure.
CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What happened to one claimed row; written back in bulk by `_record`."""

    id: int
    status: str
    attempts: int
    sent_at: datetime | None = None
    provider_id: str | None = None
    last_error: str | None = None
    next_attempt_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 8
    base_delay: float = 1.0
    max_delay: float = 300.0

    def delay(self, attempts: int, rng: random.Random) -> float:
        """Full-jitter exponential backoff for the attempt that just failed (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** (attempts - 1)))
        return rng.uniform(ceiling / 2, ceiling)


def default_worker_id() -> str:
    """`host:pid:nonce`. The nonce tells runs apart that share host and pid: a restarted
    container keeps its pod's hostname and runs the gateway as PID 1 again."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


T = TypeVar("T")


async def _uncut(operation: Awaitable[T]) -> T:
    """Runs a store operation that a cancellation (stop) does not cut off midway: it finishes,
    then the cancellation goes on. An aiosqlite query cancelled midway leaves a connection
    SQLAlchemy cannot close, and the event loop hangs when it closes."""
    task = asyncio.ensure_future(operation)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        raise


def _blocked_by_older() -> Any:
    """True for a row of which an older row of its (channel, group) is pending or in flight."""
    older = notifications.alias("older")
    return exists().where(
        and_(
            older.c.channel == notifications.c.channel,
            older.c.group_key == notifications.c.group_key,
            older.c.id < notifications.c.id,
            older.c.status.in_((PENDING, SENDING)),
        )
    )


class Outbox:
    def __init__(
        self,
        engine: AsyncEngine,
        notifiers: Mapping[str, Notifier],
        *,
        metrics: GatewayMetrics | None = None,
        worker_id: str | None = None,
        retry: RetryPolicy | None = None,
        rate_limits: Mapping[str, list[tuple[int, float]]] | None = None,
        lease_seconds: float = 60.0,
        claim_batch: int = 200,
        concurrency: int = 16,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self._engine = engine
        self._notifiers = dict(notifiers)
        self._metrics = metrics
        self.worker_id = worker_id or default_worker_id()
        self._retry = retry or RetryPolicy()
        # The channels' own gate (notifiers/ratelimit.py): a send counts from its answer, so
        # the provider never sees more than the limit, however late a request arrives there.
        # The outbox waits for its turn rather than giving up (max_wait).
        self._gates = {
            channel: RateGate([RateLimit(c, s) for c, s in limits if c > 0], max_wait=math.inf)
            for channel, limits in (rate_limits or {}).items()
            if any(c > 0 for c, _ in limits)
        }
        self._lease = timedelta(seconds=lease_seconds)
        self._claim_batch = claim_batch
        self._concurrency = concurrency  # sends in flight, per channel
        self._clock = clock
        self._rng = rng or random.Random()
        self._wakeups = {channel: asyncio.Event() for channel in self._notifiers}
        # Each outcome is written as soon as its send finishes; outcomes that finish while a
        # write is under way are written together by the next one (group commit). So a crash
        # resends only rows in flight or waiting for that one write, and a burst of fast
        # sends does not cost one transaction each.
        self._unwritten: list[_Outcome] = []
        self._writing = asyncio.Lock()
        self._task = OwnedTask("outbox", self.run)

    def wake(self) -> None:
        for wakeup in self._wakeups.values():
            wakeup.set()

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def run(self) -> None:
        """One loop per channel (`_serve`), and one that recovers expired leases."""

        async def serve(channel: str) -> None:
            while True:
                try:
                    await self._serve(channel)
                except Exception:  # a bug must not end the channel's loop
                    log.exception("outbox loop failed channel=%s", channel)
                    await asyncio.sleep(1.0)

        async def recover() -> None:
            while True:
                try:
                    if await _uncut(self.recover_expired_leases()):
                        self.wake()
                except Exception:  # the store may be down; keep the loop alive
                    log.exception("outbox lease recovery failed")
                await asyncio.sleep(5.0)  # leases last a minute

        await asyncio.gather(recover(), *(serve(channel) for channel in self._notifiers))

    async def run_once(self) -> bool:
        """Recovers expired leases, then claims and sends every channel's due rows until none
        is due or in flight. True if any were claimed."""
        await self.recover_expired_leases()
        served = await asyncio.gather(
            *(self._serve(channel, until_idle=True) for channel in self._notifiers)
        )
        return any(served)

    async def _serve(self, channel: str, *, until_idle: bool = False) -> bool:
        """Claims and sends `channel`'s rows, each as soon as it can go out: while fewer than
        `concurrency` of its sends are in flight and, on a rate-limited channel, one row per
        turn of the limit, claimed once the turn has come. Nothing claimed waits behind a
        backlog, so a P0 written meanwhile is the next row claimed, and a lease covers a send,
        not a wait for a token. Runs forever; with `until_idle`, until nothing is due or in
        flight (True if it claimed anything)."""
        gate = self._gates.get(channel)
        wakeup = self._wakeups[channel]
        sends: set[asyncio.Task[None]] = set()
        claimed_any = False
        try:
            while True:
                if len(sends) >= self._concurrency:
                    await asyncio.wait(sends, return_when=asyncio.FIRST_COMPLETED)
                    continue
                wakeup.clear()
                slot: Slot | None = None
                rows: list[OutboundNotification] = []
                try:
                    if gate is None:
                        free = min(self._claim_batch, self._concurrency - len(sends))
                        rows = await _uncut(self.claim({channel: free}))
                    elif await _uncut(self._next_due(channel)) == 0.0:
                        turn = await gate.acquire()
                        assert isinstance(turn, Slot)  # max_wait is infinite: it waits
                        slot = turn
                        try:
                            rows = await _uncut(self.claim({channel: 1}))  # the most urgent now
                        finally:
                            if not rows:  # another replica took it: the turn is spent
                                gate.done(slot)
                except Exception:  # the store may be down; keep the loop alive
                    log.exception("outbox claim failed channel=%s", channel)
                for row in rows:
                    task = asyncio.create_task(self._send_and_record(row, slot))
                    sends.add(task)
                    task.add_done_callback(sends.discard)
                if rows:
                    claimed_any = True
                    continue
                if until_idle and not sends:
                    return claimed_any
                # Nothing to claim: wait for a new row (wake), a send's end (it may unblock the
                # next row of its group) or the next row's due time.
                woken = asyncio.create_task(wakeup.wait())
                try:
                    await asyncio.wait(
                        {woken, *sends},
                        timeout=await self._idle_wait(channel),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    woken.cancel()
        finally:  # cancelled (stop): the sends in flight end with it, their rows left `sending`
            for task in sends:
                task.cancel()
            await asyncio.gather(*sends, return_exceptions=True)

    async def _send_and_record(self, row: OutboundNotification, slot: Slot | None) -> None:
        self._unwritten.append(await self._deliver(row, slot))
        async with self._writing:
            if not self._unwritten:
                return
            batch = self._unwritten[:]
            self._unwritten.clear()
            try:
                await _uncut(self._record(batch))
            except Exception:  # the rows stay `sending` until their lease expires, then resent
                log.exception("outbox could not record outcomes count=%d", len(batch))

    async def _next_due(self, channel: str) -> float | None:
        """Seconds until `channel`'s next claimable row is due (0.0: now), None if none is."""
        async with self._engine.connect() as conn:
            next_due = (
                await conn.execute(
                    select(func.min(notifications.c.next_attempt_at)).where(
                        notifications.c.status == PENDING,
                        notifications.c.channel == channel,
                        ~_blocked_by_older(),
                    )
                )
            ).scalar()
        if not isinstance(next_due, datetime):
            return None
        return max(0.0, (next_due - self._clock()).total_seconds())

    async def _idle_wait(self, channel: str) -> float:
        """Seconds to wait for `channel`'s next row, bounded: rows that another replica's send
        holds back are noticed within a second."""
        try:
            next_due = await _uncut(self._next_due(channel))
        except Exception:
            return 1.0
        return 1.0 if next_due is None else min(1.0, max(0.01, next_due))

    async def drain(self, within: float = 30.0) -> None:
        """Sends until nothing is due and nothing is in flight, also in the background worker
        (for the demo and tests, which drive time themselves)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            if await self.run_once():
                continue
            async with self._engine.connect() as conn:
                busy = (
                    await conn.execute(
                        select(func.count()).where(
                            (notifications.c.status == SENDING)
                            | (
                                (notifications.c.status == PENDING)
                                & (notifications.c.next_attempt_at <= self._clock())
                            )
                        )
                    )
                ).scalar()
            if not busy:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError(f"the outbox did not drain within {within} s")

    async def release_leases_of_earlier_runs(self) -> int:
        """At start: rows a previous run of this gateway left `sending` are pending again.

        With SQLite there is one gateway, so every `sending` row is ours. On PostgreSQL only
        rows claimed from this host (a restarted container keeps its pod's hostname) are
        released; a vanished replica's rows wait for their lease to expire.
        """
        query = update(notifications).where(
            notifications.c.status == SENDING, notifications.c.claimed_by != self.worker_id
        )
        if self._engine.dialect.name != "sqlite":
            host = self.worker_id.split(":", 1)[0]
            query = query.where(notifications.c.claimed_by.like(f"{host}:%"))
        async with self._engine.begin() as conn:
            result = await conn.execute(
                query.values(status=PENDING, claimed_by=None, claimed_until=None)
            )
        released = int(result.rowcount or 0)
        if released:
            log.warning("released notifications left sending by an earlier run count=%d", released)
        return released

    async def recover_expired_leases(self) -> int:
        now = self._clock()
        expired = (notifications.c.status == SENDING) & (notifications.c.claimed_until < now)
        # Look first: an UPDATE takes SQLite's write lock (waiting up to its busy timeout)
        # even when it changes nothing, and the outbox asks every few seconds.
        async with self._engine.connect() as conn:
            found = (await conn.execute(select(notifications.c.id).where(expired).limit(1))).first()
        if found is None:
            return 0
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(notifications)
                .where(expired)
                .values(status=PENDING, claimed_by=None, claimed_until=None, next_attempt_at=now)
            )
        return int(result.rowcount or 0)

    async def claim(self, limits: Mapping[str, int] | None = None) -> list[OutboundNotification]:
        """Claims due rows: up to `limits[channel]` of each channel named there (by default
        `claim_batch` of every channel); most urgent priority first ("P0" < "P1" < ... as
        text), then oldest; within a group strictly in order."""
        now = self._clock()
        if limits is None:
            limits = dict.fromkeys(self._notifiers, self._claim_batch)
        blocked_by_older = _blocked_by_older()
        rows: list[Row[Any]] = []
        async with self._engine.begin() as conn:
            for channel, limit in limits.items():
                if limit <= 0:
                    continue
                due = (
                    select(notifications.c.id)
                    .where(
                        notifications.c.status == PENDING,
                        notifications.c.channel == channel,
                        notifications.c.next_attempt_at <= now,
                        ~blocked_by_older,
                    )
                    # a rate-limited channel's backlog of P3 cards must not hold back a P0
                    .order_by(notifications.c.priority, notifications.c.id)
                    .limit(limit)
                )
                if conn.dialect.name == "postgresql":
                    due = due.with_for_update(skip_locked=True, of=notifications)
                # Ids first, then the update: as a subquery of the UPDATE, PostgreSQL may run
                # the LIMIT ... SKIP LOCKED select more than once and claim past the limit.
                ids = (await conn.execute(due)).scalars().all()
                if not ids:
                    continue
                stmt = (
                    update(notifications)
                    .where(notifications.c.id.in_(ids))
                    .where(notifications.c.status == PENDING)
                    .values(
                        status=SENDING, claimed_by=self.worker_id, claimed_until=now + self._lease
                    )
                    .returning(*notifications.c)
                )
                rows.extend((await conn.execute(stmt)).all())
        return sorted(
            (
                OutboundNotification(
                    id=int(row.id),
                    channel=row.channel,
                    kind=row.kind,
                    priority=Priority(row.priority),
                    payload=dict(row.payload),
                    idempotency_key=row.idempotency_key,
                    group_key=row.group_key,
                    created_at=row.created_at,
                    attempts=int(row.attempts),
                )
                for row in rows
            ),
            # at most one row per group is claimed, so this keeps each group's order
            key=lambda n: (n.priority.level, n.id),
        )

    async def _deliver(self, row: OutboundNotification, slot: Slot | None) -> _Outcome:
        """Sends `row`; `slot` is its turn of the channel's rate limit (taken before the claim)."""
        notifier = self._notifiers[row.channel]
        gate = self._gates.get(row.channel)
        started = self._clock()
        try:
            receipt = await notifier.send(row)
        except NotifierError as exc:
            return self._failed(row, exc)
        except Exception as exc:  # a bug in a channel must not stop the outbox
            log.exception("channel=%s id=%d unexpected error", row.channel, row.id)
            return self._failed(row, NotifierError(f"{type(exc).__name__}: {exc}"))
        finally:
            if gate is not None and slot is not None:
                gate.done(slot)
        if self._metrics is not None:
            self._metrics.sends.labels(row.channel, "sent").inc()
            self._metrics.send_latency.labels(row.channel).observe(
                (self._clock() - started).total_seconds()
            )
        return _Outcome(
            row.id,
            SENT,
            row.attempts + 1,
            sent_at=self._clock(),
            provider_id=receipt.provider_id,
        )

    def _failed(self, row: OutboundNotification, exc: NotifierError) -> _Outcome:
        attempts = row.attempts + 1
        error = f"{type(exc).__name__}: {exc}"[:2000]
        if isinstance(exc, Withdrawn):
            log.info("notification withdrawn channel=%s id=%d: %s", row.channel, row.id, exc)
            outcome = _Outcome(row.id, CANCELLED, attempts, last_error=error)
            label = "cancelled"
        elif isinstance(exc, PermanentError) or attempts >= self._retry.max_attempts:
            log.error(
                "notification dead channel=%s id=%d attempts=%d error=%r",
                row.channel,
                row.id,
                attempts,
                error,
            )
            outcome = _Outcome(row.id, DEAD, attempts, last_error=error)
            label = "dead"
        else:
            delay = self._retry.delay(attempts, self._rng)
            if isinstance(exc, RateLimitedError) and exc.retry_after is not None:
                delay = max(delay, exc.retry_after)
            log.warning(
                "notification retry channel=%s id=%d attempts=%d in=%.2fs error=%r",
                row.channel,
                row.id,
                attempts,
                delay,
                error,
            )
            outcome = _Outcome(
                row.id,
                PENDING,
                attempts,
                last_error=error,
                next_attempt_at=self._clock() + timedelta(seconds=delay),
            )
            label = "rate_limited" if isinstance(exc, RateLimitedError) else "retry"
        if self._metrics is not None:
            self._metrics.sends.labels(row.channel, label).inc()
        return outcome

    async def _record(self, outcomes: list[_Outcome]) -> None:
        """Writes the outcomes of one claimed batch in one transaction (only rows we still own)."""
        if not outcomes:
            return
        now = self._clock()
        stmt = (
            update(notifications)
            .where(
                notifications.c.id == bindparam("b_id"),
                notifications.c.claimed_by == self.worker_id,
            )
            .values(
                status=bindparam("b_status"),
                attempts=bindparam("b_attempts"),
                sent_at=bindparam("b_sent_at"),
                provider_id=bindparam("b_provider_id"),
                # a success keeps the last error, for the record of why it took several tries
                last_error=func.coalesce(bindparam("b_last_error"), notifications.c.last_error),
                next_attempt_at=bindparam("b_next"),
                claimed_by=None,
                claimed_until=None,
            )
        )
        params = [
            {
                "b_id": o.id,
                "b_status": o.status,
                "b_attempts": o.attempts,
                "b_sent_at": o.sent_at,
                "b_provider_id": o.provider_id,
                "b_last_error": o.last_error,
                "b_next": o.next_attempt_at or now,
            }
            for o in outcomes
        ]
        async with self._engine.begin() as conn:
            await conn.execute(stmt, params)

    async def aclose(self) -> None:
        await self.stop()
        for notifier in self._notifiers.values():
            await notifier.aclose()
