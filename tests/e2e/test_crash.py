"""kill -9 the gateway while 2,000 alerts are being posted; every alert that got a 200 survives;
kill -9 it before a group is planned, re-send the group: every alert is planned once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import func, select

from tests.support.gateway_process import start_gateway
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.store import create_engine
from trainsentry.store.schema import alert_events, alerts, policy_inbox

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


GROUP_BODY = encode(
    make_body(
        [make_alert(5000 + i) for i in range(50)],
        group_key='{}:{alertname="GPUXidError", trainingjob="llama-70b"}',
    )
)
# Holds the policy back: its transaction fails writing the first notification and rolls
# back, so the group's changes stay in the policy inbox, stored but never planned (a store
# error: the worker retries it, never sets it aside).
HOLD_POLICY = {
    "sqlite": [
        "CREATE TRIGGER ts_hold BEFORE INSERT ON notifications "
        "BEGIN SELECT RAISE(ABORT, 'held by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION ts_hold() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'held by the test'; END $$",
        "CREATE TRIGGER ts_hold BEFORE INSERT ON notifications "
        "FOR EACH ROW EXECUTE FUNCTION ts_hold()",
    ],
}
RELEASE_POLICY = {
    "sqlite": ["DROP TRIGGER ts_hold"],
    "postgresql": ["DROP TRIGGER ts_hold ON notifications", "DROP FUNCTION ts_hold()"],
}


async def run_sql(db_url: str, statements: list[str]) -> None:
    engine = create_engine(db_url)
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()


async def planning_state(db_url: str) -> tuple[int, int, int, int]:
    """(alerts, alerts the policy planned (a priority), events, changes waiting)."""
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:

            async def scalar(query: object) -> int:
                return int((await conn.execute(query)).scalar_one())  # type: ignore[call-overload]

            return (
                await scalar(select(func.count()).select_from(alerts)),
                await scalar(select(func.count(alerts.c.priority))),
                await scalar(select(func.count()).select_from(alert_events)),
                await scalar(select(func.count()).select_from(policy_inbox)),
            )
    finally:
        await engine.dispose()


async def post_group(url: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=GROUP_BODY, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        answer: dict[str, object] = await response.json()
        return answer


def test_kill_9_before_planning_then_the_group_resent_loses_nothing(
    tmp_path: Path, db_url: str
) -> None:
    """Issue 34 item 5: a group stored, the gateway killed before its policy ran, then the
    group re-sent unchanged after the restart: every alert is planned once, none lost. (The
    group's digest is written with its changes: the resend may be recognised as unchanged,
    and the changes it repeats are planned from the inbox.)"""
    backend = db_url.split(":", 1)[0]
    gateway = start_gateway(tmp_path, db_url, token=TOKEN)
    url = f"{gateway.url}/api/v1/alertmanager"
    try:
        asyncio.run(run_sql(db_url, HOLD_POLICY[backend]))
        assert asyncio.run(post_group(url))["new"] == 50
        time.sleep(1.5)  # the policy worker tries (and fails) at least once
        assert asyncio.run(planning_state(db_url)) == (50, 0, 50, 50), "stored, not planned"
        os.kill(gateway.process.pid, signal.SIGKILL)
        gateway.process.wait(timeout=10)
    finally:
        gateway.stop()
    asyncio.run(run_sql(db_url, RELEASE_POLICY[backend]))

    restarted = start_gateway(tmp_path, db_url, token=TOKEN)
    try:
        answer = asyncio.run(post_group(f"{restarted.url}/api/v1/alertmanager"))
        assert (answer["new"], answer["changed"], answer["unchanged"]) == (0, 0, 50)
        deadline = time.monotonic() + 30
        while asyncio.run(planning_state(db_url)) != (50, 50, 50, 0):
            assert time.monotonic() < deadline, asyncio.run(planning_state(db_url))
            time.sleep(0.2)
    finally:
        restarted.stop()


async def test_kill_9_between_an_incidents_card_and_its_update_sends_no_second_card(
    tmp_path: Path,
) -> None:
    """Issue 34: the gateway dies (kill -9) twice: once after Feishu stored the incident's card
    but before its answer came back, once while the card's update is on its way. After each
    restart the outbox sends them again: the card with the same `uuid` (Feishu answers the
    same message), the update to that card (the same content twice changes nothing). One
    card in the chat, showing the incident as it stands; nothing lost."""
    import json
    from datetime import UTC, datetime

    import yaml

    from tests.e2e.test_incidents import DISK, disk_group
    from tests.support.feishu_server import FeishuContractServer
    from tests.support.gateway_process import start_gateway as start

    feishu = FeishuContractServer(apps={"cli_app": "app-secret"})
    async with feishu:
        config = tmp_path / "gateway.yaml"
        chats = {"oc_oncall": ["P0", "P1", "P2", "P3"]}
        app = {"base_url": feishu.base_url, "app_id": "cli_app", "chats": chats}
        config.write_text(yaml.safe_dump({"channels": {"feishu_app": app}}))
        env = {"FEISHU_APP_SECRET": "app-secret"}
        db = f"sqlite:///{tmp_path / 'store.db'}"

        async def gateway() -> Any:
            return await asyncio.to_thread(start, tmp_path, db, token=TOKEN, config=config, env=env)

        async def post(url: str, body: dict[str, Any]) -> None:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as session:
                async with session.post(f"{url}/api/v1/alertmanager", data=encode(body)) as r:
                    assert r.status == 200, await r.text()

        async def until(check: Any, what: str) -> None:
            for _ in range(600):
                if check():
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"timed out waiting for {what}")

        async def kill(running: Any) -> None:
            os.kill(running.process.pid, signal.SIGKILL)
            await asyncio.to_thread(running.process.wait, 10)
            running.stop()

        now = datetime.now(UTC).replace(microsecond=0)
        feishu.hold["send"] = asyncio.Event()
        first = await gateway()
        await post(first.url, disk_group(range(1, 11), now))
        await until(lambda: feishu.arrived["send"] >= 1, "the card to reach Feishu")
        await kill(first)  # Feishu stored the card; the gateway never saw its answer
        feishu.hold.pop("send").set()  # (the answer goes to no one)
        feishu.hold["update"] = asyncio.Event()
        second = await gateway()
        await until(lambda: feishu.arrived["send"] >= 2, "the card sent again")
        await post(second.url, disk_group(range(1, 16), now))  # 5 more nodes
        await until(lambda: feishu.arrived["update"] >= 1, "the update to reach Feishu")
        await kill(second)  # the update in flight
        feishu.hold.pop("update").set()  # applied now, its answer to no one
        third = await gateway()
        try:
            await until(lambda: feishu.arrived["update"] >= 2, "the update sent again")
            await asyncio.sleep(1.0)  # anything else it would still send
        finally:
            third.stop()
    cards = [m for m in feishu.messages.values() if DISK in m["content"]]
    assert len(cards) == 1 and len(feishu.messages) == 1, "one card, not a second one"
    assert "10 nodes" in json.loads(cards[0]["content"])["header"]["title"]["content"]
    last = cards[0]["updates"][-1]["header"]["title"]["content"]
    assert "15 nodes" in last, last
    assert feishu.rejections == []
