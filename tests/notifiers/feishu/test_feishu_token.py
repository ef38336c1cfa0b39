"""The tenant_access_token endpoint: a rate limit or a 5xx is retried, only a credential
refusal is permanent (issue 19, item 7).

Answers are Feishu's documented ones (contract server, tests/support/feishu_server.py):
"Rate limits" (server-docs/api-call-guide/frequency-control): HTTP 429, or 400 from older
APIs, code 99991400 "request trigger frequency limit", `x-ogw-ratelimit-reset` seconds; the
token endpoint refuses a wrong secret with HTTP 400 code 10014 "app secret invalid" and an
unknown app_id with code 10003 "invalid param".
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer, rate_limited
from tests.support.gateway_process import start_gateway
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.notifiers.base import PermanentError, RateLimitedError, RetryableError
from trainsentry.notifiers.feishu.app import FeishuAppClient

APP_ID, APP_SECRET = "cli_token_test", "app-secret-value"
API_TOKEN = "token-test-api-token"


@pytest.fixture
async def server() -> AsyncIterator[FeishuContractServer]:
    async with FeishuContractServer(apps={APP_ID: APP_SECRET}) as srv:
        yield srv


def answers() -> dict[str, Callable[[], web.Response]]:
    return {
        "429-99991400": lambda: rate_limited(429, reset_s=3),
        "400-99991400": lambda: rate_limited(400, reset_s=3),
        # the message service's documented limit code ("Rate limits": 11232), were the token
        # endpoint to answer it
        "200-11232": lambda: web.json_response({"code": 11232, "msg": "frequency limited"}),
        "500": lambda: web.json_response({"code": 500, "msg": "internal error"}, status=500),
        "503-html": lambda: web.Response(status=503, text="<html>busy</html>"),
        "200-no-token": lambda: web.json_response({"code": 0, "msg": "ok"}),
    }


@pytest.mark.parametrize("answer", sorted(answers()))
async def test_token_trouble_is_retryable_and_the_next_try_sends(
    server: FeishuContractServer, answer: str
) -> None:
    server.token_answers.append(answers()[answer]())
    client = FeishuAppClient(server.base_url, APP_ID, APP_SECRET)
    try:
        with pytest.raises((RetryableError, RateLimitedError)) as raised:
            await client.send_message("oc_chat", "text", {"text": "first try"})
        assert raised.value.retryable
        if "11232" in answer or "99991400" in answer:
            assert isinstance(raised.value, RateLimitedError)
        if answer.endswith("99991400"):
            assert isinstance(raised.value, RateLimitedError)
            assert raised.value.code == 99991400
            assert raised.value.retry_after == 3.0  # x-ogw-ratelimit-reset
        await client.send_message("oc_chat", "text", {"text": "second try"})
    finally:
        await client.aclose()
    assert [json.loads(m["content"])["text"] for m in server.messages.values()] == ["second try"]
    assert server.token_requests == 2


@pytest.mark.parametrize(
    ("app_id", "secret", "code"),
    [(APP_ID, "wrong-secret", 10014), ("cli_unknown", APP_SECRET, 10003)],
    ids=["wrong-secret", "unknown-app"],
)
async def test_credential_refusal_is_permanent(
    server: FeishuContractServer, app_id: str, secret: str, code: int
) -> None:
    client = FeishuAppClient(server.base_url, app_id, secret)
    try:
        with pytest.raises(PermanentError) as raised:
            await client.send_message("oc_chat", "text", {"text": "x"})
    finally:
        await client.aclose()
    assert raised.value.code == code
    assert ("token", code) in server.rejections
    assert not server.messages


# ---------------------------------------------------------------- the real gateway process


def gateway_config(tmp_path: Path, base_url: str) -> Path:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"routing": {"defaults": {p: ["feishu_app"] for p in (
        "P0", "P1", "P2", "P3")}}}))  # fmt: skip
    config = tmp_path / "gateway.yaml"
    app = {"base_url": base_url, "app_id": APP_ID, "chats": {"oc_oncall": ["P0", "P1", "P2"]}}
    config.write_text(
        yaml.safe_dump({"gateway": {"policy_file": str(policy)}, "channels": {"feishu_app": app}})
    )
    return config


def app_rows(db: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT status, attempts FROM notifications WHERE channel = 'feishu_app'"
        ).fetchall()
    return [(str(status), int(attempts)) for status, attempts in rows]


async def run_gateway(tmp_path: Path, server: FeishuContractServer, secret: str) -> Any:
    db = tmp_path / "store.db"
    env = {"TRAINSENTRY_WEBHOOK_TOKEN": API_TOKEN, "FEISHU_APP_SECRET": secret}
    config = gateway_config(tmp_path, server.base_url)
    gateway = await asyncio.to_thread(
        start_gateway, tmp_path, f"sqlite:///{db}", config=config, env=env
    )
    import aiohttp

    alert = make_alert(0, labels={"trainingjob": "llama", "priority": "P1"})
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        url = f"{gateway.url}/api/v1/alertmanager"
        async with session.post(url, data=encode(make_body([alert]))) as response:
            assert response.status == 200, await response.text()
    return gateway


@pytest.mark.e2e
async def test_gateway_delivers_the_card_through_token_rate_limits_and_5xx(
    tmp_path: Path, server: FeishuContractServer
) -> None:
    server.token_answers += [
        rate_limited(429, reset_s=1),
        rate_limited(400, reset_s=1),
        web.json_response({"code": 500, "msg": "internal error"}, status=503),
    ]
    gateway = await run_gateway(tmp_path, server, APP_SECRET)
    try:
        await eventually(lambda: len(server.messages) == 1, 60, 0.1, what="the card", not_yet=())
    except AssertionError:
        print(gateway.logs())
        raise
    finally:
        await asyncio.to_thread(gateway.stop)
    (message,) = server.messages.values()
    assert message["receive_id"] == "oc_oncall"
    assert message["msg_type"] == "interactive"
    assert server.token_requests == 4
    assert [status for status, _ in app_rows(tmp_path / "store.db")] == ["sent"]


@pytest.mark.e2e
async def test_gateway_gives_up_at_once_on_a_wrong_app_secret(
    tmp_path: Path, server: FeishuContractServer
) -> None:
    gateway = await run_gateway(tmp_path, server, "wrong-secret")
    try:
        await eventually(
            lambda: [s for s, _ in app_rows(tmp_path / "store.db")] == ["dead"],
            60,
            0.1,
            what="dead row",
            not_yet=(),
        )
        await asyncio.sleep(1.0)  # a retry, were there one, would come within a second or two
    finally:
        await asyncio.to_thread(gateway.stop)
    assert app_rows(tmp_path / "store.db") == [("dead", 1)]
    assert server.token_requests == 1
    assert not server.messages
