"""The outbox across process crashes and replicas, counted at a real local receiving server."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support.eventually import eventually_sync
from tests.support.gateway_process import start_gateway
from tests.support.receiver import ThreadedReceiver
from tests.support.webhook_factory import encode, make_alert, make_body

pytestmark = pytest.mark.e2e
TOKEN = "outbox-token"


def gateway_config(tmp_path: Path, receiver_url: str) -> Path:
    policy = tmp_path / "policy.yaml"
    # every notification also goes to the test's webhook channel "hook"; one incident per
    # job and alertname (the bodies below pack 50 jobs' alerts in one webhook)
    policy.write_text(
        yaml.safe_dump(
            {"routing": {"always": ["console", "hook"]}, "grouping": {"by": "alertname"}}
        )
    )
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {"gateway": {"policy_file": str(policy)}, "webhooks": {"hook": {"url": receiver_url}}}
        )
    )
    return config


def sent_keys(db: Path) -> set[str]:
    """Idempotency keys of the webhook channel's rows the store holds as sent."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT idempotency_key FROM notifications WHERE channel = 'hook' AND status = 'sent'"
        ).fetchall()
    return {key for (key,) in rows}


def bodies(count: int, start: int = 0) -> list[bytes]:
    """`count` alerts of as many jobs (no storm), 50 per webhook."""
    alerts = [
        make_alert(start + i, labels={"trainingjob": f"job-{start + i}", "priority": "P2"})
        for i in range(count)
    ]
    return [encode(make_body(alerts[i : i + 50])) for i in range(0, count, 50)]


async def post(urls: list[str], payloads: list[bytes]) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for index, payload in enumerate(payloads):
            for url in urls if index % 3 == 0 else urls[index % len(urls) : index % len(urls) + 1]:
                async with session.post(f"{url}/api/v1/alertmanager", data=payload) as response:
                    assert response.status == 200, await response.text()


def test_kill_9_with_pending_notifications_sends_all_once(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    with ThreadedReceiver(delay=0.02) as receiver:
        config = gateway_config(tmp_path, receiver.url)
        gateway = start_gateway(tmp_path, db_url, token=TOKEN, config=config)
        try:
            asyncio.run(post([gateway.url], bodies(500)))
            eventually_sync(
                lambda: receiver.unique >= 50,
                60,
                "some deliveries before the kill",
                interval=0.05,
                not_yet=(),
            )
            os.kill(gateway.process.pid, signal.SIGKILL)
            gateway.process.wait(timeout=10)
        finally:
            gateway.stop()
        # requests that reached the receiver just before the kill finish being counted
        time.sleep(0.5)
        delivered_before = receiver.unique
        assert delivered_before < 500, "the kill should leave notifications pending"
        recorded_sent = sent_keys(tmp_path / "store.db")
        restarted = start_gateway(tmp_path, db_url, token=TOKEN, config=config)
        try:
            eventually_sync(
                lambda: receiver.unique == 500,
                120,
                "all 500 notifications",
                interval=0.05,
                not_yet=(),
            )
            time.sleep(0.5)
        finally:
            restarted.stop()
        # Every notification arrived. At-least-once: only a delivery whose outcome was not yet
        # written at the kill may be sent again (the idempotency key lets the receiver drop
        # it); one recorded as sent never is.
        assert receiver.unique == 500
        assert all(receiver.keys[key] == 1 for key in recorded_sent)
        assert receiver.duplicates <= delivered_before - len(recorded_sent)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_two_gateways_on_one_postgresql_deliver_each_notification_once(
    tmp_path: Path, db_url: str
) -> None:
    with ThreadedReceiver(delay=0.005) as receiver:
        config = gateway_config(tmp_path, receiver.url)
        first = start_gateway(tmp_path, db_url, token=TOKEN, config=config)
        second = start_gateway(tmp_path, db_url, token=TOKEN, config=config)
        try:
            # every third webhook goes to both (Alertmanager HA peers), the rest to one
            asyncio.run(post([first.url, second.url], bodies(300)))
            eventually_sync(
                lambda: receiver.unique == 300,
                120,
                "all 300 notifications",
                interval=0.05,
                not_yet=(),
            )
            time.sleep(1.0)  # would-be duplicates have time to arrive
        finally:
            first.stop()
            second.stop()
        assert receiver.unique == 300
        assert receiver.duplicates == 0
        senders = {body["id"] for body in receiver.bodies}
        assert len(senders) == 300
