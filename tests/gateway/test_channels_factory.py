"""Settings -> channels: the documented example builds, secrets come only from the env."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml

from tests.notifiers.helpers import notification
from tests.support.feishu_server import FeishuContractServer, Hook
from trainsentry.alerts import Priority
from trainsentry.config import Settings, validate_settings
from trainsentry.config.channels import ChannelsSettings
from trainsentry.gateway.channels import build_channels
from trainsentry.gateway.sections import default_escalator
from trainsentry.notifiers.base import Notifier, PermanentError
from trainsentry.notifiers.feishu.bot import BotWebhook, FeishuBotNotifier, WebhookRouter
from trainsentry.notifiers.settings import SecretMissing

DOC = Path(__file__).resolve().parents[2] / "docs" / "channels.md"
ENV = {
    "FEISHU_BOT_CRITICAL_URL": "https://open.feishu.cn/open-apis/bot/v2/hook/a",
    "FEISHU_BOT_CRITICAL_SECRET": "SECRET-bot-1",
    "FEISHU_BOT_WARNING_URL": "https://open.feishu.cn/open-apis/bot/v2/hook/b",
    "FEISHU_BOT_LLAMA_URL": "https://open.feishu.cn/open-apis/bot/v2/hook/c",
    "FEISHU_BOT_LLAMA_SECRET": "s2",
    "FEISHU_APP_SECRET": "SECRET-app",
    "FEISHU_VERIFICATION_TOKEN": "vt",
    "FEISHU_ENCRYPT_KEY": "ek",
    "SMTP_PASSWORD": "pw",
}


def _documented() -> Settings:
    [block] = re.findall(r"```yaml\n(channels:.*?)```", DOC.read_text(), flags=re.S)
    return validate_settings(yaml.safe_load(block))


def _documented_settings() -> ChannelsSettings:
    channels = _documented().channels
    assert channels is not None
    return channels


async def test_documented_example_builds_every_channel() -> None:
    built = build_channels(_documented_settings(), ENV)
    escalator = default_escalator(_documented())
    try:
        assert set(built.notifiers) == {
            "feishu_bot",
            "feishu_app",
            "feishu_sheet",
            "phone",
            "email",
        }
        assert all(isinstance(n, Notifier) for n in built.notifiers.values())
        limits = built.outbox_rate_limits
        assert limits["feishu_bot"] == [(5, 1.0), (100, 60.0)]
        assert "feishu_sheet" not in limits  # batched: no per-row limit
        assert built.verification_token == "vt" and built.encrypt_key == "ek"
        assert escalator is not None and len(escalator.roster.layers) == 2
        assert built.silences is not None
        assert "SECRET-" not in repr(built) + repr(built.feishu_app)
        assert "SECRET-" not in repr(built.notifiers["feishu_bot"].router)  # type: ignore[attr-defined]
    finally:
        await built.aclose()


def test_missing_secret_names_the_variable() -> None:
    env = dict(ENV)
    del env["SMTP_PASSWORD"]
    with pytest.raises(SecretMissing, match="SMTP_PASSWORD"):
        build_channels(_documented_settings(), env)


def test_literal_secrets_are_refused() -> None:
    for section in (
        {"email": {"host": "h", "sender": "a@b", "password": "literal"}},
        {"feishu_app": {"app_id": "x", "app_secret": "literal"}},
        {"phone": {"provider": "twilio", "twilio": {"account_sid": "AC", "from_number": "+1",
                                                     "auth_token": "literal"}}},
    ):  # fmt: skip
        with pytest.raises(ValueError, match="xtra"):
            ChannelsSettings.model_validate(section)


async def test_contract_server_enforces_20kb_and_card_shape() -> None:
    async with FeishuContractServer(hooks={"h": Hook()}) as server:
        async with httpx.AsyncClient() as client:
            big = await client.post(server.hook_url("h"), content=b"{" + b" " * 21_000 + b"}")
        assert big.status_code == 400 and "20 KB" in big.json()["msg"]
        bot = FeishuBotNotifier(WebhookRouter({Priority.P2: BotWebhook("w", server.hook_url("h"))}))
        try:
            bot.render = lambda n: {"schema": "2.0", "body": {"elements": [{"tag": "div"}]}}  # type: ignore[method-assign]
            with pytest.raises(PermanentError) as err:
                await bot.send(notification(1, {"priority": "P2", "status": "firing"}))
        finally:
            await bot.aclose()
        assert err.value.code == 19002 and server.accepted == {}
