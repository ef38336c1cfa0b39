"""Records the webhooks the intake journaled (store/journal.py): occurrences, events, inbox rows.

Under load the intake answers once a webhook's receipt is stored (gateway/stages/intake.py);
the expander then records its alerts from the receipt, oldest first, in bounded chunks
(`chunk_alerts`) under the policy's lock: on SQLite there is one writer, and a chunk at a time
lets a policy batch (a P0 first, store/inbox.py) in between. Each chunk is one transaction
that records its rows' alerts and deletes the rows, so after a crash every journaled webhook
is recorded once, by the next run (woken at start). The alerts of a receipt journaled by
this process are kept parsed in memory until expanded (bounded by `cache_alerts`); others are
parsed again from the stored body.

When a chunk runs (`_hold`): the intake goes first and the policy is kept fed, no more.
- While webhooks arrive (one in hand, or the last answered less than `quiet_s` ago) and the
  journal holds less than `max_backlog` alerts, the expander waits: a storm is answered at the
  rate of storing receipts, not of recording alerts and planning them. The urgent alerts
  (P0, P1) were recorded by the intake itself and are planned meanwhile.
- While `ahead` changes already wait for the policy, it waits too: expanding further ahead
  of the planner would only take the interpreter from it and from the intake.
- At `max_backlog` the intake holds a webhook without urgent alerts until there is room
  (`room`, at most `room_wait_s`, then 503: Alertmanager retries): the backlog, the memory it
  takes and the delay of a P2 behind it stay bounded; the intake then runs at the planner's
  pace.

Invariants: one chunk at a time per process (and one expander across PostgreSQL replicas,
store/journal.py); `backlog` is a hint (alerts waiting, read from the store at each chunk,
plus those journaled since): the order of a group's webhooks never depends on it
(`store.journal.groups_waiting`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from trainsentry.alerts import Alert
from trainsentry.labels import NODE_LABELS
from trainsentry.store.engine import Engine
from trainsentry.store.errors import StoreUnavailable
from trainsentry.store.inbox import inbox_holds
from trainsentry.store.journal import (
    JournalEntry,
    claim_journal,
    deferred,
    expand_journal,
    journal_waiting,
    receipt_bodies,
)
from trainsentry.store.writes import IncomingReceipt, ReceiptOutcome
from trainsentry.tasks import OwnedTask, wait_for_event

log = logging.getLogger("trainsentry.intake")

# Rows read per claim; a chunk ends at `chunk_alerts` (at least one row).
_CLAIM_ROWS = 64


class Expander:
    """The one expansion task of a gateway process. `parse(body)`: a stored body's alerts
    (the intake's own parse). `max_backlog` 0: the intake records every webhook before its
    answer (the journal an earlier run left is still expanded)."""

    def __init__(
        self,
        engine: Engine,
        parse: Callable[[str], list[Alert]],
        *,
        lock: asyncio.Lock | None = None,
        node_labels: tuple[str, ...] = NODE_LABELS,
        on_expanded: Callable[[Sequence[ReceiptOutcome]], None] | None = None,
        max_backlog: int = 20_000,
        chunk_alerts: int = 500,
        ahead: int = 1000,
        quiet_s: float = 0.05,
        room_wait_s: float = 10.0,
        poll_interval: float = 1.0,
        cache_alerts: int = 200_000,
    ) -> None:
        self._engine = engine
        self._parse = parse
        self._lock = lock or asyncio.Lock()
        self._node_labels = node_labels
        self._on_expanded = on_expanded
        self.max_backlog = max_backlog
        self._chunk_alerts = chunk_alerts
        self._ahead = ahead
        self._quiet_s = quiet_s
        self._room_wait_s = room_wait_s
        self._poll_interval = poll_interval
        self._cache_alerts = cache_alerts
        self._alerts: dict[int, list[Alert]] = {}  # receipt id -> its deferred alerts
        self._cached = 0
        self._in_hand = 0  # webhooks the intake is storing now
        self._last_webhook = 0.0  # time.monotonic() when the last one was answered
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._task = OwnedTask("intake-expander", self._run)
        self.backlog = 0
        self.expanded = 0  # alerts expanded by this process since start

    async def start(self) -> None:
        """Counts what an earlier run left in the journal (before the intake journals more),
        then starts expanding it."""
        async with self._engine.connect() as conn:
            waiting = await journal_waiting(conn)
        self.backlog += waiting.alerts
        self._wake.set()
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    def wake(self) -> None:
        """Something changed that may let a held chunk run (the policy planned a batch)."""
        self._wake.set()

    @property
    def journaling(self) -> bool:
        """Whether the intake journals now (else it records every webhook before its answer):
        the journal is on and alerts are known to wait in it."""
        return self.max_backlog > 0 and self.backlog > 0

    @property
    def enabled(self) -> bool:
        return self.max_backlog > 0

    def webhook_started(self) -> None:
        """The intake took a webhook in hand (the expander holds back meanwhile)."""
        self._in_hand += 1

    def webhook_done(self) -> None:
        self._in_hand -= 1
        self._last_webhook = time.monotonic()

    async def room(self) -> None:
        """Returns once the journal holds less than `max_backlog` alerts; raises
        StoreUnavailable after `room_wait_s` (the caller answers 503)."""
        if self.backlog < self.max_backlog:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._room_wait_s
        while self.backlog >= self.max_backlog:
            left = deadline - loop.time()
            if left <= 0:
                raise StoreUnavailable(
                    f"intake journal full ({self.backlog} alerts waiting to be recorded)"
                )
            self._room.clear()
            self._wake.set()
            await wait_for_event(self._room, left)

    def journaled(
        self, receipts: Sequence[IncomingReceipt], outcomes: Sequence[ReceiptOutcome]
    ) -> None:
        """After the intake committed journal rows for some of `receipts`."""
        for receipt, outcome in zip(receipts, outcomes, strict=True):
            if not outcome.queued:
                continue
            self.backlog += outcome.queued
            if outcome.receipt_id not in self._alerts and self._cached < self._cache_alerts:
                alerts = deferred(receipt.alerts)
                self._alerts[outcome.receipt_id] = alerts
                self._cached += len(alerts)
        self._wake.set()

    async def run_once(self) -> int:
        """Expands one chunk; returns its alerts (0: the journal is empty, or another replica
        expands it)."""
        async with self._lock, self._engine.begin() as conn:
            claimed = await claim_journal(conn, _CLAIM_ROWS)
            if claimed is None:  # another replica expands: its progress frees room here
                self.backlog = (await journal_waiting(conn)).alerts
                self._room.set()
                return 0
            if not claimed:
                self.backlog = 0
                self._room.set()
                return 0
            chunk: list[JournalEntry] = []
            total = 0
            for entry in claimed:
                if chunk and total + entry.alert_count > self._chunk_alerts:
                    break
                chunk.append(entry)
                total += entry.alert_count
            missing = [entry.receipt_id for entry in chunk if entry.receipt_id not in self._alerts]
            bodies = await receipt_bodies(conn, missing)
            work = [(entry, self._alerts_of(entry, bodies)) for entry in chunk]
            outcomes, left = await expand_journal(conn, work, self._node_labels)
        for entry in chunk:
            self._cached -= len(self._alerts.pop(entry.receipt_id, ()))
        self.backlog = left
        self.expanded += total
        self._room.set()
        if self._on_expanded is not None:
            self._on_expanded(outcomes)
        return total

    def _alerts_of(self, entry: JournalEntry, bodies: dict[int, str]) -> list[Alert]:
        cached = self._alerts.get(entry.receipt_id)
        if cached is not None:
            return cached
        body = bodies.get(entry.receipt_id)
        try:
            if body is None:
                raise LookupError("the receipt is not stored")
            return deferred(self._parse(body))
        except Exception:
            # Accepted before, so this is a bug (or a body edited in the store): recording
            # nothing for it beats holding every later webhook behind it.
            log.exception(
                "intake journal: receipt %d cannot be read again; its %d alerts are dropped",
                entry.receipt_id,
                entry.alert_count,
            )
            return []

    async def drain(self) -> int:
        """Expands until the journal is empty (tests, the demo); returns the alerts."""
        total = 0
        while expanded := await self.run_once():
            total += expanded
        return total

    async def _hold(self) -> float | None:
        """None: expand a chunk now. Else wait: that many seconds (the intake first), or 0
        until woken (the policy has enough ahead of it)."""
        if self.backlog <= 0:
            return None  # nothing known to wait: a claim is cheap and resets the count
        if self.backlog < self.max_backlog:
            quiet = 0.0 if self._in_hand else time.monotonic() - self._last_webhook
            if quiet < self._quiet_s:
                return self._quiet_s - quiet
        async with self._engine.connect() as conn:
            enough = await inbox_holds(conn, self._ahead)
        return 0.0 if enough else None

    async def _run(self) -> None:
        failures = 0
        while True:
            await wait_for_event(self._wake, self._poll_interval)
            self._wake.clear()
            try:
                hold = await self._hold()
                if hold is not None:
                    if hold > 0:
                        await asyncio.sleep(hold)
                        self._wake.set()
                    continue
                expanded = await self.run_once()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("intake journal: expansion failed; retrying (failure %d)", failures)
                await asyncio.sleep(min(30.0, self._poll_interval * 2**failures))
                continue
            if expanded:
                self._wake.set()  # more may wait: next chunk after the others had their turn
