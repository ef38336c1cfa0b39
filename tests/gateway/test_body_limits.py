"""Slow and vanishing clients against the real gateway process (issue 19 finding 9): a body
must arrive within `gateway.body_timeout_s`, whoever sends it, and the gateway keeps
answering everyone else meanwhile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gateway.test_http_edge import CALLBACK_ENV, CARD_PATH
from tests.support.gateway_process import start_gateway
from tests.support.raw_http import raw_request
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body

TOKEN = "s3cret-token"
DEADLINE_S = 2.0
WEBHOOK = "/api/v1/alertmanager"


def start(tmp_path: Path, **gateway_settings: object) -> RunningServer:
    config = tmp_path / "config.yaml"
    callback = {"path": CARD_PATH, "encrypt_key_env": "FEISHU_ENCRYPT_KEY"}
    config.write_text(
        yaml.safe_dump(
            {
                "gateway": {"body_timeout_s": DEADLINE_S, **gateway_settings},
                "channels": {"feishu_app": {"app_id": "cli_x", "callback": callback}},
            }
        )
    )
    return start_gateway(
        tmp_path,
        f"sqlite:///{tmp_path / 'store.db'}",
        token=TOKEN,
        config=config,
        env=CALLBACK_ENV,
        log_level="DEBUG",
    )


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningServer]:
    with start(tmp_path) as server:
        yield server


async def trickle(port: int, path: str, auth: bool, give_up_s: float) -> tuple[float, bytes]:
    """Sends headers promising 1000 bytes, then one byte every 0.25 s: (seconds until the
    server closed the connection, what it answered)."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
    if auth:
        head += f"Authorization: Bearer {TOKEN}\r\n"
    return await send_slowly(port, head.encode() + b"\r\n", b"{", give_up_s)


async def send_slowly(
    port: int, first: bytes, then: bytes, give_up_s: float
) -> tuple[float, bytes]:
    """Sends `first`, then `then` every 0.25 s until the server closes the connection or
    `give_up_s` pass: (seconds until it closed, what it answered)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(first)
    answer = b""
    try:
        while time.monotonic() - started < give_up_s:
            writer.write(then)
            await writer.drain()
            try:
                chunk = await asyncio.wait_for(reader.read(65536), timeout=0.25)
            except TimeoutError:
                continue
            answer += chunk
            if not chunk:
                break
    except ConnectionError:
        pass
    closed_after = time.monotonic() - started
    writer.close()
    return closed_after, answer


def test_trickling_bodies_are_cut_at_the_deadline_and_the_gateway_keeps_answering(
    gateway: RunningServer,
) -> None:
    async def scenario() -> tuple[list[tuple[float, bytes]], list[int]]:
        clients = [trickle(gateway.port, CARD_PATH, False, 15) for _ in range(10)]
        clients += [trickle(gateway.port, WEBHOOK, False, 15) for _ in range(5)]
        clients += [trickle(gateway.port, WEBHOOK, True, 15) for _ in range(5)]
        running = asyncio.gather(*clients)
        await asyncio.sleep(0.5)
        statuses = []
        for _ in range(3):  # while all 20 trickle: health and a real webhook are answered
            health = await asyncio.to_thread(raw_request, gateway.port, "GET", "/healthz")
            body = encode(make_body([make_alert()]))
            auth = [("Authorization", f"Bearer {TOKEN}")]
            hook = await asyncio.to_thread(raw_request, gateway.port, "POST", WEBHOOK, auth, body)
            statuses += [health.status, hook.status]
        return await running, statuses

    results, statuses = asyncio.run(scenario())
    assert statuses == [200] * 6
    for closed_after, answer in results:
        assert closed_after < DEADLINE_S + 1.5, (closed_after, answer[:200])
    answers = [answer.split(b"\r\n", 1)[0] for _, answer in results]
    assert answers[:10] == [b"HTTP/1.1 408 Request Timeout"] * 10, answers
    assert answers[10:15] == [b"HTTP/1.1 401 Unauthorized"] * 5, answers  # closed at once
    assert answers[15:] == [b"HTTP/1.1 408 Request Timeout"] * 5, answers
    assert "level=error" not in gateway.logs(), gateway.logs()[-3000:]


async def trickle_head(port: int, give_up_s: float) -> tuple[float, bytes]:
    """Sends a request line, then one header byte every 0.25 s and never ends the head."""
    first = f"POST {WEBHOOK} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode()
    return await send_slowly(port, first, b"a", give_up_s)


def test_trickling_headers_are_cut_at_the_idle_timeout(tmp_path: Path) -> None:
    with start(tmp_path, idle_timeout_s=DEADLINE_S) as gateway:

        async def scenario() -> list[tuple[float, bytes]]:
            return await asyncio.gather(*(trickle_head(gateway.port, 15) for _ in range(5)))

        results = asyncio.run(scenario())
        health = raw_request(gateway.port, "GET", "/healthz")
    assert health.status == 200
    for closed_after, answer in results:
        assert DEADLINE_S - 0.5 < closed_after < DEADLINE_S + 2, (closed_after, answer[:200])
        assert answer == b""  # no request was ever complete: closed without an answer


def test_a_client_leaving_mid_body_is_a_debug_line(gateway: RunningServer) -> None:
    async def leave(path: str) -> None:
        _reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
        head += f"Authorization: Bearer {TOKEN}\r\n\r\n"
        writer.write(head.encode() + b'{"version": "4"')
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.close()
        await writer.wait_closed()

    async def scenario() -> None:
        await asyncio.gather(*(leave(path) for path in (WEBHOOK, CARD_PATH) * 3))
        await asyncio.sleep(1.0)

    asyncio.run(scenario())
    logs = gateway.logs()
    assert "level=error" not in logs and "Traceback" not in logs, logs[-3000:]
    gone = [line for line in logs.splitlines() if "client went away mid-request" in line]
    assert len(gone) == 6 and all("level=debug" in line for line in gone), gone


def test_more_bodies_at_once_than_allowed_get_503_with_retry_after(tmp_path: Path) -> None:
    with start(tmp_path, max_body_readers=3) as gateway:

        async def scenario() -> list[int]:
            slow = asyncio.gather(*(trickle(gateway.port, WEBHOOK, True, 5) for _ in range(3)))
            await asyncio.sleep(0.5)
            body = encode(make_body([make_alert()]))
            auth = [("Authorization", f"Bearer {TOKEN}")]
            hook = await asyncio.to_thread(raw_request, gateway.port, "POST", WEBHOOK, auth, body)
            assert hook.headers.get("retry-after") == "1", hook
            health = await asyncio.to_thread(raw_request, gateway.port, "GET", "/healthz")
            await slow  # the slow ones are cut at the deadline: room again
            again = await asyncio.to_thread(raw_request, gateway.port, "POST", WEBHOOK, auth, body)
            return [hook.status, health.status, again.status]

        assert asyncio.run(scenario()) == [503, 200, 200]
