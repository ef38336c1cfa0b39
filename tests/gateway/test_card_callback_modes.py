"""Feishu card callbacks with and without an encrypt key, in the real `trainsentry gateway`
process with Feishu as the contract server (issue 32 finding 10).

Without an encrypt key Feishu neither encrypts nor signs a callback: the static verification
token in the body is the only proof, and the presser's open_id and the event id are whatever
the caller writes. The gateway says so at start (one WARNING line) and in /metrics
(`trainsentry_feishu_callbacks_unsigned 1`). With an encrypt key an unsigned request is
refused, and the one Feishu signs (the contract server's `callback_request`) is accepted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import start_gateway
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body

pytestmark = pytest.mark.e2e

CARD_PATH = "/api/v1/feishu/card"
VERIFY = "verification-token-1"
ENCRYPT_KEY = "encrypt-key-1"
ENV = {
    "FEISHU_APP_SECRET": "app-secret",
    "FEISHU_VERIFICATION_TOKEN": VERIFY,
    "FEISHU_ENCRYPT_KEY": ENCRYPT_KEY,
}


def config(tmp_path: Path, feishu: FeishuContractServer, signed: bool) -> Path:
    callback = f"{{path: {CARD_PATH}, verification_token_env: FEISHU_VERIFICATION_TOKEN"
    callback += ", encrypt_key_env: FEISHU_ENCRYPT_KEY}" if signed else "}"
    path = tmp_path / "config.yaml"
    path.write_text(
        "channels:\n"
        "  feishu_app:\n"
        f"    base_url: {feishu.base_url}\n"
        "    app_id: cli_app\n"
        "    chats: {oc_oncall: [P0, P1, P2, P3]}\n"
        f"    callback: {callback}\n"
    )
    return path


def unsigned_warnings(gateway: RunningServer) -> list[str]:
    return [
        line
        for line in gateway.logs().splitlines()
        if "level=warning" in line and "feishu_callbacks_unsigned" in line
    ]


async def get_text(gateway: RunningServer, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(gateway.url + path) as answer:
        assert answer.status == 200
        return await answer.text()


async def post_alert_and_press(
    gateway: RunningServer, feishu: FeishuContractServer, encrypt_key: str | None
) -> tuple[int, dict[str, Any]]:
    """Posts one P1 alert, waits for its card, presses Acknowledge on it as someone who
    chose their own open_id and event id, sent as `encrypt_key` says."""
    async with aiohttp.ClientSession() as http:
        body = encode(make_body([make_alert(1, labels={"priority": "P1"})]))
        async with http.post(gateway.url + "/api/v1/alertmanager", data=body) as answer:
            assert answer.status == 200, await answer.text()

        await eventually(lambda: len(feishu.messages) == 1)
        message_id = next(iter(feishu.messages))
        press = feishu.press(
            message_id, "Acknowledge", verification_token=VERIFY,
            open_id="ou_chosen_by_caller", event_id="made-up-event-1",
        )  # fmt: skip
        headers, raw = feishu.callback_request(press, encrypt_key=encrypt_key)
        async with http.post(gateway.url + CARD_PATH, data=raw, headers=headers) as answer:
            return answer.status, await answer.json()


async def test_callbacks_without_an_encrypt_key_warn_once_and_show_in_metrics(
    tmp_path: Path,
) -> None:
    async with FeishuContractServer(apps={"cli_app": "app-secret"}) as feishu:
        path = config(tmp_path, feishu, signed=False)
        db = f"sqlite:///{tmp_path / 'store.db'}"
        with start_gateway(tmp_path, db, config=path, env=ENV) as gateway:
            [line] = unsigned_warnings(gateway)
            assert "encrypt_key_env" in line and VERIFY not in line
            assert "trainsentry_feishu_callbacks_unsigned 1.0" in await get_text(
                gateway, "/metrics"
            )
            # what that mode trusts: the token alone; open_id and event id are the caller's
            status, answer = await post_alert_and_press(gateway, feishu, encrypt_key=None)
            assert status == 200 and answer["toast"]["type"] == "success", answer
            assert len(unsigned_warnings(gateway)) == 1  # once, not per callback


async def test_with_an_encrypt_key_only_the_signed_callback_is_accepted(tmp_path: Path) -> None:
    async with FeishuContractServer(apps={"cli_app": "app-secret"}) as feishu:
        path = config(tmp_path, feishu, signed=True)
        db = f"sqlite:///{tmp_path / 'store.db'}"
        with start_gateway(tmp_path, db, config=path, env=ENV) as gateway:
            assert unsigned_warnings(gateway) == []
            assert "trainsentry_feishu_callbacks_unsigned 0.0" in await get_text(
                gateway, "/metrics"
            )
            status, _ = await post_alert_and_press(gateway, feishu, encrypt_key=None)
            assert status == 401
            message_id = next(iter(feishu.messages))
            press = feishu.press(message_id, "Acknowledge", verification_token=VERIFY)
            headers, raw = feishu.callback_request(press, encrypt_key=ENCRYPT_KEY)
            async with (
                aiohttp.ClientSession() as http,
                http.post(gateway.url + CARD_PATH, data=raw, headers=headers) as answer,
            ):
                assert answer.status == 200, await answer.text()
                assert (await answer.json())["toast"]["type"] == "success"
