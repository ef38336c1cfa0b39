"""Waiting for a condition in async tests, with a deadline."""

from __future__ import annotations

import asyncio
from typing import Any


async def eventually(check: Any, within: float = 20.0, interval: float = 0.05) -> None:
    """Polls `check()` until it is truthy; KeyError/TypeError/IndexError count as not yet."""
    deadline = asyncio.get_running_loop().time() + within
    last: BaseException | None = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            if check():
                return
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            last = exc
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {within}s (last error: {last!r})")
