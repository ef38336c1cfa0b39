"""Owned background loops stop when asked, whatever they were waiting for at that moment."""

from __future__ import annotations

import asyncio

from trainsentry.tasks import OwnedTask, wait_for_event


async def test_a_loop_stops_even_when_its_wake_up_and_the_stop_coincide() -> None:
    """Python 3.11's asyncio.wait_for drops a cancellation that arrives as the awaited event
    is set; a loop waiting with it ran on and stop() waited forever (60 of 80 such trials
    here, with wait_for in place of wait_for_event)."""
    for settle_ticks in range(4):
        for _ in range(20):
            wake = asyncio.Event()

            async def loop(wake: asyncio.Event = wake) -> None:
                while True:
                    await wait_for_event(wake, 10)
                    wake.clear()

            task = OwnedTask("loop", loop)
            task.start()
            for _ in range(3):
                await asyncio.sleep(0)
            wake.set()
            for _ in range(settle_ticks):
                await asyncio.sleep(0)
            async with asyncio.timeout(2):  # not wait_for: it has the very bug tested here
                await task.stop()


async def test_wait_for_event_says_whether_the_event_came() -> None:
    event = asyncio.Event()
    assert await wait_for_event(event, 0.01) is False
    event.set()
    assert await wait_for_event(event, 10) is True
