"""Owned background loops stop when asked, whatever they were waiting for at that moment."""

from __future__ import annotations

import asyncio
import logging

import pytest

from trainsentry.tasks import OwnedTask, every, wait_for_event


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


async def test_a_periodic_loop_logs_a_failed_round_and_runs_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rounds: list[int] = []

    async def round_once() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("the store is down")

    task = OwnedTask("t", lambda: every(0.01, round_once, logging.getLogger("t"), "round failed"))
    with caplog.at_level(logging.ERROR, logger="t"):
        task.start()
        for _ in range(200):
            if len(rounds) >= 3:
                break
            await asyncio.sleep(0.01)
        await task.stop()
    assert len(rounds) >= 3
    failures = [r for r in caplog.records if r.getMessage() == "round failed"]
    assert len(failures) == 1 and failures[0].exc_info is not None
