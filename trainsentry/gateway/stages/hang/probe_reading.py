"""Reading what a job's probes answer, bounded while it is read (dumps, stacks, status).

A probe is the job's code: whatever it sends is attacker-controlled, its size included.
Nothing here reads a body whole before checking its size:
- a declared `Content-Length` over the cap is refused before a byte is read;
- the body is read in chunks and abandoned the moment it passes the cap;
- every chunk is first taken from the `ByteBudget`s given (the diagnosis's own and the
  gateway's total): when one is spent, the read stops and what it took is given back;
- a dump goes to a file as it arrives (`stream_to_file`), never held whole in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

WRITE_CHUNK = 1 << 20  # bytes gathered before one write to the file
MAX_DUMP_BYTES = 64 * 1024 * 1024


class TooLarge(Exception):
    """The answer passed its cap, or a byte budget was spent; the message says which."""


class ByteBudget:
    """Bytes that may be held at once (a diagnosis's, or the gateway's over all of them).

    Invariant: `used` never exceeds `limit`; `take` either takes all it is asked or none.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used = max(0, self.used - size)


@dataclass(frozen=True)
class DumpLimits:
    """How much of a job's dumps one diagnosis may read: each dump cut at `max_bytes`, all of
    them within `budgets` (the diagnosis's own, the gateway's total); `total_ranks` is the
    job's rank count, for the verdict's statement of what was not fetched."""

    max_bytes: int = MAX_DUMP_BYTES
    budgets: tuple[ByteBudget, ...] = ()
    total_ranks: int = 0


def _take(budgets: Sequence[ByteBudget], size: int) -> str:
    """Takes `size` from every budget, or from none; "" or which one is spent."""
    for i, budget in enumerate(budgets):
        if not budget.take(size):
            for taken in budgets[:i]:
                taken.give(size)
            return "byte budget spent" if i == 0 else "the gateway's byte budget spent"
    return ""


def _declared_too_large(response: httpx.Response, cap: int) -> bool:
    declared = response.headers.get("Content-Length", "")
    return declared.isdigit() and int(declared) > cap


async def read_capped(response: httpx.Response, cap: int) -> bytes:
    """The body of a streamed `response`, or TooLarge past `cap` bytes (read no further)."""
    if _declared_too_large(response, cap):
        raise TooLarge("answer too large")
    parts = bytearray()
    async for chunk in response.aiter_bytes():
        if len(parts) + len(chunk) > cap:
            raise TooLarge("answer too large")
        parts += chunk
    return bytes(parts)


async def stream_to_file(
    response: httpx.Response, path: Path, cap: int, budgets: Sequence[ByteBudget]
) -> int:
    """Writes the body of a streamed `response` to `path` and returns its size; the bytes
    stay taken from `budgets` (the caller gives them back when it drops the file). Past
    `cap` or a budget: TooLarge, the file removed and its bytes given back."""
    if _declared_too_large(response, cap):
        raise TooLarge("dump too large")
    size = 0
    pending = bytearray()
    handle = await asyncio.to_thread(path.open, "wb")
    try:
        async for chunk in response.aiter_bytes():
            if size + len(chunk) > cap:
                raise TooLarge("dump too large")
            spent = _take(budgets, len(chunk))
            if spent:
                raise TooLarge(spent)
            size += len(chunk)
            pending += chunk
            if len(pending) >= WRITE_CHUNK:
                await asyncio.to_thread(handle.write, bytes(pending))
                pending.clear()
        if pending:
            await asyncio.to_thread(handle.write, bytes(pending))
    except BaseException:
        handle.close()
        for budget in budgets:
            budget.give(size)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    handle.close()
    return size
