"""One rendering of a page part shared by every viewer asking for it within a second, so
that the console cannot starve the alert path: twelve open tabs, or one client fetching in a
loop, cost at most one rendering of the Now page a second per filter, not one per request.

`RenderCache.get(key, marker, build)`: `marker` is the store's change marker the request
read (store/console.py `change_marker`); `build` reads the store and renders.

Invariants:
- a request is answered with a rendering whose data was read after the request read its
  marker, or one made at that same marker less than `reuse_s` ago: a page fetched because
  the live feed said "changed" shows that change;
- for one key, one `build` runs at a time, and a new one starts at least `reuse_s` after the
  previous one started (a request that needs a newer rendering waits for it, at most that
  long); every request waiting then takes that one rendering;
- at most `max_builds` builds run at once over all keys (viewers with many different
  filters wait their turn rather than render side by side);
- at most `max_keys` renderings are kept (the least recently used go); the keys are the
  callers' filters, which any viewer chooses.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Slot(Generic[T]):
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    value: T | None = None
    marker: Hashable = None
    read_at: float = float("-inf")  # when its build started reading the store (monotonic)


class RenderCache(Generic[T]):
    def __init__(
        self,
        *,
        reuse_s: float = 1.0,
        max_keys: int = 32,
        max_builds: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reuse_s = reuse_s
        self.max_keys = max_keys
        self._clock = clock
        self._slots: OrderedDict[Hashable, _Slot[T]] = OrderedDict()
        self._building = asyncio.Semaphore(max_builds)
        self.builds = 0  # renderings made (for tests and the benchmark)

    def now(self) -> float:
        """The clock `get`'s `asked_at` is read on."""
        return self._clock()

    def _fresh(self, slot: _Slot[T], marker: Hashable, asked_at: float) -> bool:
        if slot.value is None:
            return False
        if slot.read_at >= asked_at:  # read the store after this request read its marker
            return True
        return slot.marker == marker and self._clock() - slot.read_at < self.reuse_s

    def _slot(self, key: Hashable) -> _Slot[T]:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
            while len(self._slots) > self.max_keys:
                oldest = next(iter(self._slots))
                if self._slots[oldest].lock.locked():
                    break  # in use: kept until the next insertion
                del self._slots[oldest]
        self._slots.move_to_end(key)
        return slot

    async def get(
        self, key: Hashable, marker: Hashable, build: Callable[[], Awaitable[T]], asked_at: float
    ) -> T:
        """The rendering for `key` (see the module's docstring). `asked_at` is the clock's
        time when the caller read `marker`."""
        slot = self._slot(key)
        if self._fresh(slot, marker, asked_at):
            assert slot.value is not None
            return slot.value
        async with slot.lock:
            if self._fresh(slot, marker, asked_at):
                assert slot.value is not None
                return slot.value
            wait = slot.read_at + self.reuse_s - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            async with self._building:
                read_at = self._clock()
                value = await build()
            self.builds += 1
            slot.value, slot.marker, slot.read_at = value, marker, read_at
            return value
