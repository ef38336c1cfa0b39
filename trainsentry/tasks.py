"""A long-running asyncio task owned by a component: started once, cancelled on stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class OwnedTask:
    def __init__(self, name: str, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._body = body
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._body(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def wait_for_event(event: asyncio.Event, seconds: float) -> bool:
    """Waits until `event` is set or `seconds` pass; True if it was set.

    Not `asyncio.wait_for`: on Python 3.11 it loses a cancellation that arrives just as the
    event is set (it returns the result instead), and a loop built on it then runs on after
    `OwnedTask.stop()` cancelled it, which waits for it forever. `asyncio.timeout` does not.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
            return True
    return False


async def every(
    seconds: float,
    round_once: Callable[[], Awaitable[object]],
    log: logging.Logger,
    failed: str,
) -> None:
    """Runs `round_once` forever, `seconds` apart (a stage's periodic loop, the body of its
    OwnedTask). A round that raises is logged with `failed` and its traceback, and the next
    round still runs; only cancellation ends the loop."""
    while True:
        try:
            await round_once()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(failed)
        await asyncio.sleep(seconds)
