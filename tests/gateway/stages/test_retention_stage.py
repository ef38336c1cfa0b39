"""The retention stage in a running gateway (issue 19, finding 8), on SQLite and the real
PostgreSQL: started by assemble.py, it purges what is due and exports the store's size."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from sqlalchemy import delete, func, select

from tests.support.gateway_process import close_in_process
from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.config import GatewaySettings, RetentionSettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.store import create_engine, migrate
from trainsentry.store.schema import alerts, policy_inbox
from trainsentry.store.writes import record_receipts

NOW = BASE_TIME + timedelta(days=120)


async def seed(db_url: str) -> None:
    """Ten alerts resolved 120 days before NOW, already planned."""
    engine = create_engine(db_url)
    try:
        await migrate(engine)
        body = make_body([make_alert(i, status="resolved") for i in range(10)])
        async with engine.begin() as conn:
            await record_receipts(conn, [parse_webhook(encode(body), received_at=BASE_TIME)])
            await conn.execute(delete(policy_inbox))
    finally:
        await engine.dispose()


async def alert_rows(db_url: str) -> int:
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(alerts))).scalar_one())
    finally:
        await engine.dispose()


@pytest.fixture
async def gateway(db_url: str, tmp_path: Path) -> AsyncIterator[TestServer]:
    await seed(db_url)
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        console_file=tmp_path / "console.jsonl",
        retention=RetentionSettings(interval_seconds=1, batch_size=4, pause_seconds=0),
    )
    server = TestServer(create_app(settings, clock=lambda: NOW), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await close_in_process(server)


async def scrape(server: TestServer) -> str:
    async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as r:
        return await r.text()


def sample(text: str, name: str) -> list[tuple[str, float]]:
    return [
        (labels, float(value))
        for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE)
    ]


async def test_the_running_gateway_purges_old_rows_and_exports_the_store_size(
    gateway: TestServer, db_url: str
) -> None:
    purged: list[float] = []
    for _ in range(200):  # the stage runs at start, in batches of 4
        text = await scrape(gateway)
        metric = sample(text, "trainsentry_store_purged_rows_total")
        purged = [value for labels, value in metric if labels == 'table="alerts"']
        if purged == [10.0]:
            break
        await asyncio.sleep(0.05)
    assert purged == [10.0]
    assert await alert_rows(db_url) == 0

    text = await scrape(gateway)
    ((backend, size),) = sample(text, "trainsentry_store_size_bytes")
    assert size > 0
    free = sample(text, "trainsentry_store_volume_free_bytes")
    total = sample(text, "trainsentry_store_volume_size_bytes")
    if db_url.startswith("sqlite"):
        assert backend == 'backend="sqlite"'
        path = Path(db_url.removeprefix("sqlite:///"))
        assert size >= await asyncio.to_thread(os.path.getsize, path)
        assert free and total and 0 < free[0][1] <= total[0][1]
        assert free[0][0] == f'volume="{path.parent}"'
    else:
        assert backend == 'backend="postgresql"'
        assert free == [] and total == []  # no volume to measure: no series, no alert
