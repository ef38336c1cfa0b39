"""The ack comment typed on a Feishu card, through the real gateway: the card the gateway
sends (accepted by the contract server) has a form with a comment input; pressing its
Acknowledge button sends the documented `card.action.trigger` callback with
`action.form_value` (encrypted and signed, as Feishu does with an encrypt key); the gateway
stores the comment with the ack and redraws the card showing it, escaped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.gateway.ui.helpers import TOKEN, alert, post_alerts, start
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import close_in_process
from trainsentry.alerts import Priority
from trainsentry.gateway.api.app import CardCallbackSettings
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier
from trainsentry.notifiers.feishu.card import CardOptions

VERIFY = "verify-token"
ENCRYPT_KEY = "encrypt-key"
CALLBACK = CardCallbackSettings("/api/v1/feishu/card", VERIFY, ENCRYPT_KEY)
EVIL = "draining gpu-0001 <at id=all></at> <font color='red'>x</font>"


async def press(server: TestServer, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Posts a callback as Feishu does with an encrypt key: encrypted, signed, fresh."""
    headers, raw = FeishuContractServer.callback_request(body, encrypt_key=ENCRYPT_KEY)
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url(CALLBACK.path), data=raw, headers=headers) as r:
            return r.status, await r.json()


async def events(server: TestServer, alert_id: int) -> list[tuple[str, Any]]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        async with api.get(server.make_url(f"/api/v1/alerts/{alert_id}")) as r:
            return [(e["kind"], e["detail"]) for e in (await r.json())["events"]]


async def test_the_comment_typed_on_the_card_is_kept_and_shown_escaped(tmp_path: Path) -> None:
    feishu = FeishuContractServer(apps={"cli_app": "secret"})
    async with feishu:
        client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
        chat = FeishuAppNotifier(
            client, {p: "oc_oncall" for p in Priority}, card_options=CardOptions(actions=True)
        )
        notifiers: dict[str, Notifier] = {"console": ConsoleNotifier(), "feishu_app": chat}
        server = await start(
            f"sqlite:///{tmp_path / 'store.db'}",
            token=TOKEN,
            notifiers=notifiers,
            card_callback=CALLBACK,
        )
        try:
            # two causes, two incidents: two cards
            second_alert = alert(2, priority="P0", alertname="NodeDown")
            await post_alerts(server, [alert(1, priority="P0"), second_alert], TOKEN)
            first, second = feishu.messages  # sent, so the contract server took the form
            body = feishu.press(
                first, "Acknowledge", verification_token=VERIFY, open_id="ou_bob",
                typed={"comment": f"  {EVIL}\n"},
            )  # fmt: skip
            assert body["event"]["action"]["form_value"] == {"comment": f"  {EVIL}\n"}
            status, answer = await press(server, body)
            assert status == 200, answer
            assert answer["toast"]["type"] == "success"
            drawn = json.dumps(answer["card"], ensure_ascii=False)
            assert "draining gpu-0001 &lt;at id=all&gt;&lt;/at&gt; &lt;font" in drawn
            assert "<at id=all>" not in drawn and "<font color='red'>" not in drawn
            # the ack names the incident it acknowledged (alert 1's)
            acked = ("acked", {"by": "ou_bob", "incident": 1, "comment": EVIL})
            assert acked in await events(server, 1)
            # bounded, and text only: refused (400), nothing acknowledged
            for n, typed in enumerate(("x" * 1001, "bad\x00", "\ud800")):
                refused = feishu.press(
                    second, "Acknowledge", verification_token=VERIFY,
                    typed={"comment": typed}, event_id=f"ev-bad-{n}",
                )  # fmt: skip
                status, answer = await press(server, refused)
                assert status == 400 and "comment" in answer["error"], answer
            wrong = feishu.press(second, "Acknowledge", verification_token=VERIFY)
            wrong["event"]["action"]["form_value"] = {"comment": ["not", "text"]}
            assert (await press(server, wrong))[0] == 400
            assert [kind for kind, _ in await events(server, 2)] == ["firing"]
            # an empty input: acknowledged without a comment
            plain = feishu.press(
                second, "Acknowledge", verification_token=VERIFY, event_id="ev-plain"
            )
            assert (await press(server, plain))[0] == 200
            assert ("acked", {"by": "ou_presser", "incident": 2}) in await events(server, 2)
        finally:
            await close_in_process(server)
            await client.aclose()
