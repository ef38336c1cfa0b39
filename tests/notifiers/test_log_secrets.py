"""No secret reaches the gateway's log: the real `trainsentry gateway` process, real sends.

The gateway runs as a subprocess with a Feishu custom bot, a generic pager webhook and a
voice gateway (the phone channel's `webhook` provider), each given secret-looking URLs
(tokens in the path and the query string) and secret headers, as docs/channels.md
configures them. Every line the process writes, at INFO and at DEBUG, is searched for every
secret, on the path where all providers accept and on the path where each one fails
(refusal, 5xx, connection refused). httpx logs each request's full URL at INFO
("HTTP Request: POST http://…/open-apis/bot/v2/hook/<token>"), which is how webhook tokens
leaked (issue 19, item 3).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import start_gateway
from tests.support.paging_config import voice_gateway
from tests.support.phone_server import PhoneContractServer
from tests.support.ports import free_port
from tests.support.webhook_factory import bodies_by_group, encode, make_alert

pytestmark = pytest.mark.e2e

API_TOKEN = "S3CR3T-api-token-4b1d"
BOT_HOOK = "S3CR3T-bot-hook-9f2e7c1a"
BOT_SIGN = "S3CR3T-bot-sign-55aa"
PAGER_PATH = "S3CR3T-pager-path-0c0ffee"
PAGER_QUERY = "S3CR3T-pager-query-beef"
PAGER_BEARER = "S3CR3T-pager-bearer-1234"
DOWN_PATH = "S3CR3T-down-path-7777"
VOICE_QUERY = "S3CR3T-voice-query-abcd"
VOICE_KEY = "S3CR3T-voice-key-e5e5"
SECRETS = (
    API_TOKEN, BOT_HOOK, BOT_SIGN, PAGER_PATH, PAGER_QUERY, PAGER_BEARER, DOWN_PATH,
    VOICE_QUERY, VOICE_KEY,
)  # fmt: skip


class Pager:
    """A paging webhook whose URL carries a token in its path: 200, or when `failing` 500
    once, then 404 with a body that repeats the request's path and query."""

    def __init__(self, failing: bool) -> None:
        self.failing = failing
        self.requests: list[tuple[str, str]] = []  # (path token, Authorization)
        self.base_url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(
            (request.match_info["token"], request.headers.get("Authorization", ""))
        )
        if self.failing and len(self.requests) == 1:
            return web.Response(status=500, text="pager down")
        if self.failing:  # as many web frameworks do, the error page echoes the request
            return web.Response(status=404, text=f"Cannot POST {request.path_qs}")
        return web.json_response({"ok": True})

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Pager]:
        app = web.Application()
        app.router.add_post("/pager/{token}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        try:
            yield self
        finally:
            await runner.cleanup()


def write_config(tmp_path: Path) -> Path:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {"routing": {"always": ["console", "pager", "down"], "paging_channels": ["phone"]}}
        )
    )
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "gateway": {"policy_file": str(policy)},
                "webhooks": {
                    "pager": {"url_env": "PAGER_URL", "bearer_token_env": "PAGER_BEARER"},
                    "down": {"url_env": "DOWN_URL", "timeout_s": 2},
                },
                "channels": {
                    "feishu_bot": {
                        "groups": {
                            "all": {
                                "priorities": ["P0", "P1", "P2", "P3"],
                                "url_env": "BOT_URL",
                                "secret_env": "BOT_SIGN",
                            }
                        }
                    },
                    "phone": voice_gateway(),
                    "escalation": {
                        "min_priority": "P0",
                        "layers": [
                            {
                                "name": "primary",
                                "members": [{"name": "alice", "phone": "+8613800000001"}],
                            }
                        ],
                    },
                },
            }
        )
    )
    return config


async def post_alerts(url: str) -> None:
    alerts = [
        make_alert(0, labels={"trainingjob": "llama", "priority": "P0"}),
        make_alert(1, labels={"trainingjob": "gpt", "priority": "P1"}),
        make_alert(2, labels={"trainingjob": "bert", "priority": "P2"}),
    ]
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for body in bodies_by_group(alerts):  # three jobs: three groups, three incidents
            async with session.post(f"{url}/api/v1/alertmanager", data=encode(body)) as response:
                assert response.status == 200, await response.text()


@pytest.mark.parametrize(
    ("failing", "level"),
    [(False, "INFO"), (True, "INFO"), (False, "DEBUG"), (True, "DEBUG")],
    ids=["success-info", "failure-info", "success-debug", "failure-debug"],
)
async def test_no_secret_in_any_log_line(tmp_path: Path, failing: bool, level: str) -> None:
    # failure: Feishu expects another signing secret (19021), the pager answers 500 then 404
    # echoing its URL, the voice
    # gateway 500 then 403, and "down" refuses connections; success: all but "down" accept.
    hooks = {BOT_HOOK: Hook(secret="another-secret" if failing else BOT_SIGN)}
    feishu = FeishuContractServer(hooks=hooks)
    phones = PhoneContractServer(gateway_token=VOICE_KEY, fail_next=[500, 403] if failing else [])
    async with feishu, phones, Pager(failing).running() as pager:
        env: dict[str, Any] = {
            "TRAINSENTRY_WEBHOOK_TOKEN": API_TOKEN,
            "BOT_URL": feishu.hook_url(BOT_HOOK),
            "BOT_SIGN": BOT_SIGN,
            "PAGER_URL": f"{pager.base_url}/pager/{PAGER_PATH}?key={PAGER_QUERY}",
            "PAGER_BEARER": PAGER_BEARER,
            "DOWN_URL": f"http://127.0.0.1:{free_port()}/hook/{DOWN_PATH}",
            "VOICE_URL": f"{phones.base_url}/voice/call?accessKey={VOICE_QUERY}",
            "VOICE_KEY": VOICE_KEY,
        }
        config = write_config(tmp_path)

        def start() -> Any:
            db = f"sqlite:///{tmp_path / 'store.db'}"
            return start_gateway(tmp_path, db, config=config, env=env, log_level=level)

        gateway = await asyncio.to_thread(start)
        try:
            await post_alerts(gateway.url)
            if failing:
                await eventually(
                    lambda: len(pager.requests) >= 2, 60, 0.1, what="a pager retry", not_yet=()
                )
                await eventually(
                    lambda: len(phones.refused) >= 2, 60, 0.1, what="two refused calls", not_yet=()
                )
                await eventually(
                    lambda: "feishu_bot_misconfigured" in gateway.logs(),
                    60,
                    0.1,
                    what="the bot refusal",
                    not_yet=(),
                )
            else:
                await eventually(
                    lambda: len(pager.requests) >= 3, 60, 0.1, what="three pages", not_yet=()
                )
                await eventually(
                    lambda: len(phones.gateway_calls) >= 1,
                    60,
                    0.1,
                    what="the voice call",
                    not_yet=(),
                )
                await eventually(
                    lambda: len(feishu.accepted[BOT_HOOK]) >= 3,
                    60,
                    0.1,
                    what="three cards",
                    not_yet=(),
                )
            await asyncio.sleep(1.0)  # retries of "down" and any late log lines
        finally:
            await asyncio.to_thread(gateway.stop)
        log = gateway.logs()

    # the secrets really were used, so a clean log means they were kept out of it
    assert all(token == PAGER_PATH for token, _ in pager.requests)
    assert all(auth == f"Bearer {PAGER_BEARER}" for _, auth in pager.requests)
    lines = log.splitlines()
    assert len(lines) > 5, log
    leaks = [(secret, line) for line in lines for secret in SECRETS if secret in line]
    assert not leaks, "\n".join(f"{secret}: {line}" for secret, line in leaks[:20])
