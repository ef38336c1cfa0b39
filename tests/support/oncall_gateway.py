"""A real gateway (in-process, loopback HTTP) with an `oncall:` section, on virtual time.

The phone channel is the generic webhook channel pointed at a local receiver, so every call
the escalation places is counted there; the console channel writes a file we read back."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.clock import Clock
from tests.support.receiver import Receiver
from tests.support.webhook_factory import encode
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.oncall.config import parse_oncall

TOKEN = "api-token"
START = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)  # a Friday

# Two layers: the later one (primary, alice) wins, so the schedule's answer is alice first,
# then bob (backup). Steps: the schedule's first person, its second ("the next layer"), then
# the lead; twice over.
ONCALL = """
people:
  alice: {phone: "+4915100000001"}
  bob: {phone: "+4915100000002"}
  carol: {phone: "+4915100000003"}
  lead: {phone: "+4915100000009", feishu_open_id: ou_lead}
schedules:
  gpu-infra:
    timezone: Europe/Berlin
    layers:
      - {name: backup, start: "2026-11-16T09:00", shift: 1w, members: [bob]}
      - {name: primary, start: "2026-11-16T09:00", shift: 1w, members: [alice, carol]}
escalation_policies:
  gpu-p0:
    steps:
      - {schedule: gpu-infra, wait_minutes: 10}
      - {schedule: gpu-infra, position: 2, wait_minutes: 10}
      - {people: [lead], name: lead, wait_minutes: 10}
    repeat: 2
"""
POLICY = """
routing:
  escalation: {P0: gpu-p0}
"""


async def start(
    db_url: str,
    receiver: Receiver,
    clock: Clock,
    tmp_path: Path,
    *,
    oncall: str = ONCALL,
    policy: str = POLICY,
    console: Path | None = None,
    access_log: bool = True,
    extra_notifiers: dict[str, Notifier] | None = None,
    settings: dict[str, Any] | None = None,
) -> TestServer:
    """`access_log=False`: no access log, as `trainsentry gateway` serves (commands/serve.py);
    `extra_notifiers`: channels beside the console and the webhook "phone" (e.g. Feishu);
    `settings`: more of the gateway's settings (e.g. `access`, `console`)."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policy)
    gateway_settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        webhook_token=SecretStr(TOKEN),
        api_token=SecretStr(TOKEN),
        policy_file=policy_file,
        **(settings or {}),
    )
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(console),
        "phone": WebhookNotifier(receiver.url, name="phone"),
        **(extra_notifiers or {}),
    }
    app = create_app(
        gateway_settings,
        notifiers=notifiers,
        clock=clock,
        tick_interval=3600,
        oncall=parse_oncall(yaml.safe_load(oncall)),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(**({} if access_log else {"access_log": None}))
    return server


async def settle(server: TestServer) -> None:
    await server.app[GATEWAY_KEY].settle()


async def call(
    server: TestServer,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = TOKEN,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        kwargs: dict[str, Any] = {"data": raw} if raw is not None else {"json": body}
        async with session.request(method, server.make_url(path), **kwargs) as response:
            text = await response.text()
            if response.content_type == "application/json":
                return response.status, json.loads(text)
            return response.status, text


async def post_alerts(server: TestServer, body: dict[str, Any]) -> None:
    status, answer = await call(server, "POST", WEBHOOK_PATH, raw=encode(body))
    assert status == 200, answer


def called(receiver: Receiver) -> list[str]:
    """Who was called, in order (the phone channel's requests)."""
    return [b["payload"]["person"]["name"] for b in receiver.bodies]
