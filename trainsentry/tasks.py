"""A long-running asyncio task owned by a component: started once, cancelled on stop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
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
