"""The planning stage's clock: fires the policy's timers and expires stale alerts.

Every `interval` seconds (sooner when a timer is due) `Ticker` calls `PolicyPlan.tick`,
which runs `decide_tick` and the phone escalation (`Paging.tick` → the next escalation
call), and sweeps alerts whose `endsAt` passed without a resolve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from trainsentry.alerts import AlertChange, utcnow
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.store.engine import Engine
from trainsentry.store.writes import expire_stale
from trainsentry.tasks import OwnedTask, every

log = logging.getLogger("trainsentry.policy")  # the planning stage's logger, as before the split


class Ticker:
    """Runs the policy's timers and the stale-alert sweep every `interval` seconds."""

    def __init__(
        self,
        engine: Engine,
        plan: PolicyPlan,
        *,
        interval: float = 1.0,
        stale_after: float = 24.5 * 3600,
        on_drafts: Any = None,
        on_expired: Callable[[Sequence[AlertChange], int], None] | None = None,
        clock: Callable[[], datetime] = utcnow,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self._engine = engine
        # After the commit, with the changes of alerts it expired: what follows any planned
        # change (job status, hang diagnosis), as for the policy worker's batches.
        self._on_expired = on_expired
        # Shared with the policy worker: on SQLite reads run before the write lock is taken,
        # so two policy transactions of one process must not interleave.
        self._lock = lock or asyncio.Lock()
        self._clock = clock
        self._plan = plan
        self._stale_after = stale_after
        self._on_drafts = on_drafts
        self._task = OwnedTask(
            "policy-ticker", lambda: every(interval, self.run_once, log, "policy tick failed")
        )

    async def run_once(self, now: datetime | None = None) -> int:
        now = now or self._clock()
        async with self._lock, self._engine.begin() as conn:
            written = await self._plan.tick(conn, now)
            expired = await expire_stale(conn, now, self._stale_after)
            if expired:
                log.info("expired stale alerts count=%d", len(expired))
                written += await self._plan(conn, expired, now)
        if expired and self._on_expired is not None:
            self._on_expired(expired, written)
        if written and self._on_drafts is not None:
            self._on_drafts()
        return written

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()
