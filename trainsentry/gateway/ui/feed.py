"""The console's live feed: one poller per gateway process reads the store's change marker
(store/console.py `change_marker`: three index lookups) every `interval` seconds while
someone watches, and wakes every open `GET /ui/events` stream when it moved. The store is
the source (not this process's memory), so a change made through another replica shows too.

Invariants: at most one poll in flight; no poll while nobody watches; `close()` ends every
stream (the gateway's shutdown does not wait for open browsers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

log = logging.getLogger("trainsentry.ui")

Marker = tuple[int, int, int]


class ChangeFeed:
    def __init__(
        self,
        read_marker: Callable[[], Awaitable[Marker]],
        *,
        interval: float = 1.0,
        max_watchers: int = 200,
    ) -> None:
        self._read = read_marker
        self._interval = interval
        self.max_watchers = max_watchers
        self._marker: Marker | None = None
        self._changed = asyncio.Condition()
        self._watchers = 0
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def watchers(self) -> int:
        return self._watchers

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[ChangeFeed]:
        """While open, the poller runs."""
        self._watchers += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._poll(), name="ui-feed")
        try:
            yield self
        finally:
            self._watchers -= 1

    async def wait(self, seen: Marker | None, within: float) -> Marker | None:
        """The marker once it is known and differs from `seen` (the marker the page was
        drawn at); `seen` again after `within` seconds or when the feed closes."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(
                        lambda: (self._marker is not None and self._marker != seen) or self.closed
                    ),
                    within,
                )
            return self._marker if self._marker is not None else seen

    async def _poll(self) -> None:
        while self._watchers > 0 and not self.closed:
            try:
                marker = await asyncio.wait_for(self._read(), timeout=max(self._interval, 2.0))
            except Exception as exc:  # the store is down: try again, the streams stay open
                log.debug("ui feed: marker unavailable (%s)", type(exc).__name__)
            else:
                if marker != self._marker:
                    async with self._changed:
                        self._marker = marker
                        self._changed.notify_all()
            await asyncio.sleep(self._interval)

    async def close(self) -> None:
        self.closed = True
        async with self._changed:
            self._changed.notify_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
