"""Who acknowledged, as a card says it (issue 34 follow-up), through the real gateway and the
Feishu contract server (the cards it accepted, the answers to its signed callbacks).

The presser's open_id, or an API or console user's name, that is a person the configuration
defines (the `oncall:` people, the escalation roster's members, with their `feishu_open_id`)
is shown by that person's configured name, with a mention of the configured open_id; anyone
else stays plain text, never a mention (tests/gateway/test_card_markup.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.gateway.test_card_markup import markdown_of
from tests.gateway.ui.helpers import TOKEN, alert, post_alerts, start
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import close_in_process
from trainsentry.alerts import Person, Priority
from trainsentry.config import GatewaySettings, Settings
from trainsentry.gateway.api.app import CardCallbackSettings
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Layer, Roster
from trainsentry.gateway.sections import oncall_of
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier
from trainsentry.notifiers.feishu.card import CardOptions

VERIFY = "verify-token"
ENCRYPT_KEY = "encrypt-key"
CALLBACK = CardCallbackSettings("/api/v1/feishu/card", VERIFY, ENCRYPT_KEY)
# the inline escalation roster: Ana Li, with her Feishu open_id
ROSTER = Escalator(
    Roster((Layer("primary", (Person("Ana Li", feishu_open_id="ou_ana"),)),)),
    EscalationPolicy(),
)


def oncall_people() -> Any:
    """An `oncall:` section whose people include ben (open_id ou_ben)."""
    start_wall = (datetime.now(UTC) - timedelta(days=1)).replace(tzinfo=None).isoformat()
    layer = {"name": "primary", "start": start_wall, "shift": "1d", "members": ["ben"]}
    section = {
        "people": {"ben": {"feishu_open_id": "ou_ben"}},
        "schedules": {"team": {"timezone": "UTC", "layers": [layer]}},
    }
    return oncall_of(Settings(gateway=GatewaySettings(), oncall=section))


async def press(server: TestServer, body: dict[str, Any]) -> dict[str, Any]:
    headers, raw = FeishuContractServer.callback_request(body, encrypt_key=ENCRYPT_KEY)
    async with aiohttp.ClientSession() as session:
        async with session.post(server.make_url(CALLBACK.path), data=raw, headers=headers) as r:
            assert r.status == 200, await r.text()
            return dict(await r.json())


async def api_ack(server: TestServer, alert_id: int, by: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        url = server.make_url(f"/api/v1/alerts/{alert_id}/ack")
        async with api.post(url, json={"by": by}) as answer:
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())


async def test_a_configured_person_is_named_and_mentioned_anyone_else_is_plain_text(
    tmp_path: Path,
) -> None:
    async with FeishuContractServer(apps={"cli_app": "secret"}) as feishu:
        client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
        chat = FeishuAppNotifier(
            client, {p: "oc_oncall" for p in Priority}, card_options=CardOptions(actions=True)
        )
        notifiers: dict[str, Notifier] = {"console": ConsoleNotifier(), "feishu_app": chat}
        server = await start(
            f"sqlite:///{tmp_path / 'store.db'}", token=TOKEN, notifiers=notifiers,
            card_callback=CALLBACK, escalator=ROSTER, oncall=oncall_people(),
        )  # fmt: skip
        try:
            causes = [alert(n, priority="P1", alertname=f"GPUXid{n}") for n in (1, 2, 3, 4)]
            await post_alerts(server, causes, TOKEN)
            # one card per cause; the outbox may send them in any order: each by its alert
            first, second, third, fourth = (
                next(mid for mid, m in feishu.messages.items() if f"GPUXid{n}" in m["content"])
                for n in (1, 2, 3, 4)
            )
            # Ana presses on the card: her open_id is the roster's
            body = feishu.press(first, "Acknowledge", verification_token=VERIFY, open_id="ou_ana")
            answer = await press(server, body)
            drawn = markdown_of(answer["card"])
            assert "Acknowledged by Ana Li <at id=ou_ana></at>" in drawn, drawn
            # someone the configuration does not know: their open_id, plain text
            body = feishu.press(
                second, "Acknowledge", verification_token=VERIFY,
                open_id="ou_stranger", event_id="ev-2",
            )  # fmt: skip
            drawn = markdown_of((await press(server, body))["card"])
            assert "Acknowledged by ou_stranger" in drawn and "<at" not in drawn, drawn
            # an API user named as an `oncall:` person: the name, and the configured open_id
            answer = await api_ack(server, 3, "ben")
            assert answer["acked_by"] == "ben"
            # an API user that gives an open_id as a name: a person's id is that person
            answer = await api_ack(server, 4, "ou_ana")
            assert answer["acked_by"] == "Ana Li"
            await server.app[GATEWAY_KEY].settle()
            redrawn = {mid: markdown_of(m["updates"][-1]) for mid, m in feishu.messages.items()}
            assert "Acknowledged by Ana Li <at id=ou_ana></at>" in redrawn[first]
            assert "Acknowledged by ou_stranger" in redrawn[second]
            assert "<at" not in redrawn[second]
            assert "Acknowledged by ben <at id=ou_ben></at>" in redrawn[third]
            assert "Acknowledged by Ana Li <at id=ou_ana></at>" in redrawn[fourth]
            assert feishu.rejections == []
            # the console and the API name the person too, the presser's id kept in the event
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
                async with s.get(server.make_url("/api/v1/alerts/1")) as r:
                    detail = await r.json()
            assert detail["acked_by"] == "Ana Li"
            acked = [e["detail"] for e in detail["events"] if e["kind"] == "acked"]
            assert acked[0]["by"] == "Ana Li" and acked[0]["as"] == "ou_ana"
            assert json.dumps(acked).count("ou_stranger") == 0
        finally:
            await close_in_process(server)
            await client.aclose()
