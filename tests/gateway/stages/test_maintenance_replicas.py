"""Two real gateway processes (`trainsentry gateway`) on one PostgreSQL apply a maintenance
window once: made through one replica, it mutes an alert the other receives; when it ends,
the alert (still firing) is notified once, not once per replica, and its "ends soon" notice
is written once."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
import yaml
from sqlalchemy import select

from tests.support.eventually import eventually
from tests.support.gateway_process import start_gateway
from tests.support.receiver import ThreadedReceiver
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import utcnow
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.store.engine import create_engine
from trainsentry.store.schema import notifications

pytestmark = pytest.mark.e2e
TOKEN = "replica-token"
WINDOW_S = 6


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
async def test_two_replicas_apply_one_window_once(db_url: str, tmp_path: Path) -> None:
    with ThreadedReceiver() as receiver:
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"webhooks": {"phone": {"url": receiver.url}}}))
        a = start_gateway(tmp_path / "a", db_url, token=TOKEN, config=config)
        b = start_gateway(tmp_path / "b", db_url, token=TOKEN, config=config)
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            now = utcnow()
            window = {
                "matchers": {"node": "gpu-node-17"},
                "starts_at": now.isoformat(),
                "ends_at": (now + timedelta(seconds=WINDOW_S)).isoformat(),
                "reason": "NVLink replacement",
                "created_by": "alice",
            }
            alerts = [
                make_alert(1, labels={"priority": "P0", "node": "gpu-node-17"}, starts_at=now),
                make_alert(2, labels={"priority": "P0", "node": "gpu-node-18"}, starts_at=now),
            ]
            async with aiohttp.ClientSession(headers=headers) as session:
                async with session.post(f"{a.url}/api/v1/maintenance", json=window) as response:
                    assert response.status == 201, await response.text()
                    window_id = (await response.json())["id"]
                async with session.post(f"{b.url}{WEBHOOK_PATH}", data=encode(make_body(alerts))):
                    pass
                await eventually(lambda: receiver.bodies, within=20)
                await asyncio.sleep(1)
                assert [body["payload"]["alert_id"] for body in receiver.bodies] == [2]
                async with session.get(f"{b.url}/api/v1/alerts/1") as response:
                    assert (await response.json())["muted_by"]["window_id"] == window_id
                # the window ends; both replicas' tickers run every second
                await eventually(lambda: len(receiver.bodies) >= 2, within=WINDOW_S + 20)
                await asyncio.sleep(3)  # room for a second, wrong notice
            assert [body["payload"]["alert_id"] for body in receiver.bodies] == [2, 1]
            assert receiver.duplicates == 0
            engine = create_engine(db_url)
            try:
                async with engine.connect() as conn:
                    rows = (
                        await conn.execute(select(notifications.c.channel, notifications.c.payload))
                    ).all()
            finally:
                await engine.dispose()
            phone_1 = [p for c, p in rows if c == "phone" and p.get("alert_id") == 1]
            assert len(phone_1) == 1 and phone_1[0]["maintenance"]["window_id"] == window_id
            ending = [c for c, p in rows if p.get("event") == "maintenance_ending"]
            assert ending == ["console"]
        finally:
            a.stop()
            b.stop()
