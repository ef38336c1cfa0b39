"""What the rank a hang diagnosis blames is doing: its `/stack`, read for the card.

The diagnosis (`enrichment.py`) asks only the culprits (at most MAX_STACK_RANKS) and
only within what is left of its deadline; a rank that does not answer is not described.
The probe's `/stack` (trainsentry/probe/stacks.py) lists every thread, the main thread
first, frames outermost first, each marked `library` when it lies in the interpreter's
standard library or site-packages.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import httpx

from trainsentry.gateway.stages.hang.probe_client import probe_client
from trainsentry.gateway.stages.hang.probe_reading import TooLarge, read_capped

MAX_STACK_BYTES = 4 * 1024 * 1024
MAX_STACK_RANKS = 8


class Endpoint(Protocol):
    @property
    def base_url(self) -> str: ...


async def _stack_one(
    client: httpx.AsyncClient, rank: int, endpoint: Endpoint, token: str
) -> tuple[int, Mapping[str, Any] | None]:
    try:
        async with client.stream(
            "GET", endpoint.base_url + "/stack", headers={"Authorization": f"Bearer {token}"}
        ) as response:
            if response.status_code != 200:
                return rank, None
            data = await read_capped(response, MAX_STACK_BYTES)  # cut while it is read
    except (httpx.HTTPError, TooLarge):
        return rank, None
    try:
        body = json.loads(data)
    except ValueError:
        return rank, None
    return rank, body if isinstance(body, dict) else None


async def fetch_stacks(
    endpoints: Mapping[int, Endpoint],
    token: str,
    *,
    timeout_s: float = 3.0,
    deadline_s: float = 5.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[int, Mapping[str, Any]]:
    """The `/stack` of each given rank that answers in time (at most MAX_STACK_RANKS)."""
    chosen = sorted(endpoints.items())[:MAX_STACK_RANKS]
    if not chosen:
        return {}
    async with probe_client(timeout_s, transport) as client:
        tasks = [asyncio.ensure_future(_stack_one(client, r, e, token)) for r, e in chosen]
        done, pending = await asyncio.wait(tasks, timeout=max(0.5, deadline_s))
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    found: dict[int, Mapping[str, Any]] = {}
    for task in done:
        if not task.cancelled() and task.exception() is None:
            rank, stack = task.result()
            if stack is not None:
                found[rank] = stack
    return found


def _main_frames(stack: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    threads = stack.get("threads") or []
    main = next((t for t in threads if isinstance(t, Mapping) and t.get("main")), None)
    frames = (main or {}).get("frames") or []
    return [f for f in frames if isinstance(f, Mapping)]


def stack_phrase(stack: Mapping[str, Any]) -> str:
    """Pure: where a rank's main thread is, for the card: the innermost two frames of user
    code and the line it is on, e.g. `train.py:88 main → load_batch: time.sleep(1)`; ""
    when the stack says nothing usable. A library frame inside the user's code is named
    after it (`… → torch/serialization.py _save`)."""
    frames = _main_frames(stack)
    mine = [f for f in frames if not f.get("library")]
    if not mine:
        return ""
    inner = mine[-1]
    names = " → ".join(str(f.get("function", "?")) for f in mine[-2:])
    where = f"{Path(str(inner.get('file', '?'))).name}:{inner.get('line', '?')} {names}"
    code = str(inner.get("code") or "")
    if code:
        where += f": {code[:80]}"
    below = frames[frames.index(inner) + 1 :] if inner in frames else []
    if below:
        deepest = below[-1]
        lib_file = "/".join(Path(str(deepest.get("file", ""))).parts[-2:])
        where += f" → {lib_file} {deepest.get('function', '')}".rstrip()
    return where


def checkpointing(stack: Mapping[str, Any]) -> str:
    """Pure: how the rank says it is saving a checkpoint ("torch.save" seen on its stack, or
    a marked `phase("checkpoint")`), or "" when it does not."""
    phase = stack.get("phase")
    if isinstance(phase, Mapping) and phase.get("name") == "checkpoint":
        return "a marked checkpoint phase" if phase.get("source") == "marked" else "torch.save"
    return ""
