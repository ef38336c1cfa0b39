"""The retention stage: every `retention.interval_seconds` it measures the store, deletes the
finished rows older than their retention (store/retention.py) in bounded batches, and
measures again (with `retention.enabled: false` it only measures).

Each batch is its own short transaction (it looks at most at `batch_size` rows of one kind,
the next ones by time) followed by a pause of `pause_seconds`, so the intake's writes wait at
most one batch, however much there is to delete. A kind is done for the run once a batch
finds fewer than `batch_size` old rows to look at. Failures are logged
and retried at the next interval; nothing else waits for this stage. With several replicas on
one PostgreSQL each runs it; their batches take disjoint rows (SKIP LOCKED).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime, timedelta

from trainsentry.alerts import utcnow
from trainsentry.config import RetentionSettings
from trainsentry.gateway.metrics import GatewayMetrics
from trainsentry.store.callbacks import KEEP as CALLBACK_EVENTS_KEEP
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.retention import (
    After,
    Batch,
    Purged,
    StoreSize,
    batch_transaction,
    purge_alerts,
    purge_callback_events,
    purge_notifications,
    purge_receipts,
    store_size,
)
from trainsentry.tasks import OwnedTask, every

log = logging.getLogger("trainsentry.retention")

Purge = Callable[[Connection, datetime, int, After | None], Awaitable[Batch]]


class Retention:
    """Purges the store in bounded batches and keeps the store-size metrics current."""

    def __init__(
        self,
        engine: Engine,
        settings: RetentionSettings,
        *,
        metrics: GatewayMetrics,
        clock: Callable[[], datetime] = utcnow,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        # The policy's lock: on SQLite the planning stage reads before it takes the write
        # lock, so an alert must not vanish between its reads and its writes.
        self._lock = lock
        interval = settings.interval_seconds
        failed = f"retention run failed; trying again in {interval:.0f} s"
        self._task = OwnedTask("retention", lambda: every(interval, self.run_once, log, failed))

    def _cuts(self, now: datetime) -> list[tuple[str, Purge, datetime]]:
        s = self._settings
        return [
            ("alerts", purge_alerts, now - timedelta(days=s.alerts_days)),
            ("notifications", purge_notifications, now - timedelta(days=s.notifications_days)),
            ("receipts", purge_receipts, now - timedelta(days=s.receipts_days)),
            ("callback_events", purge_callback_events, now - CALLBACK_EVENTS_KEEP),
        ]

    async def measure(self) -> StoreSize | None:
        """Reads the store's size into the metrics."""
        size = await store_size(self._engine)
        if size is not None:
            self._metrics.record_store_size(size)
        return size

    async def purge(self, now: datetime | None = None) -> Purged:
        """Deletes everything due at `now` (default: the clock), batch by batch."""
        now = now or self._clock()
        total = Purged()
        for _kind, purge, before in self._cuts(now):
            after: After | None = None
            while True:
                batch = await self._batch(purge, before, after)
                total = _add(total, batch.purged)
                if batch.examined < self._settings.batch_size:
                    break  # nothing older is left to look at in this run
                after = batch.after
                await asyncio.sleep(self._settings.pause_seconds)
        return total

    async def _batch(self, purge: Purge, before: datetime, after: After | None) -> Batch:
        guard: AbstractAsyncContextManager[object] = self._lock or nullcontext()
        async with guard, batch_transaction(self._engine) as conn:
            batch = await purge(conn, before, self._settings.batch_size, after)
        self._metrics.record_purged(batch.purged)
        return batch

    async def run_once(self, now: datetime | None = None) -> Purged:
        """Measures the store and, unless retention is disabled, purges it."""
        await self.measure()
        if not self._settings.enabled:
            return Purged()
        done = await self.purge(now)
        if done.total():
            log.info(
                "retention purged receipts=%d alerts=%d events=%d notifications=%d "
                "callback_events=%d",
                done.receipts,
                done.alerts,
                done.alert_events,
                done.notifications,
                done.callback_events,
            )
            await self.measure()
        return done

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()


def _add(a: Purged, b: Purged) -> Purged:
    return Purged(
        receipts=a.receipts + b.receipts,
        alerts=a.alerts + b.alerts,
        alert_events=a.alert_events + b.alert_events,
        notifications=a.notifications + b.notifications,
        callback_events=a.callback_events + b.callback_events,
    )
