"""Provider rate limits as data, and a sliding-window gate that honours them.

Channels publish their provider limits as `RATE_LIMITS` (tuples of `RateLimit`) so the
outbox can build its token buckets from them; the same data drives `SlidingWindow`, which a
channel uses to avoid ever sending faster than the provider allows for one destination
(Feishu counts custom-bot limits per webhook).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most `count` requests in any window of `per_seconds`."""

    count: int
    per_seconds: float

    def scaled(self, factor: float) -> RateLimit:
        """The same count in a window `factor` times as long (tests compress time with it)."""
        return RateLimit(self.count, self.per_seconds * factor)


def as_pairs(limits: Sequence[RateLimit]) -> list[tuple[int, float]]:
    """The `(count, seconds)` form the outbox's `rate_limits` mapping takes."""
    return [(limit.count, limit.per_seconds) for limit in limits]


def scale_limits(limits: Sequence[RateLimit], factor: float) -> tuple[RateLimit, ...]:
    return tuple(limit.scaled(factor) for limit in limits)


class Slot:
    """One request in a `SlidingWindow`: pending until `done` records when it finished."""

    __slots__ = ("finished_at",)

    def __init__(self) -> None:
        self.finished_at: float | None = None


class SlidingWindow:
    """Sliding-window log over several limits (pure bookkeeping; no sleeping).

    The provider sees a request at some moment between our sending it and its answer. To
    stay under its limit whatever the network does, a request counts from the moment its
    answer arrived (`Slot.finished_at`), and one still in flight counts as "now": then for
    any `count` consecutive requests the provider saw them at least a window apart.
    """

    def __init__(
        self, limits: Sequence[RateLimit], margin: float = 0.02, slack_s: float = 0.05
    ) -> None:
        if not limits:
            raise ValueError("at least one limit is needed")
        self.limits = tuple(limits)
        # Clocks differ a little: keep every window a bit longer than the provider's.
        self.margin = margin
        self.slack_s = slack_s
        self._slots: deque[Slot] = deque()
        self._horizon = max(self._window(limit) for limit in self.limits)

    def _window(self, limit: RateLimit) -> float:
        return limit.per_seconds * (1 + self.margin) + self.slack_s

    def delay(self, now: float) -> float:
        """Seconds to wait from `now` before one more request fits every limit."""
        while self._slots:
            first = self._slots[0].finished_at
            if first is None or first > now - self._horizon:
                break
            self._slots.popleft()
        wait = 0.0
        for limit in self.limits:
            if len(self._slots) >= limit.count:
                at = self._slots[-limit.count].finished_at
                ended = now if at is None else at
                wait = max(wait, ended + self._window(limit) - now)
        return max(0.0, wait)

    def start(self) -> Slot:
        slot = Slot()
        self._slots.append(slot)
        return slot

    def record(self, at: float) -> None:
        """A request that is already answered at `at` (for callers without slots)."""
        self.start().finished_at = at


class RateGate:
    """Async gate over a `SlidingWindow`: waits up to `max_wait`, else says how long to back off.

    The outbox's workers should not sit blocked for a minute, so a wait longer than
    `max_wait` is returned to the caller (who raises RateLimitedError with it).

        slot = await gate.acquire()
        if isinstance(slot, float): raise RateLimitedError(..., retry_after=slot)
        try: ... send ...
        finally: gate.done(slot)
    """

    def __init__(
        self,
        limits: Sequence[RateLimit],
        *,
        max_wait: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        margin: float = 0.02,
        slack_s: float = 0.05,
    ) -> None:
        self._window = SlidingWindow(limits, margin=margin, slack_s=slack_s)
        self._lock = asyncio.Lock()
        self._clock = clock
        self.max_wait = max_wait

    @property
    def limits(self) -> tuple[RateLimit, ...]:
        return self._window.limits

    async def acquire(self) -> Slot | float:
        """Takes a slot (sleeping if needed), or returns the backoff if it is too far away."""
        async with self._lock:
            while True:
                wait = self._window.delay(self._clock())
                if wait > self.max_wait:
                    return wait
                if wait <= 0:
                    return self._window.start()
                # A request in flight may finish later than assumed: look again after.
                await asyncio.sleep(wait)

    def done(self, slot: Slot) -> None:
        """The request of `slot` was answered (or failed) now."""
        if slot.finished_at is None:
            slot.finished_at = self._clock()
