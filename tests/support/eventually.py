"""Waiting for a condition in tests, with a deadline: `eventually` in async tests (an awaitable
check is awaited), `eventually_sync` where the test blocks (processes, threads)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

# What a check may raise while the thing it reads is not there yet.
NOT_YET: tuple[type[BaseException], ...] = (KeyError, TypeError, IndexError, ValueError)


def _timed_out(within: float, what: str, last: BaseException | None, detail: str) -> AssertionError:
    text = f"timed out after {within}s waiting for {what} (last error: {last!r})"
    return AssertionError(f"{text}\n{detail}" if detail else text)


async def eventually(
    check: Any,
    within: float = 20.0,
    interval: float = 0.05,
    *,
    what: str = "the condition",
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
) -> Any:
    """Polls `check()` until it is truthy and returns that value; the exceptions in `not_yet`
    count as not yet, any other ends the wait."""
    deadline = asyncio.get_running_loop().time() + within
    last: BaseException | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            found = check()
            if inspect.isawaitable(found):
                found = await found
            if found:
                return found
        except not_yet as exc:
            last = exc
        await asyncio.sleep(interval)
    raise _timed_out(within, what, last, "")


def eventually_sync(
    check: Callable[[], Any],
    within: float,
    what: str = "the condition",
    *,
    interval: float = 0.1,
    not_yet: tuple[type[BaseException], ...] = NOT_YET,
    detail: Callable[[], str] | None = None,
) -> Any:
    """`eventually` for a test that blocks: sleeps between polls. On a timeout the error ends
    with `detail()` (a job's output, say)."""
    deadline = time.monotonic() + within
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if found := check():
                return found
        except not_yet as exc:
            last = exc
        time.sleep(interval)
    raise _timed_out(within, what, last, detail() if detail else "")
