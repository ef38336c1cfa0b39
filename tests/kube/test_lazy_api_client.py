"""The Kubernetes client the gateway's stages share the handling of (kube/client.py
LazyApiClient): opened at first use, one at a time, closed on stop, reopened after."""

from __future__ import annotations

import asyncio

from trainsentry.kube.client import LazyApiClient


class FakeApi:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


async def test_opened_once_at_first_use_closed_and_reopened() -> None:
    opened: list[FakeApi] = []

    async def factory() -> FakeApi:
        await asyncio.sleep(0.01)  # concurrent first uses overlap here
        opened.append(FakeApi())
        return opened[-1]

    lazy = LazyApiClient(factory)
    assert opened == []  # nothing at construction
    first, second = await asyncio.gather(lazy.get(), lazy.get())
    assert first is second and len(opened) == 1
    await lazy.close()
    assert opened[0].closed
    await lazy.close()  # a second close is harmless
    assert await lazy.get() is not first and len(opened) == 2


async def test_a_stand_in_without_close_is_dropped_on_close() -> None:
    stand_in = object()

    async def factory() -> object:
        return stand_in

    lazy = LazyApiClient(factory)
    assert await lazy.get() is stand_in
    await lazy.close()
