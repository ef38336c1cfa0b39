"""kill -9 the gateway while 4,000 alerts are being posted: every alert that got a 200 is on
disk at the kill and recorded and planned after the restart, once (durability means "present
after a restart": docs/design.md, Decisions 2026-11-27; docs/gateway.md "Journal-first
intake"); kill -9 it before a group is planned, re-send the group: every alert is planned
once."""

from __future__ import annotations

import asyncio
import hashlib
import json
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
from trainsentry.store.schema import (
    alert_events,
    alerts,
    intake_journal,
    policy_inbox,
    webhook_receipts,
)

pytestmark = pytest.mark.e2e
TOKEN = "crash-token"
# Every fourth body is above the intake's record-at-once bound (200 alerts), so it is
# journaled however fast the machine commits: the kill lands with both paths in use (with
# 50-alert bodies only, a fast machine committed every batch small and journaled nothing).
BODY_SIZES = [250 if b % 4 == 3 else 50 for b in range(40)]
BODY_FIRST = [sum(BODY_SIZES[:b]) for b in range(40)]
BODY_ALERTS = [range(BODY_FIRST[b], BODY_FIRST[b] + BODY_SIZES[b]) for b in range(40)]
ALL_ALERTS = sum(BODY_SIZES)
BODIES = [encode(make_body([make_alert(n) for n in BODY_ALERTS[b]])) for b in range(40)]


async def post_all(
    url: str, kill_after: int, pid: int, journaled: set[int] | None = None
) -> set[int]:
    """Posts every body (8 at a time); kills the gateway after `kill_after` 200s.
    `journaled`: gets the bodies answered before their alerts were recorded."""
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
                    answer = await response.read()
                    if response.status == 200:
                        acknowledged.add(index)
                        if journaled is not None and json.loads(answer)["queued"]:
                            journaled.add(index)
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


async def receipts_stored(db_url: str) -> set[str]:
    """The SHA-256 of every webhook body stored."""
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            found = await conn.execute(select(webhook_receipts.c.body_sha256))
            return {row.body_sha256 for row in found}
    finally:
        await engine.dispose()


async def recorded_and_planned(db_url: str) -> tuple[set[str], set[str], int]:
    """(fingerprints recorded, fingerprints the policy planned (a priority), rows still
    waiting in the intake journal and the policy inbox)."""
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(select(alerts.c.fingerprint, alerts.c.priority))).all()
            waiting = 0
            for table in (intake_journal, policy_inbox):
                counted = await conn.execute(select(func.count()).select_from(table))
                waiting += int(counted.scalar_one())
        return {r.fingerprint for r in rows}, {r.fingerprint for r in rows if r.priority}, waiting
    finally:
        await engine.dispose()


def test_kill_9_during_intake_loses_no_acknowledged_alert(tmp_path: Path, db_url: str) -> None:
    """Every alert answered 200 is present after the restart: on disk at the kill (its
    webhook's receipt), recorded and planned by the restarted gateway before anything is
    re-sent, and none twice once Alertmanager re-sends everything."""
    gateway = start_gateway(tmp_path, db_url, token=TOKEN)
    url = f"{gateway.url}/api/v1/alertmanager"
    journaled: set[int] = set()
    try:
        acknowledged = asyncio.run(post_all(url, 15, gateway.process.pid, journaled))
        gateway.process.wait(timeout=10)
        assert gateway.process.returncode == -signal.SIGKILL
    finally:
        gateway.stop()
    assert 15 <= len(acknowledged) < len(BODIES), "the kill should land mid-run"
    assert journaled, "the 250-alert bodies are journaled (answered before recording)"
    answered = {hashlib.sha256(BODIES[b]).hexdigest() for b in acknowledged}
    assert answered <= asyncio.run(receipts_stored(db_url)), "a 200 is on disk"
    expected = {f"{n:016x}" for b in acknowledged for n in BODY_ALERTS[b]}

    restarted = start_gateway(tmp_path, db_url, token=TOKEN)
    try:
        # The restart alone records and plans every acknowledged alert.
        deadline = time.monotonic() + 60
        while True:
            recorded, planned, waiting = asyncio.run(recorded_and_planned(db_url))
            if waiting == 0 and expected <= planned:
                break
            assert time.monotonic() < deadline, (len(expected - planned), waiting)
            time.sleep(0.2)
        assert expected <= recorded
        # Alertmanager retries what was not acknowledged (and may resend what was).
        retried = asyncio.run(post_all(f"{restarted.url}/api/v1/alertmanager", 10**6, 0))
        assert retried == set(range(len(BODIES)))
        deadline = time.monotonic() + 60
        while asyncio.run(recorded_and_planned(db_url))[1:] != (recorded_all(), 0):
            assert time.monotonic() < deadline, asyncio.run(recorded_and_planned(db_url))[2]
            time.sleep(0.2)
    finally:
        restarted.stop()
    rows, distinct, events, fingerprints = asyncio.run(stored_counts(db_url))
    assert rows == distinct == fingerprints == ALL_ALERTS  # no duplicate occurrences
    assert events == ALL_ALERTS  # one firing event per alert, none repeated: planned once each


def recorded_all() -> set[str]:
    return {f"{n:016x}" for n in range(ALL_ALERTS)}


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
