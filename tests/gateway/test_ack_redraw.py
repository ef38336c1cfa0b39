"""An ack redraws the alert's Feishu card even when it came before the card went out (the
card queued behind Feishu's trouble): the outbox sends the ack after the card, and the
channel reads the card's message_id then (`AckService.card_message`)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from aiohttp import web

from tests.gateway.ui.helpers import alert, post_alerts, start
from tests.support.clock import Clock
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import close_in_process
from trainsentry.alerts import Priority
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier


async def test_an_ack_before_the_card_went_out_still_redraws_it(tmp_path: Path) -> None:
    clock = Clock()
    async with FeishuContractServer(apps={"cli_app": "secret"}) as feishu:
        client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
        notifiers: dict[str, Notifier] = {
            "console": ConsoleNotifier(),
            "feishu_app": FeishuAppNotifier(client, {p: "oc_oncall" for p in Priority}),
        }
        server = await start(f"sqlite:///{tmp_path / 'store.db'}", notifiers=notifiers, clock=clock)
        try:
            # Feishu's token endpoint is down for the first try: the card waits in the outbox
            feishu.token_answers.append(web.json_response({"code": 1}, status=503))
            await post_alerts(server, [alert(1, priority="P1")])
            assert feishu.messages == {}
            gateway = server.app[GATEWAY_KEY]
            assert gateway.ack is not None
            assert await gateway.ack.acknowledge(1, "oncall-hana") is not None
            clock.now += timedelta(minutes=5)  # past the card's back-off
            await gateway.settle()
            [message] = feishu.messages.values()  # the card, and no second one for the ack
            assert "oncall-hana" not in message["content"]
            [redrawn] = message["updates"]
            assert "Acknowledged by" in json.dumps(redrawn)
            assert "oncall-hana" in json.dumps(redrawn)
        finally:
            await close_in_process(server)
            await client.aclose()
