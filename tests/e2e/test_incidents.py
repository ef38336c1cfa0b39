"""Issue 34 through a real gateway: one Alertmanager group is one incident, one card kept up
to date, one page; a new cause pages at once during a storm.

The webhooks are what Alertmanager sends (webhook v4, its groupKey format: webhook_factory)
under the shipped route for this scenario: 20 nodes' NodeFilesystemSpaceLow of one job (P1)
in one notification, the group re-sent after its group_interval, then with 5 more nodes,
then all resolved; in the same minute a GPUFellOffBus (XID 79, P0) of the same job in its
own group. Feishu and the phone provider are the contract servers (tests/support/)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import close_in_process, start_gateway
from tests.support.paging_config import VOICE_KEY, write_paging_config
from tests.support.phone_server import PhoneContractServer
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import Priority
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier

pytestmark = pytest.mark.e2e
TOKEN = "incident-token"
DISK = "NodeFilesystemSpaceLow"
JOB = {"namespace": "ml", "trainingjob": "llama-70b"}


def disk(node: int, started: datetime, status: str = "firing") -> dict[str, Any]:
    labels = {**JOB, "priority": "P1", "component": "node", "mountpoint": "/ckpt"}
    labels["node"] = f"gpu-node-{node:02d}"
    return make_alert(
        node,
        name=DISK,
        labels=labels,
        status=status,
        starts_at=started,
        ends_at=started + timedelta(minutes=3) if status == "resolved" else None,
        fingerprint=f"d{node:015d}",
    )


def xid(started: datetime) -> dict[str, Any]:
    labels = {**JOB, "priority": "P0", "component": "gpu", "node": "gpu-node-33", "gpu": "3"}
    labels["xid"] = "79"
    return make_alert(99, name="GPUFellOffBus", labels=labels, starts_at=started)


def disk_group(nodes: range, started: datetime, status: str = "firing") -> dict[str, Any]:
    return make_body([disk(n, started, status) for n in nodes])


def write_config(tmp_path: Path, bot_url: str, voice_url: str) -> tuple[Path, dict[str, str]]:
    return write_paging_config(
        tmp_path,
        token=TOKEN,
        # a short follow-up window for the test; Alertmanager's 5 min group_interval is the default
        policy={"grouping": {"follow_up_interval": 5}},
        groups={"oncall": {"priorities": ["P0", "P1", "P2"], "url_env": "BOT_URL"}},
        voice_url=voice_url,
        escalation={
            "min_priority": "P0",
            "layers": [
                {"name": "primary", "members": [{"name": "ana", "phone": "+8613800000001"}]}
            ],
        },
        env={"BOT_URL": bot_url},
    )


def titles(feishu: FeishuContractServer, hook: str = "oncall") -> list[tuple[float, str, str]]:
    """(arrival, title, the whole card as text) of each card the bot group got."""
    return [
        (at, body["card"]["header"]["title"]["content"], json.dumps(body["card"]))
        for at, body in feishu.accepted[hook]
    ]


async def test_one_group_is_one_incident_and_a_new_cause_pages_at_once(tmp_path: Path) -> None:
    feishu = FeishuContractServer(hooks={"oncall": Hook()})
    phones = PhoneContractServer(gateway_token=VOICE_KEY)
    async with feishu, phones:
        config, env = write_config(
            tmp_path, feishu.hook_url("oncall"), f"{phones.base_url}/voice/call"
        )
        db = f"sqlite:///{tmp_path / 'store.db'}"
        gateway = await asyncio.to_thread(start_gateway, tmp_path, db, config=config, env=env)
        url = f"{gateway.url}{WEBHOOK_PATH}"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        now = datetime.now(UTC).replace(microsecond=0)
        try:
            async with aiohttp.ClientSession(headers=headers) as http:

                async def post(body: dict[str, Any]) -> float:
                    async with http.post(url, data=encode(body)) as response:
                        assert response.status == 200, await response.text()
                    return time.monotonic()

                def disk_cards() -> list[tuple[float, str, str]]:
                    return [t for t in titles(feishu) if DISK in t[1]]

                sent = await post(disk_group(range(1, 21), now))
                first = (
                    await eventually(disk_cards, 30, what="the disk group's card", not_yet=())
                )[0]
                assert first[0] - sent <= 30
                assert "20 nodes" in first[1], first[1]
                assert "gpu-node-01" in first[2] and "and 10 more" in first[2]
                # the same minute: the XID 79 in its own group, the storm's 21st new alert
                sent = await post(make_body([xid(now)]))
                gpu = await eventually(
                    lambda: [t for t in titles(feishu) if "GPUFellOffBus" in t[1]],
                    10,
                    what="XID",
                    not_yet=(),
                )
                assert gpu[0][0] - sent <= 2.0, f"the XID's card took {gpu[0][0] - sent:.2f} s"
                assert "[P0] FIRING: GPUFellOffBus" in gpu[0][1]
                assert "alert storm on" in gpu[0][2], "during a storm, it pages on its own"
                # nothing folded into the storm (the group's card speaks for its 20 alerts,
                # the XID pages on its own): no storm card
                assert not [t for t in titles(feishu) if "storm" in t[1].lower()]
                # Alertmanager re-sends the group after group_interval: nothing new
                await post(disk_group(range(1, 21), now))
                await post(disk_group(range(1, 26), now))  # 5 more nodes
                follow_up = await eventually(
                    lambda: disk_cards()[1:], 20, what="the follow-up card", not_yet=()
                )
                assert "25 nodes" in follow_up[0][1], follow_up[0][1]
                await post(disk_group(range(1, 26), now, status="resolved"))
                resolved = await eventually(
                    lambda: [t for t in disk_cards() if "RESOLVED" in t[1]],
                    20,
                    what="resolution",
                    not_yet=(),
                )
                assert "25 nodes" in resolved[0][1]
                await asyncio.sleep(6)  # a follow-up window: nothing more comes
                calls = [body for _, body in phones.gateway_calls]
        finally:
            await asyncio.to_thread(gateway.stop)
    cards = titles(feishu)
    print(f"feishu_bot: {len(cards)} messages: {[t for _, t, _ in cards]}; calls: {len(calls)}")
    assert len([t for t in cards if DISK in t[1]]) <= 3, "firing, the 5 more, resolved"
    assert len(cards) <= 6, [t for _, t, _ in cards]
    assert len(calls) == 2, "one page per incident: the disk pool (P0 by blast radius), the XID"
    assert feishu.rejections == []


async def test_with_the_feishu_app_the_group_is_one_card_updated_in_place_and_acked(
    tmp_path: Path,
) -> None:
    feishu = FeishuContractServer(apps={"cli_app": "secret"})
    async with feishu:
        client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
        notifiers: dict[str, Notifier] = {
            "console": ConsoleNotifier(),
            "feishu_app": FeishuAppNotifier(client, {p: "oc_oncall" for p in Priority}),
        }
        settings = GatewaySettings(
            listen="127.0.0.1:0", db=f"sqlite:///{tmp_path / 's.db'}", api_token=SecretStr(TOKEN)
        )
        server = TestServer(create_app(settings, notifiers=notifiers), host="127.0.0.1")
        await server.start_server()
        now = datetime.now(UTC).replace(microsecond=0)
        try:
            gateway = server.app[GATEWAY_KEY]
            async with aiohttp.ClientSession() as http:
                for body in (
                    disk_group(range(1, 21), now),
                    disk_group(range(1, 21), now),  # re-sent
                    disk_group(range(1, 26), now),  # 5 more
                ):
                    async with http.post(server.make_url(WEBHOOK_PATH), data=encode(body)) as r:
                        assert r.status == 200
                    await gateway.settle()
                async with http.post(
                    server.make_url("/api/v1/alerts/3/ack"),
                    json={"by": "ou_bob"},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as r:
                    answer = await r.json()
                    assert r.status == 200, answer
                await gateway.settle()
                resolved = disk_group(range(1, 26), now, status="resolved")
                async with http.post(server.make_url(WEBHOOK_PATH), data=encode(resolved)) as r:
                    assert r.status == 200
                await gateway.settle()
        finally:
            await close_in_process(server)
            await client.aclose()
    assert answer["incident_id"] is not None and answer["alerts_acked"] == 25
    cards = [m for m in feishu.messages.values() if DISK in m["content"]]
    [message] = cards  # one card for the group
    updates = [json.dumps(card) for card in message["updates"]]
    first = json.loads(message["content"])["header"]["title"]["content"]
    assert "20 nodes" in first
    assert any("25 nodes" in u and "Acknowledged" in u for u in updates), "the ack redraws it"
    assert "RESOLVED" in updates[-1] and "Acknowledged" in updates[-1]
    assert feishu.rejections == []
