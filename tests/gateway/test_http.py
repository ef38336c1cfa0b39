"""The gateway over real HTTP on loopback, on SQLite and the real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.gateway_process import close_in_process
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import AlertChange, NotificationDraft, Priority
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import OutboundNotification, Receipt, RetryableError
from trainsentry.store.writes import insert_notifications

TOKEN = "s3cret-token"


@pytest.fixture
async def server(db_url: str, tmp_path: Path) -> AsyncIterator[TestServer]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        max_body_bytes=64 * 1024,
        console_file=tmp_path / "console.jsonl",
        webhook_token=SecretStr(TOKEN),
    )
    test_server = TestServer(create_app(settings), host="127.0.0.1")
    await test_server.start_server()
    try:
        yield test_server
    finally:
        await test_server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        yield session


async def post(http: aiohttp.ClientSession, server: TestServer, raw: bytes) -> tuple[int, dict]:
    async with http.post(server.make_url(WEBHOOK_PATH), data=raw) as response:
        return response.status, await response.json()


async def test_same_body_three_times_is_one_occurrence_each(
    server: TestServer, http: aiohttp.ClientSession
) -> None:
    raw = encode(make_body([make_alert(i) for i in range(10)]))
    answers = [await post(http, server, raw) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 200]
    assert [a["new"] for _, a in answers] == [10, 0, 0]
    assert [a["replay"] for _, a in answers] == [False, True, True]
    async with http.get(server.make_url("/api/v1/alerts?limit=1000")) as response:
        items = (await response.json())["items"]
    assert len(items) == 10
    assert len({item["fingerprint"] for item in items}) == 10


async def test_answers_for_bad_requests(server: TestServer, http: aiohttp.ClientSession) -> None:
    url = server.make_url(WEBHOOK_PATH)
    body = encode(make_body([make_alert(1)]))
    async with aiohttp.ClientSession() as anonymous, anonymous.post(url, data=body) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    wrong_token = {"Authorization": "Bearer wrong"}
    async with aiohttp.ClientSession(headers=wrong_token) as wrong, wrong.post(url, data=body) as r:
        assert r.status == 401
    status, answer = await post(http, server, b"not json")
    assert status == 400 and "invalid JSON" in answer["error"]
    status, answer = await post(http, server, json.dumps({"version": "4"}).encode())
    assert status == 400 and any("alerts" in d for d in answer["details"])
    # valid RFC 3339 times that leave the years 1..9999 once converted to UTC
    for starts, ends in [
        ("0001-01-01T00:00:00+01:00", None),
        ("9999-12-31T23:59:59-01:00", None),
        ("2026-01-01T00:00:00Z", "9999-12-31T23:59:59.9999-05:00"),
    ]:
        alert = make_alert(1, ends_at=None)
        alert["startsAt"] = starts
        if ends is not None:
            alert["endsAt"] = ends
        status, answer = await post(http, server, encode(make_body([make_alert(2), alert])))
        assert status == 400, (starts, ends, answer)
        assert answer["details"] == ["alerts.1: startsAt/endsAt outside the years 1 to 9999 in UTC"]
    huge = encode(make_body([make_alert(i) for i in range(1000)]))
    assert len(huge) > 64 * 1024
    status, answer = await post(http, server, huge)
    assert status == 413 and "larger" in answer["error"]

    # chunked upload without Content-Length is capped too
    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(huge), 4096):
            yield huge[start : start + 4096]

    async with http.post(url, data=chunks()) as response:
        assert response.status == 413
    # nothing of the rejected bodies was stored
    async with http.get(server.make_url("/api/v1/alerts")) as response:
        assert (await response.json())["items"] == []


async def test_read_api_filters_and_pages(server: TestServer, http: aiohttp.ClientSession) -> None:
    alerts = [make_alert(i, labels={"priority": "P0" if i % 3 == 0 else "P2"}) for i in range(1, 8)]
    alerts.append(make_alert(20, labels={"trainingjob": "other"}))
    await post(http, server, encode(make_body(alerts)))
    await post(
        http,
        server,
        encode(make_body([make_alert(1, status="resolved", labels={"priority": "P2"})])),
    )
    await server.app[GATEWAY_KEY].settle()  # priorities are the policy's, set after the answer

    async def get(query: str) -> dict:
        async with http.get(server.make_url(f"/api/v1/alerts?{query}")) as response:
            assert response.status == 200, await response.text()
            return await response.json()

    assert {i["labels"]["node"] for i in (await get("priority=P0"))["items"]} == {
        "gpu-0003",
        "gpu-0006",
    }
    assert [i["id"] for i in (await get("status=resolved"))["items"]] == [1]
    assert len((await get("job=other"))["items"]) == 1
    assert len((await get("job=ml/llama-70b"))["items"]) == 7
    page1 = await get("limit=3")
    page2 = await get(f"limit=3&before={page1['next_before']}")
    ids = [i["id"] for i in page1["items"] + page2["items"]]
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == 6
    for bad in ("status=maybe", "priority=P9", "limit=0", "limit=x", "before=-1"):
        async with http.get(server.make_url(f"/api/v1/alerts?{bad}")) as response:
            assert response.status == 400, bad
    async with http.get(server.make_url("/api/v1/alerts/1")) as response:
        detail = await response.json()
    assert [e["kind"] for e in detail["events"]] == ["firing", "resolved"]
    async with http.get(server.make_url("/api/v1/alerts/999")) as response:
        assert response.status == 404
    # ids the store cannot hold (64-bit) or that are no number: 400, not a 500
    for bad in ("100000000000000000000", "9223372036854775808", "0", "-1", "1.5", "٣", "x"):
        async with http.get(server.make_url(f"/api/v1/alerts/{bad}")) as response:
            assert response.status == 400, bad
            assert "alert id" in (await response.json())["error"]
        async with http.post(server.make_url(f"/api/v1/alerts/{bad}/ack"), json={"by": "a"}) as r:
            assert r.status == 400, bad
    async with http.get(server.make_url("/api/v1/alerts/9223372036854775807")) as response:
        assert response.status == 404


async def test_console_notifications_are_recorded_and_sent(
    server: TestServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    import asyncio

    async def sent(count: int) -> list[dict[str, Any]]:
        for _ in range(100):
            async with http.get(server.make_url("/api/v1/notifications?status=sent")) as answer:
                items: list[dict[str, Any]] = (await answer.json())["items"]
            if len(items) >= count:
                break
            await asyncio.sleep(0.05)
        return items

    await post(http, server, encode(make_body([make_alert(1)])))
    await post(http, server, encode(make_body([make_alert(2, name="NodeDown")])))  # 2 incidents
    # The firing cards first: a resolve planned in the same batch as its firing is one
    # RESOLVED card for the incident (docs/policy.md), which is not what this test is about.
    await sent(2)
    await post(http, server, encode(make_body([make_alert(1, status="resolved")])))
    await post(http, server, encode(make_body([make_alert(1, status="resolved")])))  # replay
    items = await sent(3)
    assert sorted(i["payload"]["event"] for i in items) == ["firing", "firing", "resolved"]
    lines = (tmp_path / "console.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert any("RESOLVED GPUXidError" in json.loads(line)["text"] for line in lines)


async def test_health_ready_and_metrics(server: TestServer, http: aiohttp.ClientSession) -> None:
    await post(http, server, encode(make_body([make_alert(1)])))
    await post(http, server, encode(make_body([make_alert(1)])))
    await post(http, server, b"[")
    async with http.get(server.make_url("/healthz")) as response:
        assert response.status == 200
    async with http.get(server.make_url("/readyz")) as response:
        assert response.status == 200
    async with http.get(server.make_url("/metrics")) as response:
        text = await response.text()
        assert response.headers["Content-Type"].startswith("text/plain")
    assert 'trainsentry_webhook_receipts_total{outcome="stored"} 1.0' in text
    # the same all-firing body again: an unchanged resend of its group (store/resends.py)
    assert 'trainsentry_webhook_receipts_total{outcome="resend"} 1.0' in text
    assert 'trainsentry_webhook_receipts_total{outcome="rejected"} 1.0' in text
    assert "trainsentry_alerts_duplicate_total 1.0" in text
    assert "trainsentry_intake_latency_seconds_count 2.0" in text
    assert "trainsentry_outbox_oldest_pending_age_seconds" in text


def gauge(metrics_text: str, series: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


async def metrics_after_one_webhook(
    db_url: str,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    wait: float,
    shows: Callable[[str], bool] = lambda _text: True,
    **parts: Any,
) -> str:
    """Starts a gateway (`parts`: create_app's plan, notifiers, ...), posts one webhook with a
    P0 and two P3 alerts, waits `wait` seconds and returns its /metrics text: the first that
    `shows` accepts within 5 s more, else the last."""
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        console_file=tmp_path / "console.jsonl",
        webhook_token=SecretStr(TOKEN),
    )
    server = TestServer(create_app(settings, **parts), host="127.0.0.1")
    await server.start_server()
    try:
        alerts = [make_alert(i, labels={"priority": p}) for i, p in enumerate(["P0", "P3", "P3"])]
        assert (await post(http, server, encode(make_body(alerts))))[0] == 200
        await asyncio.sleep(wait)
        deadline = asyncio.get_running_loop().time() + 5.0
        while True:
            async with http.get(server.make_url("/metrics")) as response:
                text = await response.text()
            if shows(text) or asyncio.get_running_loop().time() >= deadline:
                return text
            await asyncio.sleep(0.1)
    finally:
        await close_in_process(server)


async def test_metrics_show_how_long_changes_wait_for_the_policy_by_urgency(
    db_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async def policy_down(conn: object, changes: object, now: object) -> int:
        raise RuntimeError("policy down")  # every batch fails: changes stay in the inbox

    text = await metrics_after_one_webhook(db_url, tmp_path, http, 1.2, plan=policy_down)
    age = "trainsentry_policy_inbox_oldest_age_seconds"
    assert gauge(text, "trainsentry_policy_inbox_depth") == 3
    assert 1.0 <= gauge(text, f'{age}{{urgency="P0"}}') < 60
    assert 1.0 <= gauge(text, f'{age}{{urgency="P3"}}') < 60
    assert gauge(text, f'{age}{{urgency="P1"}}') == gauge(text, f'{age}{{urgency="P2"}}') == 0


class ChannelDown:
    name = "down"

    async def send(self, notification: OutboundNotification) -> Receipt:
        raise RetryableError("connection refused")

    async def aclose(self) -> None:
        return None


async def test_metrics_show_how_long_notifications_wait_by_priority(
    db_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async def plan_by_label(
        conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime
    ) -> int:
        drafts = [
            NotificationDraft(
                channel="down",
                kind="alert",
                priority=Priority(change.alert.labels["priority"]),
                idempotency_key=f"down-{change.alert_id}",
                payload={},
                alert_id=change.alert_id,
            )
            for change in changes
        ]
        return await insert_notifications(conn, drafts, now)

    pending = 'trainsentry_outbox_depth{channel="down",status="pending"}'
    # The outbox keeps retrying the channel: a row is `sending` during each attempt (on a loaded
    # machine, long enough for a reading to see it); the ages are of the pending ones.
    text = await metrics_after_one_webhook(
        db_url,
        tmp_path,
        http,
        1.5,
        lambda text: f"{pending} 3.0" in text.splitlines(),
        plan=plan_by_label,
        notifiers={"down": ChannelDown()},
    )
    age = "trainsentry_outbox_oldest_pending_age_seconds"
    assert gauge(text, pending) == 3
    assert 1.0 <= gauge(text, f'{age}{{priority="P0"}}') < 60
    assert 1.0 <= gauge(text, f'{age}{{priority="P3"}}') < 60
    assert gauge(text, f'{age}{{priority="P1"}}') == gauge(text, f'{age}{{priority="P2"}}') == 0


class ChannelStuck:
    """A channel whose sends never finish (a provider that accepts the connection and never
    answers): each row stays `sending` for the whole test."""

    name = "down"

    async def send(self, notification: OutboundNotification) -> Receipt:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        return None


async def test_a_notification_stuck_mid_send_still_ages(
    db_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A notification being sent is not sent yet: its age counts (it read 0 while `sending`,
    so a P0 whose every try hangs kept TrainsentryUrgentNotificationsLate from firing)."""

    async def plan_p0(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        drafts = [
            NotificationDraft(
                channel="down",
                kind="alert",
                priority=Priority.P0,
                idempotency_key=f"stuck-{change.alert_id}",
                payload={},
                alert_id=change.alert_id,
            )
            for change in changes
            if change.alert.labels["priority"] == "P0"
        ]
        return await insert_notifications(conn, drafts, now)

    sending = 'trainsentry_outbox_depth{channel="down",status="sending"}'
    text = await metrics_after_one_webhook(
        db_url,
        tmp_path,
        http,
        1.5,
        lambda text: f"{sending} 1.0" in text.splitlines(),
        plan=plan_p0,
        notifiers={"down": ChannelStuck()},
    )
    assert gauge(text, sending) == 1
    assert 1.0 <= gauge(text, 'trainsentry_outbox_oldest_pending_age_seconds{priority="P0"}') < 60


fuzz_bodies = st.one_of(
    st.binary(max_size=2048),
    st.builds(
        lambda alerts, status: json.dumps(
            {"version": "4", "status": status, "alerts": alerts}
        ).encode(),
        st.lists(
            st.dictionaries(
                st.sampled_from(["status", "labels", "startsAt", "endsAt", "fingerprint", "x"]),
                st.one_of(
                    st.text(max_size=10),
                    st.integers(),
                    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
                    st.sampled_from(["firing", "resolved", "2026-11-20T03:00:00Z"]),
                ),
            ),
            max_size=4,
        ),
        st.sampled_from(["firing", "resolved", "x"]),
    ),
)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_fuzzed_bodies_never_get_a_5xx(
    server: TestServer, http: aiohttp.ClientSession
) -> None:
    statuses: list[int] = []

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(fuzz_bodies)
    def one(raw: bytes) -> None:
        statuses.append(raw_status(raw))

    import asyncio

    loop = asyncio.get_running_loop()

    def raw_status(raw: bytes) -> int:
        async def send() -> int:
            async with http.post(server.make_url(WEBHOOK_PATH), data=raw) as response:
                await response.read()
                return response.status

        return asyncio.run_coroutine_threadsafe(send(), loop).result(timeout=30)

    await asyncio.to_thread(one)
    assert statuses and all(status < 500 for status in statuses), sorted(set(statuses))
    assert any(status == 400 for status in statuses)
    async with http.get(server.make_url("/healthz")) as response:
        assert response.status == 200


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
async def test_store_outage_answers_503_then_recovers(
    server: TestServer, http: aiohttp.ClientSession, db_url: str
) -> None:
    """PostgreSQL stops accepting connections: 503 (Alertmanager retries), never a 500."""
    import asyncpg

    name = db_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(db_url.rsplit("/", 1)[0] + "/test")
    try:
        await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
        )
        status, answer = await post(http, server, encode(make_body([make_alert(1)])))
        assert status == 503 and "retry" in answer["error"]
        async with http.get(server.make_url("/readyz")) as response:
            assert response.status == 503
        for path in ("/api/v1/alerts", "/api/v1/alerts/1", "/api/v1/notifications"):
            async with http.get(server.make_url(path)) as response:
                assert response.status == 503, path
                assert "retry" in (await response.json())["error"]
        await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        status, answer = await post(http, server, encode(make_body([make_alert(1)])))
        assert status == 200 and answer["new"] == 1
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        await admin.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_sqlite_locked_by_another_writer_answers_503_then_recovers(
    server: TestServer, http: aiohttp.ClientSession, db_url: str
) -> None:
    """Another process holds SQLite's write lock past the busy timeout (an admin's open
    transaction): 503 so Alertmanager retries, and the intake works again once it is gone."""
    import sqlite3
    import time

    path = db_url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
    try:
        # Off the event loop: the gateway may be finishing a transaction of its own, and it
        # needs the loop to commit before this can take the lock.
        await asyncio.to_thread(holder.execute, "BEGIN EXCLUSIVE")
        started = time.monotonic()
        status, answer = await post(http, server, encode(make_body([make_alert(1)])))
        assert status == 503 and "database is locked" in answer["error"], answer
        assert time.monotonic() - started < 15  # one busy timeout (10 s), not several
        await asyncio.to_thread(holder.execute, "COMMIT")
        status, answer = await post(http, server, encode(make_body([make_alert(1)])))
        assert status == 200 and answer["new"] == 1
    finally:
        holder.close()
