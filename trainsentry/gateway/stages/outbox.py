"""The durable outbox: rows written by the policy's transaction are sent here by channel.

- Every channel has its own send slots (`slots`, 16 by default) and its own loop, which
  claims no more rows than it has free slots: a slow or rate-limited channel never delays
  another channel's sends, phone calls included.
- Every send has a total deadline (`send_deadline`, 30 s: connect, request and the whole
  answer, body included, for every channel); a send past it is a retryable failure. So an
  endpoint that trickles its answer holds one slot for at most the deadline.
- A row is claimed before it is sent (status `sending`, a lease with our worker id; on
  PostgreSQL `FOR UPDATE SKIP LOCKED`). Leases of rows in hand are renewed every quarter
  lease; a send starts only while its row's lease has more than the deadline left (renewed
  first if not, and skipped if the row was taken back), so no other replica can claim a row
  while it is being sent. A lease that expires (its holder crashed) puts the row back.
- Order is kept per (channel, group_key): a row is only claimed when no older row of its
  group is still pending or being sent.
- A call whose escalation stopped while it was being sent (marked by store/outbox.py
  `cancel_calls`) is never tried again: an attempt that would retry it is written
  `cancelled` in the same transaction (`record_outcomes`), whatever the channel.
- Retries and giving up follow gateway/policy/outbox_retry.py: by elapsed time of failing, not
  by attempts; a rate-limit answer is never a failure. `PermanentError` ends `dead` at once.
- Delivery is at-least-once: a row holds its slot until its outcome is committed, so after a
  crash at most `slots` rows per channel went out without their outcome written, and only
  those are sent again; the idempotency key travels with them for providers that deduplicate.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import Priority, utcnow
from trainsentry.gateway.metrics import GatewayMetrics
from trainsentry.gateway.policy.outbox_retry import DeliveryRules, after_failure, after_rate_limit
from trainsentry.gateway.stages.outbox_workers import default_worker_id, earlier_run
from trainsentry.notifiers.base import (
    Notifier,
    NotifierError,
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    RetryableError,
    Withdrawn,
)
from trainsentry.notifiers.phone.notifier import CANCELLED_MARK
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
    release_leases,
    renew_leases,
    requeue_dead,
    sending_claimers,
)
from trainsentry.store.outbox import SendOutcome as _Outcome
from trainsentry.tasks import OwnedTask, wait_for_event

log = logging.getLogger("trainsentry.outbox")
# How long a busy channel's loop waits for more free slots before claiming again.
CLAIM_COALESCE_SECONDS = 0.02


@dataclass(slots=True)
class _Claimed:
    """A row in hand: what the channel gets, the failing streak so far, our lease's end."""

    row: OutboundNotification
    failing_since: datetime | None
    lease_until: datetime


class _Lane:
    """One channel's send slots and wake-up signal."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self.changed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def take(self, count: int) -> None:
        self.free -= count

    def give(self) -> None:
        self.free += 1
        self.changed.set()


class Outbox:
    def __init__(
        self,
        engine: Engine,
        notifiers: Mapping[str, Notifier],
        *,
        metrics: GatewayMetrics | None = None,
        worker_id: str | None = None,
        rules: DeliveryRules | None = None,
        rate_limits: Mapping[str, list[tuple[int, float]]] | None = None,
        lease_seconds: float = 60.0,
        send_deadline: float = 30.0,
        slots: int = 16,
        claim_batch: int | None = None,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < send_deadline < lease_seconds:
            raise ValueError("the send deadline must be shorter than the lease")
        self._engine = engine
        self._notifiers = dict(notifiers)
        self._metrics = metrics
        self.worker_id = worker_id or default_worker_id()
        self.rules = rules or DeliveryRules()
        # The channels' own gate (notifiers/ratelimit.py): a send counts from its answer, so
        # the provider never sees more than the limit, however late a request arrives there.
        # The outbox waits for its turn rather than giving up (max_wait).
        self._gates = {
            channel: RateGate([RateLimit(c, s) for c, s in limits if c > 0], max_wait=math.inf)
            for channel, limits in (rate_limits or {}).items()
            if any(c > 0 for c, _ in limits)
        }
        self._lease = timedelta(seconds=lease_seconds)
        self._deadline = send_deadline
        self._claim_batch = claim_batch or slots
        self._slots = slots
        self._lanes = {channel: _Lane(slots) for channel in self._notifiers}
        self._held: dict[int, _Claimed] = {}  # rows in hand, for lease renewal
        self._clock = clock
        self._rng = rng or random.Random()
        self._unwritten: list[_Outcome] = []
        self._writing = asyncio.Lock()
        self._task = OwnedTask("outbox", self.run)

    def wake(self) -> None:
        for lane in self._lanes.values():
            lane.changed.set()

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def run(self) -> None:
        """One loop per channel, and one that renews our leases and recovers expired ones."""
        loops = [self._lane_loop(channel) for channel in self._lanes]
        try:
            await asyncio.gather(self._lease_loop(), *loops)
        finally:
            for lane in self._lanes.values():
                for task in list(lane.tasks):
                    task.cancel()
                await asyncio.gather(*lane.tasks, return_exceptions=True)

    async def _lane_loop(self, channel: str) -> None:
        lane = self._lanes[channel]
        while True:
            lane.changed.clear()
            claimed: list[_Claimed] = []
            if 0 < lane.free < self._slots // 2:
                # Most slots busy (a burst): let a few more free up, so one claim takes
                # several rows instead of one transaction per row.
                await asyncio.sleep(CLAIM_COALESCE_SECONDS)
            if lane.free > 0:
                try:
                    claimed = await self._claim_channel(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the store may be down; keep the loop alive
                    log.exception("outbox claim failed channel=%s", channel)
            for item in claimed:
                task = asyncio.create_task(self._send_one(item))
                lane.tasks.add(task)
                task.add_done_callback(lane.tasks.discard)
            if claimed and lane.free > 0:
                continue  # there may be more due rows than one claim took
            await wait_for_event(lane.changed, await self._idle_wait(channel, lane))

    async def _idle_wait(self, channel: str, lane: _Lane) -> float:
        """Seconds until the channel's next row becomes due (bounded), so retries are not
        late; a lane without free slots waits for one (a finished send sets `changed`)."""
        if lane.free <= 0:
            return 5.0
        try:
            async with self._engine.connect() as conn:
                next_due = await next_due_at(conn, channel)
        except Exception:
            return 1.0
        if next_due is None:
            return 5.0
        return min(5.0, max(0.01, (next_due - self._clock()).total_seconds()))

    async def _lease_loop(self) -> None:
        """Every quarter lease: renew the leases of the rows in hand, recover expired ones."""
        while True:
            try:
                await self.renew_leases()
                await self.recover_expired_leases()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outbox lease upkeep failed")
            await asyncio.sleep(self._lease.total_seconds() / 4)

    async def renew_leases(self, ids: Sequence[int] | None = None) -> set[int]:
        """Extends our lease on the rows in hand (or `ids` of them); returns those still ours.
        A row another replica took back is dropped from our hands."""
        wanted = [i for i in (self._held if ids is None else ids) if i in self._held]
        if not wanted:
            return set()
        until = self._clock() + self._lease
        async with self._engine.begin() as conn:
            held = await renew_leases(conn, self.worker_id, wanted, until)
        for row_id in wanted:
            item = self._held.get(row_id)
            if item is None:
                continue
            if row_id in held:
                item.lease_until = until
            else:
                log.warning("notification taken back by another replica id=%d", row_id)
        return held

    async def run_once(self) -> bool:
        """Recovers expired leases, claims due rows of every channel (up to its free slots)
        and sends them, waiting for all. True if any were claimed."""
        await self.recover_expired_leases()
        claimed = await self._claim_all()
        if not claimed:
            return False
        await asyncio.gather(*(self._send_one(item) for item in claimed))
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
        """At start: rows an earlier run of this gateway left `sending` are pending again.

        With SQLite there is one gateway, so every `sending` row is ours. On PostgreSQL only
        rows claimed from this host by an earlier run are released: a claimer with our PID (a
        restarted container keeps its pod's hostname and runs the gateway as PID 1 again) or
        with a PID no live process has. A live replica on the same host keeps its rows, and
        a vanished replica's rows wait for their lease to expire.
        """
        async with self._engine.begin() as conn:
            found = await sending_claimers(conn, self.worker_id.split(":", 1)[0])  # None: SQLite
            claimers = found and [c for c in found if c != self.worker_id and earlier_run(c)]
            released = await release_leases(conn, self.worker_id, claimers)
        if released:
            log.warning("released notifications left sending by an earlier run count=%d", released)
        return released

    async def recover_expired_leases(self) -> int:
        now = self._clock()
        async with self._engine.begin() as conn:
            return await recover_expired_leases(conn, now)

    async def retry_dead(
        self,
        *,
        by: str,
        ids: Sequence[int] | None = None,
        channel: str | None = None,
        created_since: datetime | None = None,
    ) -> list[int]:
        """Re-sends dead rows matching the filters (audited: `by`, now); returns their ids."""
        async with self._engine.begin() as conn:
            requeued = await requeue_dead(
                conn,
                ids=ids,
                channel=channel,
                created_since=created_since,
                by=by,
                now=self._clock(),
            )
        if requeued:
            log.warning("dead notifications re-sent by=%r count=%d", by, len(requeued))
            self.wake()
        return requeued

    def _claim_limit(self, channel: str) -> int:
        """How many rows of `channel` to claim now: no more than its free slots, and no more
        than its rate limits let us send well within one lease, so a claimed row never
        outlives its lease waiting for a token."""
        limit = min(self._claim_batch, self._lanes[channel].free)
        gate = self._gates.get(channel)
        if gate is None:
            return limit
        horizon = self._lease.total_seconds() / 2
        allowed = min(
            max(1, int(limit.count * max(1.0, horizon / limit.per_seconds)))
            for limit in gate.limits
        )
        return min(limit, allowed)

    async def _claim_channel(self, channel: str) -> list[_Claimed]:
        limit = self._claim_limit(channel)
        if limit <= 0:
            return []
        now = self._clock()
        lease_until = now + self._lease
        async with self._engine.begin() as conn:
            rows = await claim_notifications(
                conn,
                channel,
                limit=limit,
                now=now,
                worker_id=self.worker_id,
                lease_until=lease_until,
            )
        self._lanes[channel].take(len(rows))
        claimed = sorted(
            (_claimed(row, lease_until) for row in rows),
            # at most one row per group is claimed, so this keeps each group's order
            key=lambda c: (c.row.priority.level, c.row.id),
        )
        for item in claimed:
            self._held[item.row.id] = item
        return claimed

    async def claim(self) -> list[OutboundNotification]:
        """Claims due rows of every channel (see `_claim_limit`): most urgent priority first
        ("P0" < "P1" < ... as text), then oldest; within a group strictly in order."""
        return [item.row for item in await self._claim_all()]

    async def _claim_all(self) -> list[_Claimed]:
        claimed: list[_Claimed] = []
        for channel in self._lanes:
            claimed.extend(await self._claim_channel(channel))
        return sorted(claimed, key=lambda c: (c.row.priority.level, c.row.id))

    async def _send_one(self, item: _Claimed) -> None:
        """Sends one claimed row and commits its outcome; its slot is held until then."""
        lane = self._lanes[item.row.channel]
        try:
            outcome = await self._deliver(item)
            if outcome is not None:
                await self._record(outcome)
        except asyncio.CancelledError:
            raise
        except Exception:  # the store may be down: the row comes back after its lease
            log.exception("outbox could not record id=%d", item.row.id)
        finally:
            self._held.pop(item.row.id, None)
            lane.give()

    async def _still_ours(self, item: _Claimed) -> bool:
        """True when the row's lease outlasts a whole send (renewing it first if needed)."""
        margin = timedelta(seconds=self._deadline + 1.0)
        if item.lease_until - self._clock() > margin:
            return True
        return item.row.id in await self.renew_leases([item.row.id])

    async def _deliver(self, item: _Claimed) -> _Outcome | None:
        row = item.row
        notifier = self._notifiers[row.channel]
        gate = self._gates.get(row.channel)
        slot = await gate.acquire() if gate is not None else None
        assert not isinstance(slot, float)  # max_wait is infinite: it waits, never declines
        try:
            if not await self._still_ours(item):
                return None  # another replica took it back: it sends it, not us
            started = self._clock()
            try:
                async with asyncio.timeout(self._deadline):
                    receipt = await notifier.send(row)
            except TimeoutError:
                return self._failed(
                    item, RetryableError(f"no answer within the {self._deadline:g} s deadline")
                )
            except NotifierError as exc:
                return self._failed(item, exc)
            except Exception as exc:  # a bug in a channel must not stop the outbox
                log.exception("channel=%s id=%d unexpected error", row.channel, row.id)
                return self._failed(item, NotifierError(f"{type(exc).__name__}: {exc}"))
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

    def _failed(self, item: _Claimed, exc: NotifierError) -> _Outcome:
        """The outcome of a failed try (gateway/policy/outbox_retry.py decides retry or dead)."""
        row, now = item.row, self._clock()
        attempts, error = row.attempts + 1, f"{type(exc).__name__}: {exc}"[:2000]
        if isinstance(exc, Withdrawn):
            log.info("notification withdrawn channel=%s id=%d: %s", row.channel, row.id, exc)
            label, verdict = "cancelled", None
        elif isinstance(exc, RateLimitedError):
            label = "rate_limited"
            verdict = after_rate_limit(item.failing_since, now, exc.retry_after, self.rules)
        else:
            jitter = self._rng.random()
            verdict = after_failure(row.priority, item.failing_since, now, self.rules, jitter)
            label = "dead" if verdict.dead or isinstance(exc, PermanentError) else "retry"
        if self._metrics is not None:
            self._metrics.sends.labels(row.channel, label).inc()
        if verdict is None:
            return _Outcome(row.id, CANCELLED, attempts, last_error=error)
        since = verdict.failing_since
        if label == "dead":
            log.error(
                "notification dead channel=%s id=%d attempts=%d failing_for=%.0fs error=%r",
                *(row.channel, row.id, attempts, (now - (since or now)).total_seconds(), error),
            )
            return _Outcome(row.id, DEAD, attempts, last_error=error, failing_since=since)
        retry_at = verdict.retry_at or now
        log.warning(
            "notification retry channel=%s id=%d attempts=%d in=%.2fs error=%r",
            *(row.channel, row.id, attempts, (retry_at - now).total_seconds(), error),
        )
        return _Outcome(
            row.id,
            PENDING,
            attempts,
            last_error=error,
            next_attempt_at=retry_at,
            failing_since=since,
        )

    async def _record(self, outcome: _Outcome) -> None:
        """Writes `outcome` (only for a row we still own). Outcomes that finish while a write
        is under way are written together by the next one (group commit), so a burst of fast
        sends does not cost one transaction each; each returns once its own is committed."""
        self._unwritten.append(outcome)
        async with self._writing:
            if not self._unwritten:
                return  # written by the write that held the lock before us
            batch = self._unwritten[:]
            self._unwritten.clear()
            async with self._engine.begin() as conn:
                withdrawn = await record_outcomes(
                    conn, self.worker_id, batch, self._clock(), withdrawn_mark=CANCELLED_MARK
                )
        for row_id in withdrawn:
            item = self._held.get(row_id)
            channel = item.row.channel if item is not None else "?"
            log.info("notification withdrawn while being sent channel=%s id=%d", channel, row_id)
            if self._metrics is not None and item is not None:
                self._metrics.sends.labels(channel, "cancelled").inc()

    async def aclose(self) -> None:
        await self.stop()
        for notifier in self._notifiers.values():
            await notifier.aclose()


def _claimed(row: Any, lease_until: datetime) -> _Claimed:
    return _Claimed(
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
        ),
        row.failing_since,
        lease_until,
    )
