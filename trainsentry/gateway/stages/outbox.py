"""The durable outbox: rows written by the intake transaction are sent here by channel.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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
from trainsentry.store.engine import Engine
from trainsentry.store.outbox import (
    CANCELLED,
    DEAD,
    PENDING,
    SENT,
    busy_count,
    claim_notifications,
    next_due_at,
    record_outcomes,
    recover_expired_leases,
    release_earlier_leases,
)
from trainsentry.store.outbox import SendOutcome as _Outcome
from trainsentry.tasks import OwnedTask, wait_for_event

log = logging.getLogger("trainsentry.outbox")


@dataclass(frozen=True, slots=True)
class SendRetry:
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


class Outbox:
    def __init__(
        self,
        engine: Engine,
        notifiers: Mapping[str, Notifier],
        *,
        metrics: GatewayMetrics | None = None,
        worker_id: str | None = None,
        retry: SendRetry | None = None,
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
        self._retry = retry or SendRetry()
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
        self._semaphore = asyncio.Semaphore(concurrency)
        self._clock = clock
        self._rng = rng or random.Random()
        self._wakeup = asyncio.Event()
        self._task = OwnedTask("outbox", self.run)

    def wake(self) -> None:
        self._wakeup.set()

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def run(self) -> None:
        while True:
            try:
                sent_any = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store may be down; keep the loop alive
                log.exception("outbox cycle failed")
                sent_any = False
            if sent_any:
                continue
            self._wakeup.clear()
            timeout = await self._idle_wait()
            await wait_for_event(self._wakeup, timeout)

    async def _idle_wait(self) -> float:
        """Seconds until the next row becomes due (bounded), so retries are not late."""
        try:
            async with self._engine.connect() as conn:
                next_due = await next_due_at(conn)
        except Exception:
            return 1.0
        if next_due is None:
            return 5.0
        return min(5.0, max(0.01, (next_due - self._clock()).total_seconds()))

    async def run_once(self) -> bool:
        """Recovers expired leases, claims due rows, sends them. True if any were claimed."""
        await self.recover_expired_leases()
        claimed = await self.claim()
        if not claimed:
            return False
        # Each outcome is written as soon as its send finishes; outcomes that finish while a
        # write is under way are written together by the next one (group commit). So a crash
        # resends only rows in flight or waiting for that one write, and a burst of fast
        # sends does not cost one transaction each.
        unwritten: list[_Outcome] = []
        writing = asyncio.Lock()

        async def send_and_record(row: OutboundNotification) -> None:
            unwritten.append(await self._deliver(row))
            async with writing:
                if unwritten:
                    batch = unwritten[:]
                    unwritten.clear()
                    await self._record(batch)

        await asyncio.gather(*(send_and_record(row) for row in claimed))
        return True

    async def drain(self, within: float = 30.0) -> None:
        """Sends until nothing is due and nothing is in flight, also in the background worker
        (for the demo and tests, which drive time themselves)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while loop.time() < deadline:
            if await self.run_once():
                continue
            async with self._engine.connect() as conn:
                busy = await busy_count(conn, self._clock())
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
        async with self._engine.begin() as conn:
            released = await release_earlier_leases(conn, self.worker_id)
        if released:
            log.warning("released notifications left sending by an earlier run count=%d", released)
        return released

    async def recover_expired_leases(self) -> int:
        now = self._clock()
        async with self._engine.begin() as conn:
            return await recover_expired_leases(conn, now)

    def _claim_limit(self, channel: str) -> int:
        """How many rows of `channel` to claim now: no more than its rate limits let us send
        well within one lease, so a claimed row never outlives its lease waiting for a token."""
        gate = self._gates.get(channel)
        if gate is None:
            return self._claim_batch
        horizon = self._lease.total_seconds() / 2
        allowed = min(
            max(1, int(limit.count * max(1.0, horizon / limit.per_seconds)))
            for limit in gate.limits
        )
        return min(self._claim_batch, allowed)

    async def claim(self) -> list[OutboundNotification]:
        """Claims due rows of every channel (see `_claim_limit`): most urgent priority first
        ("P0" < "P1" < ... as text), then oldest; within a group strictly in order."""
        now = self._clock()
        rows: list[Any] = []
        async with self._engine.begin() as conn:
            for channel in self._notifiers:
                rows.extend(
                    await claim_notifications(
                        conn,
                        channel,
                        limit=self._claim_limit(channel),
                        now=now,
                        worker_id=self.worker_id,
                        lease_until=now + self._lease,
                    )
                )
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

    async def _deliver(self, row: OutboundNotification) -> _Outcome:
        notifier = self._notifiers[row.channel]
        gate = self._gates.get(row.channel)
        async with self._semaphore:
            slot = await gate.acquire() if gate is not None else None
            assert not isinstance(slot, float)  # max_wait is infinite: it waits, never declines
            started = self._clock()
            try:
                receipt = await notifier.send(row)
            except NotifierError as exc:
                return self._failed(row, exc)
            except Exception as exc:  # a bug in a channel must not stop the outbox
                log.exception("channel=%s id=%d unexpected error", row.channel, row.id)
                return self._failed(row, NotifierError(f"{type(exc).__name__}: {exc}"))
            finally:
                if gate is not None and isinstance(slot, Slot):
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
        async with self._engine.begin() as conn:
            await record_outcomes(conn, self.worker_id, outcomes, self._clock())

    async def aclose(self) -> None:
        await self.stop()
        for notifier in self._notifiers.values():
            await notifier.aclose()
