"""Unchanged resends at intake: the intake writer's part that answers a group Alertmanager
re-sent as it was from one read of the store, and counts it (issue 34 item 5).

store/resends.py says when a body may be answered that way (the same bytes as a stored
receipt, its group's digest unchanged, its alerts all still firing) and reads it in one
statement. `Resends` holds what makes that read cheap and the answer complete:
- one connection held open for those reads, in autocommit (one read at a time on it);
- the probes (`ResendProbe`) of the skippable bodies stored or recognised lately, by their
  SHA-256, bounded by their occurrences, so a resend of one of them is not even parsed
  again (`answer_known`): only the parse is saved, the store is asked all the same, so this
  memory can never make a changed group look unchanged;
- the counts the answered resends owe their receipts (`times_received`,
  `last_received_at`), handed to the writer (`take_touches`) and written with its next
  transaction, at most `touch_after` seconds later (`request_flush`). A crash loses those
  counts only: the alerts were stored before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime

from trainsentry.store.engine import Connection, Engine
from trainsentry.store.errors import STORE_FAILURES
from trainsentry.store.resends import ReceiptTouch, ResendProbe, known_resend, open_reader
from trainsentry.store.writes import ReceiptOutcome

log = logging.getLogger("trainsentry.intake")


class Resends:
    """Answers unchanged resends from the store; keeps the probes and the counts owed."""

    def __init__(
        self,
        engine: Engine,
        *,
        on_answer: Callable[[ReceiptOutcome], None],
        request_flush: Callable[[], None],
        touch_after: float = 1.0,
        max_known_occurrences: int = 100_000,
    ) -> None:
        self._engine = engine
        self._on_answer = on_answer
        self._request_flush = request_flush
        self._touch_after = touch_after
        self._touches: dict[int, ReceiptTouch] = {}  # receipt id -> resends not yet counted
        self._timer: asyncio.TimerHandle | None = None
        self._reader: Connection | None = None  # opened on first use
        self._reader_lock = asyncio.Lock()
        # probes by body SHA-256, least recently seen first; about 200 bytes per occurrence
        self._known: OrderedDict[str, ResendProbe] = OrderedDict()
        self._known_occurrences = 0
        self._max_known_occurrences = max_known_occurrences

    @property
    def owed(self) -> bool:
        """Whether answered resends are not yet counted in the store."""
        return bool(self._touches)

    async def answer_known(self, body_sha256: str, received_at: datetime) -> ReceiptOutcome | None:
        """The answer to a body seen lately (the same bytes: parsed and validated then) when
        it is an unchanged resend now; None: it must be parsed and submitted."""
        probe = self._known.get(body_sha256)
        if probe is None:
            return None
        self._known.move_to_end(body_sha256)
        outcome = await self.answer(probe, received_at)
        if outcome is None:
            self._forget(body_sha256)
        return outcome

    async def answer(self, probe: ResendProbe, received_at: datetime) -> ReceiptOutcome | None:
        """The answer to an unchanged resend of its group, from one read of the store; None
        when it must be recorded (also when the read failed: the writer then finds out)."""
        async with self._reader_lock:
            try:
                if self._reader is None:
                    self._reader = await open_reader(self._engine)
                known = await known_resend(self._reader, probe)
            except Exception as exc:
                if not isinstance(exc, STORE_FAILURES):
                    log.exception("intake: checking for an unchanged resend failed")
                await self._close_reader()  # a new one next time (the store may be back)
                return None
        if known is None:
            return None
        touch = self._touches.get(known.receipt_id)
        if touch is None:
            touch = self._touches[known.receipt_id] = ReceiptTouch(0, received_at)
        touch.count += 1
        touch.last_at = max(touch.last_at, received_at)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._touch_after, self._due)
        self.remember(probe)
        outcome = ReceiptOutcome(
            receipt_id=known.receipt_id,
            times_received=known.times_received + touch.count,
            unchanged=probe.alerts,
            resend=True,
        )
        self._on_answer(outcome)
        return outcome

    def remember(self, probe: ResendProbe) -> None:
        """Keeps `probe` for `answer_known` (a body just stored or recognised)."""
        self._forget(probe.body_sha256)
        self._known[probe.body_sha256] = probe
        self._known_occurrences += len(probe.occurrences)
        while self._known_occurrences > self._max_known_occurrences:
            self._forget(next(iter(self._known)))

    def _forget(self, body_sha256: str) -> None:
        probe = self._known.pop(body_sha256, None)
        if probe is not None:
            self._known_occurrences -= len(probe.occurrences)

    def _due(self) -> None:
        self._timer = None
        if self._touches:  # a transaction since may have taken them already
            self._request_flush()

    def take_touches(self) -> dict[int, ReceiptTouch]:
        """The counts owed, for the writer's next transaction."""
        touches, self._touches = self._touches, {}
        return touches

    def put_back(self, touches: dict[int, ReceiptTouch]) -> None:
        """Counts whose transaction failed wait for the next one."""
        for receipt_id, touch in touches.items():
            owed = self._touches.get(receipt_id)
            if owed is None:
                self._touches[receipt_id] = touch
            else:
                owed.count += touch.count
                owed.last_at = max(owed.last_at, touch.last_at)
        if self._touches and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._touch_after, self._due)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        async with self._reader_lock:
            await self._close_reader()

    async def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.close()
