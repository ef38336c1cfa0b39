"""Runs the alert policy over the changes the intake committed (the policy inbox).

The intake answers Alertmanager as soon as the alerts and their events are on disk; the policy
(classification, dedup, storms, routing, outbox rows) follows in its own transaction, woken by
the intake's commit and, as a fallback, by a poll (a restart or another replica's intake).
Claiming, planning and deleting inbox rows happen in one transaction, so a crash at any point
leaves each change either unplanned (it is planned after the restart) or planned with its
notifications written — never both, never neither.

Batches are bounded and the worker yields between them, so a storm's backlog is worked off
while new webhooks keep being answered.

A batch that fails on an error of the policy itself (a bug meeting some alert; store errors
are only retried) is planned again one change at a time, so the other changes go on. A change
that fails on its own is retried once after the worker's backoff, then (the policy is pure:
what fails twice fails again) at once until it failed `max_attempts` times, and set aside:
removed from the inbox, logged with its alert and the traceback, and counted
(`trainsentry_policy_failed_total`, alert TrainsentryPolicyFailed). The alert stays stored;
only its notification is lost, instead of every notification behind it. Invariant: a
poisoned change delays the others by at most one backoff (the first, `2 * poll_interval`):
the backoff starts over after each change set aside, so a run of poisoned changes does not
grow it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from trainsentry.alerts import AlertChange, utcnow
from trainsentry.gateway.stages.intake import PlanHook
from trainsentry.store.engine import Engine
from trainsentry.store.errors import STORE_FAILURES
from trainsentry.store.inbox import Claimed, claim_inbox, clear_inbox, urgency
from trainsentry.tasks import OwnedTask, wait_for_event

log = logging.getLogger("trainsentry.policy")


def most_urgent(claimed: Claimed) -> Claimed:
    """Pure: the leading changes of the claim's most urgent level (claims come most urgent
    first, store/inbox.py). A P0 that arrives behind a storm is planned in a batch of its
    own, committed in milliseconds, instead of with 249 storm changes; the others stay in
    the inbox for the next batch, in the same order."""
    if not claimed.changes:
        return claimed
    level = urgency(claimed.changes[0].alert.labels)
    cut = 1
    while cut < len(claimed.changes) and urgency(claimed.changes[cut].alert.labels) == level:
        cut += 1
    if cut == len(claimed.changes):
        return claimed
    return Claimed(claimed.event_ids[:cut], claimed.changes[:cut])


class PolicyWorker:
    def __init__(
        self,
        engine: Engine,
        plan: PlanHook,
        *,
        # ~60 ms of policy per batch here: with 1,000 the intake answered half as many alerts/s
        # during a storm for the same planning rate (bench/bench_intake.py).
        batch: int = 250,
        poll_interval: float = 1.0,
        on_planned: Callable[[Sequence[AlertChange], int], None] | None = None,
        on_set_aside: Callable[[AlertChange], None] | None = None,
        max_attempts: int = 3,
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
        self._on_set_aside = on_set_aside
        self._max_attempts = max_attempts
        # event id -> failed attempts of that change planned alone (only failing changes)
        self._failures: dict[int, int] = {}
        self._claimed: Claimed | None = None  # what the last batch claimed
        self._clock = clock
        self._wake = asyncio.Event()
        self._task = OwnedTask("policy-worker", self._run)
        self.planned = 0  # changes planned by this worker since start
        self.set_aside = 0  # changes set aside by this worker since start

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    def wake(self) -> None:
        self._wake.set()

    async def run_once(self) -> int:
        """Plans one batch of waiting changes; returns how many (0: the inbox is empty).
        Raises what failed while a change may still succeed on a later try."""
        try:
            return await self._plan_batch(self._batch)
        except STORE_FAILURES:  # unavailable, locked, a deadlock: no fault of a change
            raise
        except Exception:
            log.exception("policy batch failed; planning its changes one at a time")
        planned = 0
        for _ in range(self._batch):
            try:
                done = await self._plan_batch(1)
            except STORE_FAILURES:
                raise
            except Exception:
                verdict = await self._after_failure()
                if verdict == "backoff":
                    raise
                if verdict == "aside":
                    self.set_aside += 1
                continue
            if not done:
                break
            planned += done
        return planned

    async def _plan_batch(self, limit: int) -> int:
        self._claimed = None
        async with self._lock, self._engine.begin() as conn:
            claimed = self._claimed = most_urgent(await claim_inbox(conn, limit))
            if not claimed.changes:
                return 0
            written = await self._plan(conn, claimed.changes, self._clock())
            await clear_inbox(conn, claimed.event_ids)
        for event_id in claimed.event_ids:
            self._failures.pop(event_id, None)
        self.planned += len(claimed.changes)
        if self._on_planned is not None:
            self._on_planned(claimed.changes, written)
        return len(claimed.changes)

    async def _after_failure(self) -> str:
        """After a change failed on its own: counts the failure. "backoff": retry after the
        worker's backoff (its first failure, or not the change's fault); "retry": at once (it
        failed before, and the policy is pure); "aside": failed `max_attempts` times, removed
        from the inbox."""
        claimed = self._claimed
        if claimed is None or len(claimed.event_ids) != 1:
            return "backoff"  # failed before its change was claimed: not the change's fault
        event_id, change = claimed.event_ids[0], claimed.changes[0]
        attempts = self._failures[event_id] = self._failures.get(event_id, 0) + 1
        if attempts == 1:
            return "backoff"  # the failure may have been transient
        if attempts < self._max_attempts:
            return "retry"
        async with self._lock, self._engine.begin() as conn:
            await clear_inbox(conn, [event_id])
        del self._failures[event_id]
        log.error(
            "policy failed %d times on one change; set aside (stored, not notified): "
            "event=%d alert_id=%d alertname=%s fingerprint=%s kind=%s",
            attempts,
            event_id,
            change.alert_id,
            change.alert.name,
            change.alert.fingerprint,
            change.kind.value,
            exc_info=True,
        )
        if self._on_set_aside is not None:
            self._on_set_aside(change)
        return "aside"

    async def drain(self) -> int:
        """Plans until the inbox is empty (tests, the demo); returns the changes planned."""
        total = 0
        while planned := await self.run_once():
            total += planned
        return total

    async def _run(self) -> None:
        failures = 0
        while True:
            await wait_for_event(self._wake, self._poll_interval)
            self._wake.clear()
            set_aside = self.set_aside
            try:
                planned = await self.run_once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                # The changes stay in the inbox; the next round retries them. A change set
                # aside in this round ends the run of failures: the next poisoned change
                # costs one short backoff, not a longer one.
                failures = 1 if self.set_aside != set_aside else failures + 1
                log.exception("policy batch failed; retrying (failure %d)", failures)
                await asyncio.sleep(min(30.0, self._poll_interval * 2**failures))
                continue
            if planned:
                self._wake.set()  # more may wait: next batch after the intake had its turn
