"""Slow and vanishing clients against the real gateway process (issue 19 finding 9): a body
must arrive within `gateway.body_timeout_s`, whoever sends it, and the gateway keeps
answering everyone else meanwhile."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
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


TRIGGERS = "/api/v1/hang-triggers"
PROBE_TOKEN = "probe-master-token"
# a job whose one rank's probe is on this host: its triggers come from 127.0.0.1
HANG_DIAGNOSIS = {"static_endpoints": {"team-a/gpt": ["127.0.0.1:9"]}}


def start(
    tmp_path: Path, diagnosis: dict[str, object] | None = None, **gateway_settings: object
) -> RunningServer:
    config = tmp_path / "config.yaml"
    callback = {"path": CARD_PATH, "encrypt_key_env": "FEISHU_ENCRYPT_KEY"}
    settings: dict[str, object] = {
        "gateway": {"body_timeout_s": DEADLINE_S, **gateway_settings},
        "channels": {"feishu_app": {"app_id": "cli_x", "callback": callback}},
    }
    if diagnosis is not None:
        settings["diagnosis"] = diagnosis
    config.write_text(yaml.safe_dump(settings))
    return start_gateway(
        tmp_path,
        f"sqlite:///{tmp_path / 'store.db'}",
        token=TOKEN,
        config=config,
        env={**CALLBACK_ENV, "TRAINSENTRY_PROBE_TOKEN": PROBE_TOKEN},
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


def trigger_body(rank: int) -> bytes:
    """What a stalled rank's probe posts (docs/probe.md, "The trigger")."""
    body = {
        "namespace": "team-a",
        "trainingjob": "gpt",
        "rank": rank,
        "local_rank": 0,
        "port": 9,
        "pg": "1",
        "pg_desc": "dp",
        "seq": 1000,
        "op": "all_reduce",
        "state": "started",
        "waited_s": 21.0,
        "threshold_s": 20.0,
        "world_size": 16384,
    }
    return json.dumps(body).encode()


def test_hang_triggers_take_none_of_the_webhooks_readers(tmp_path: Path) -> None:
    """A job's triggers arriving slowly (a 16,384-rank job's, on a loaded gateway) hold
    readers of their own (`gateway.max_trigger_readers`): with the webhooks' 2 readers
    and 3 triggers receiving their bodies, Alertmanager's webhook is still stored; and with
    2 webhooks trickling, a trigger is still taken. Before, triggers and webhooks shared
    `max_body_readers`: the webhook got 503."""
    with start(tmp_path, HANG_DIAGNOSIS, max_body_readers=2) as gateway:

        async def scenario() -> list[int]:
            slow = [trickle(gateway.port, TRIGGERS, True, 5) for _ in range(3)]
            trickling = asyncio.gather(*slow)
            await asyncio.sleep(0.5)
            body = encode(make_body([make_alert()]))
            auth = [("Authorization", f"Bearer {TOKEN}")]
            hook = await asyncio.to_thread(raw_request, gateway.port, "POST", WEBHOOK, auth, body)
            await trickling
            trickling = asyncio.gather(*(trickle(gateway.port, WEBHOOK, True, 5) for _ in range(2)))
            await asyncio.sleep(0.5)
            probe = [("Authorization", f"Bearer {PROBE_TOKEN}")]
            trigger = await asyncio.to_thread(
                raw_request, gateway.port, "POST", TRIGGERS, probe, trigger_body(3)
            )
            assert b'"hang"' in trigger.body, trigger
            await trickling
            return [hook.status, trigger.status]

        assert asyncio.run(scenario()) == [200, 202]


def test_more_triggers_at_once_than_their_readers_get_503(tmp_path: Path) -> None:
    """The triggers' own readers are bounded too: with 2 and 2 triggers receiving their
    bodies, a third gets 503 with Retry-After (the probe retries it), while a webhook is
    stored."""
    with start(tmp_path, HANG_DIAGNOSIS, max_body_readers=2, max_trigger_readers=2) as gateway:

        async def scenario() -> list[int]:
            slow = [trickle(gateway.port, TRIGGERS, True, 5) for _ in range(2)]
            trickling = asyncio.gather(*slow)
            await asyncio.sleep(0.5)
            probe = [("Authorization", f"Bearer {PROBE_TOKEN}")]
            third = await asyncio.to_thread(
                raw_request, gateway.port, "POST", TRIGGERS, probe, trigger_body(3)
            )
            assert third.headers.get("retry-after") == "1", third
            body = encode(make_body([make_alert()]))
            auth = [("Authorization", f"Bearer {TOKEN}")]
            hook = await asyncio.to_thread(raw_request, gateway.port, "POST", WEBHOOK, auth, body)
            await trickling
            return [third.status, hook.status]

        assert asyncio.run(scenario()) == [503, 200]


def listen_queue(port: int) -> int:
    """The listen queue of the socket listening on `port`, as the kernel reports it (`ss`:
    a listening socket's Send-Q is its backlog)."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[2])


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_the_listen_queue_takes_a_burst_of_connections(tmp_path: Path) -> None:
    """16,384 ranks' triggers are new connections within seconds: aiohttp's default listen
    queue (128) overflowed (125,336 overflows in the 25,000-post flood: each a SYN dropped
    and retried by the client 1 s, then 3 s later). The gateway listens with
    `gateway.listen_backlog` (1,024; the kernel caps it at net.core.somaxconn)."""
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    with start(tmp_path) as gateway:
        assert listen_queue(gateway.port) == min(1024, somaxconn)
    (tmp_path / "other").mkdir()
    with start(tmp_path / "other", listen_backlog=300) as gateway:
        assert listen_queue(gateway.port) == min(300, somaxconn)
