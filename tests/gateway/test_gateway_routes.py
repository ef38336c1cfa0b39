"""A gateway configured as docs/channels.md shows, with the shipped policy, reaches Feishu.

The shipped routes say `feishu` and `sheet`; the channels register as `feishu_bot`,
`feishu_app` and `feishu_sheet`. Nothing here names a route: what the default policy does
with the documented channel settings is what a new deployment gets.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import close_in_process
from tests.support.webhook_factory import bodies_by_group, encode, make_alert
from trainsentry.config import Settings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.channels import build
from trainsentry.gateway.pipeline import GATEWAY_KEY

SHEET = "shtcnArchive"
ENV = {
    "BOT_CRITICAL_URL": "",  # filled in with the contract server's address
    "BOT_CRITICAL_SECRET": "critical-secret",
    "BOT_WARNING_URL": "",
    "FEISHU_APP_SECRET": "app-secret",
}


@pytest.fixture
async def feishu() -> AsyncIterator[FeishuContractServer]:
    hooks = {"critical": Hook(secret="critical-secret"), "warning": Hook()}
    async with FeishuContractServer(
        hooks=hooks, apps={"cli_app": "app-secret"}, spreadsheets={SHEET}
    ) as server:
        yield server


def documented_settings(feishu: FeishuContractServer, db: str, tmp: Path) -> Settings:
    return Settings.model_validate(
        {
            "gateway": {"listen": "127.0.0.1:0", "db": db, "console_file": str(tmp / "c.jsonl")},
            "channels": {
                "feishu_bot": {
                    "groups": {
                        "critical": {
                            "priorities": ["P0", "P1"],
                            "url_env": "BOT_CRITICAL_URL",
                            "secret_env": "BOT_CRITICAL_SECRET",
                        },
                        "warning": {"priorities": ["P2", "P3"], "url_env": "BOT_WARNING_URL"},
                    }
                },
                "feishu_app": {"base_url": feishu.base_url, "app_id": "cli_app"},
                "feishu_sheet": {"spreadsheet_token": SHEET, "batch_window_s": 0.05},
            },
        }
    )


async def test_the_shipped_routes_reach_the_configured_feishu_channels(
    feishu: FeishuContractServer, db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = {
        **ENV,
        "BOT_CRITICAL_URL": feishu.hook_url("critical"),
        "BOT_WARNING_URL": feishu.hook_url("warning"),
    }
    settings = documented_settings(feishu, db_url, tmp_path)
    channels = build(settings, env)
    assert set(channels.notifiers) == {"console", "feishu_bot", "feishu_sheet"}
    caplog.set_level(logging.WARNING, logger="trainsentry.policy")
    app = create_app(
        settings.gateway, notifiers=channels.notifiers, rate_limits=channels.rate_limits
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        alerts = [
            make_alert(1, labels={"priority": "P1"}),
            make_alert(2, labels={"priority": "P2"}),
            make_alert(3, labels={"priority": "P3"}),
        ]
        async with aiohttp.ClientSession() as http:
            for body in bodies_by_group(alerts):  # one group per priority (the shipped route)
                async with http.post(server.make_url(WEBHOOK_PATH), data=encode(body)) as answer:
                    assert answer.status == 200, await answer.text()
        await server.app[GATEWAY_KEY].settle()
    finally:
        await close_in_process(server)
        if channels.built is not None:
            await channels.built.aclose()
    # P1 to the critical group's bot, P2 to the warning group's, P3 to the archive only
    assert len(feishu.accepted["critical"]) == 1
    assert len(feishu.accepted["warning"]) == 1
    [sheet] = feishu.sheets[SHEET].values()
    assert len(sheet.rows) == 1 + 3, "a header and one row per alert, P3 included"
    # phone is routed for P0 but not configured here: said once at start
    warnings = [r.getMessage() for r in caplog.records if "does not have" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].split(": ")[1].startswith("phone")
