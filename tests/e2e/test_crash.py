"""kill -9 the gateway while 2,000 alerts are being posted; every alert that got a 200 survives."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import func, select

from tests.support.gateway_process import start_gateway
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.store import create_engine
from trainsentry.store.schema import alert_events, alerts

pytestmark = pytest.mark.e2e
TOKEN = "crash-token"
BODIES = [encode(make_body([make_alert(b * 50 + i) for i in range(50)])) for b in range(40)]


async def post_all(url: str, kill_after: int, pid: int) -> set[int]:
    """Posts every body (8 at a time); kills the gateway after `kill_after` 200s."""
    acknowledged: set[int] = set()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(BODIES)):
        queue.put_nowait(index)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            try:
                async with session.post(url, data=BODIES[index], headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        acknowledged.add(index)
                        if len(acknowledged) == kill_after:
                            os.kill(pid, signal.SIGKILL)
            except aiohttp.ClientError:
                continue  # the gateway is gone: this body was never acknowledged

    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(8)))
    return acknowledged


async def stored_counts(db_url: str) -> tuple[int, int, int, int]:
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(func.count()).select_from(alerts))).scalar_one()
            distinct = (
                await conn.execute(
                    select(func.count()).select_from(
                        select(alerts.c.fingerprint, alerts.c.starts_at).distinct().subquery()
                    )
                )
            ).scalar_one()
            events = (
                await conn.execute(select(func.count()).select_from(alert_events))
            ).scalar_one()
            fingerprints = {
                row.fingerprint for row in await conn.execute(select(alerts.c.fingerprint))
            }
        return rows, distinct, events, len(fingerprints)
    finally:
        await engine.dispose()


async def fingerprints_stored(db_url: str) -> set[str]:
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            return {row.fingerprint for row in await conn.execute(select(alerts.c.fingerprint))}
    finally:
        await engine.dispose()


def test_kill_9_during_intake_loses_no_acknowledged_alert(tmp_path: Path, db_url: str) -> None:
    gateway = start_gateway(tmp_path, db_url, token=TOKEN)
    url = f"{gateway.url}/api/v1/alertmanager"
    try:
        acknowledged = asyncio.run(post_all(url, kill_after=15, pid=gateway.process.pid))
        gateway.process.wait(timeout=10)
        assert gateway.process.returncode == -signal.SIGKILL
    finally:
        gateway.stop()
    assert 15 <= len(acknowledged) < len(BODIES), "the kill should land mid-run"
    expected = {f"{b * 50 + i:016x}" for b in acknowledged for i in range(50)}
    assert expected <= asyncio.run(fingerprints_stored(db_url))

    # Alertmanager retries what was not acknowledged (and may resend what was).
    restarted = start_gateway(tmp_path, db_url, token=TOKEN)
    try:
        retried = asyncio.run(post_all(f"{restarted.url}/api/v1/alertmanager", 10**6, 0))
    finally:
        restarted.stop()
    assert retried == set(range(len(BODIES)))
    rows, distinct, events, fingerprints = asyncio.run(stored_counts(db_url))
    assert rows == distinct == fingerprints == 2000  # no duplicate occurrences
    assert events == 2000  # one firing event per alert, none repeated
