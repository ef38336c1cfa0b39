"""A local HTTP server that records what channels send (for delivery counting in tests).

It behaves like a provider that deduplicates by idempotency key (as Feishu's `uuid` does):
`deliveries` counts every accepted request, `unique` the distinct keys. `fail_first`
makes the first N requests answer 500, `rate_limit_every` answers 429 on every Nth request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Receiver:
    fail_first: int = 0
    rate_limit_every: int = 0
    delay: float = 0.0
    requests: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    keys: Counter[str] = field(default_factory=Counter)
    times: list[float] = field(default_factory=list)  # monotonic arrival time of each request
    url: str = ""
    _runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.times.append(time.monotonic())
        body = await request.json()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.requests <= self.fail_first:
            return web.Response(status=500, text="try again")
        if self.rate_limit_every and self.requests % self.rate_limit_every == 0:
            return web.Response(status=429, headers={"Retry-After": "0.05"})
        self.keys[request.headers.get("Idempotency-Key", "")] += 1
        self.bodies.append(body)
        return web.json_response({"ok": True})

    @property
    def unique(self) -> int:
        return len(self.keys)

    @property
    def duplicates(self) -> int:
        return sum(self.keys.values()) - len(self.keys)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ThreadedReceiver:
    """A Receiver on its own event loop in a thread (for tests that block, e.g. subprocesses)."""

    def __init__(self, **kwargs: Any) -> None:
        self.receiver = Receiver(**kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.receiver.start(), self._loop).result(10)
        return self.receiver

    def __exit__(self, *_exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.receiver.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
