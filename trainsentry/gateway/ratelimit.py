"""Sliding-window rate limits for outbound channels (e.g. Feishu bot: 5/s and 100/min)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence


class SlidingWindowLimiter:
    """Allows at most `count` events in any `seconds`-long window, for every (count, seconds)."""

    def __init__(
        self,
        limits: Sequence[tuple[int, float]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = [(count, seconds) for count, seconds in limits if count > 0]
        self._clock = clock
        longest = max((count for count, _ in self.limits), default=0)
        self._events: deque[float] = deque(maxlen=longest or None)
        self._lock = asyncio.Lock()

    def delay(self) -> float:
        """Seconds until one more event would be allowed (0 if now)."""
        now = self._clock()
        wait = 0.0
        events = list(self._events)
        for count, seconds in self.limits:
            if len(events) >= count:
                oldest_in_window = events[-count]
                wait = max(wait, oldest_in_window + seconds - now)
        return max(0.0, wait)

    def record(self) -> None:
        self._events.append(self._clock())

    async def acquire(self) -> None:
        """Waits until an event is allowed, then records it."""
        async with self._lock:
            while (wait := self.delay()) > 0:  # noqa: ASYNC110 - waiting on time, not an event
                await asyncio.sleep(wait)
            self.record()
