"""Runs the alert policy over the changes the intake committed (the policy inbox).

The intake answers Alertmanager as soon as the alerts and their events are on disk; the policy
(classification, dedup, storms, routing, outbox rows) follows in its own transaction, woken by
the intake's commit and, as a fallback, by a poll (a restart or another replica's intake).
Claiming, planning and deleting inbox rows happen in one transaction, so a crash at any point
leaves each change either unplanned (it is planned after the restart) or planned with its
notifications written — never both, never neither.

Batches are bounded and the worker yields between them, so a storm's backlog is worked off
while new webhooks keep being answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.alerts import AlertChange, utcnow
from trainsentry.gateway.intake import PlanHook
from trainsentry.store.inbox import claim_inbox, clear_inbox
from trainsentry.tasks import OwnedTask

log = logging.getLogger("trainsentry.policy")


class PolicyWorker:
    def __init__(
        self,
        engine: AsyncEngine,
        plan: PlanHook,
        *,
        # ~60 ms of policy per batch here: with 1,000 the intake answered half as many alerts/s
        # during a storm for the same planning rate (bench/bench_intake.py).
        batch: int = 250,
        poll_interval: float = 1.0,
        on_planned: Callable[[Sequence[AlertChange], int], None] | None = None,
        clock: Callable[[], datetime] = utcnow,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self._engine = engine
        # One policy transaction at a time in this process (shared with the ticker): SQLite
        # reads the inbox before taking its write lock, so two claims could take the same rows.
        self._lock = lock or asyncio.Lock()
        self._plan = plan
        self._batch = batch
        self._poll_interval = poll_interval
        self._on_planned = on_planned
        self._clock = clock
        self._wake = asyncio.Event()
        self._task = OwnedTask("policy-worker", self._run)
        self.planned = 0  # changes planned by this worker since start

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    def wake(self) -> None:
        self._wake.set()

    async def run_once(self) -> int:
        """Plans one batch of waiting changes; returns how many (0: the inbox is empty)."""
        async with self._lock, self._engine.begin() as conn:
            claimed = await claim_inbox(conn, self._batch)
            if not claimed.changes:
                return 0
            written = await self._plan(conn, claimed.changes, self._clock())
            await clear_inbox(conn, claimed.event_ids)
        self.planned += len(claimed.changes)
        if self._on_planned is not None:
            self._on_planned(claimed.changes, written)
        return len(claimed.changes)

    async def drain(self) -> int:
        """Plans until the inbox is empty (tests, the demo); returns the changes planned."""
        total = 0
        while planned := await self.run_once():
            total += planned
        return total

    async def _run(self) -> None:
        failures = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._poll_interval)
            self._wake.clear()
            try:
                planned = await self.run_once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                # The changes stay in the inbox; the next round retries them.
                failures += 1
                log.exception("policy batch failed; retrying (failure %d)", failures)
                await asyncio.sleep(min(30.0, self._poll_interval * 2**failures))
                continue
            if planned:
                self._wake.set()  # more may wait: next batch after the intake had its turn
