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


class SlidingWindow:
    """Exact sliding-window log over several limits (pure bookkeeping; no sleeping)."""

    def __init__(
        self, limits: Sequence[RateLimit], margin: float = 0.02, slack_s: float = 0.05
    ) -> None:
        if not limits:
            raise ValueError("at least one limit is needed")
        self.limits = tuple(limits)
        # Requests reach the provider a little later or earlier than we send them; keep
        # every window a bit longer than the provider's so jitter cannot break the limit.
        self.margin = margin
        self.slack_s = slack_s
        self._sent: deque[float] = deque()
        self._horizon = max(self._window(limit) for limit in self.limits)

    def _window(self, limit: RateLimit) -> float:
        return limit.per_seconds * (1 + self.margin) + self.slack_s

    def delay(self, now: float) -> float:
        """Seconds to wait from `now` before one more request fits every limit."""
        while self._sent and self._sent[0] <= now - self._horizon:
            self._sent.popleft()
        wait = 0.0
        for limit in self.limits:
            window = self._window(limit)
            if len(self._sent) >= limit.count:
                oldest_in_window = self._sent[-limit.count]
                wait = max(wait, oldest_in_window + window - now)
        return max(0.0, wait)

    def record(self, at: float) -> None:
        self._sent.append(at)


class RateGate:
    """Async gate over a `SlidingWindow`: waits up to `max_wait`, else says how long to back off.

    The outbox's workers should not sit blocked for a minute, so a wait longer than
    `max_wait` is returned to the caller (who raises RateLimitedError with it).
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

    async def acquire(self) -> float | None:
        """Takes one slot (sleeping if needed); returns None, or the backoff if too long."""
        async with self._lock:
            wait = self._window.delay(self._clock())
            if wait > self.max_wait:
                return wait
            if wait > 0:
                await asyncio.sleep(wait)
            self._window.record(self._clock())
            return None
