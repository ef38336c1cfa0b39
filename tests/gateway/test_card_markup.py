"""What a card may make of text it did not write (issue 32, findings 3 and 8), through the
real gateway and the Feishu contract server; the assertions read the card JSON the contract
server received.

- An acknowledger's name (the ack API's `by`, a console sign-in name) is plain text: `all`
  or an `ou_...` id never becomes a mention.
- Alert text (labels, annotations) can form no mention and nothing clickable: no markdown
  link or image, no `<a>`, `<link>`, `<at>`, `<font>` tag (the Feishu card markdown forms).
- Link buttons take only http(s) URLs: a `javascript:` runbook or a `lark://` dashboard
  link from annotations is left out; an https one stays.
"""

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
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier

# Every mention form of Feishu's card markdown and of its text messages ("<at user_id=")
MENTIONS = (
    "<at id=all></at>",
    "<at id=ou_mallory></at>",
    "<at ids=ou_a,ou_b></at>",
    "<at email=boss@example.com></at>",
    '<at user_id="all"></at>',
    '<at user_id="ou_mallory">Mallory</at>',
)
# What makes something clickable or spoofs the card's look in Feishu's card markdown
CLICKABLE = (
    "[ACK HERE](https://evil.example/ack)",
    "![logo](img_v2_0123)",
    "<a href='https://evil.example/a'>docs</a>",
    "<a>https://evil.example/bare</a>",
    "<link icon='chat_outlined' url='https://evil.example/link'>chat</link>",
    "<font color='red'>PAGE EVERYONE</font>",
    "<text_tag color='red'>P0</text_tag>",
    "<person id='ou_mallory'></person>",
)

MARKUP = ("<at", "](", "![", "<a ", "<a>", "<link", "<font color='red'", "<font color='green'",
          "<text_tag", "<person")  # fmt: skip


async def ack(server: TestServer, alert_id: int, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        url = server.make_url(f"/api/v1/alerts/{alert_id}/ack")
        async with api.post(url, json=body) as answer:
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())


def cards_of(feishu: FeishuContractServer) -> list[dict[str, Any]]:
    """Every card the contract server accepted: as sent, then each update."""
    cards = []
    for message in feishu.messages.values():
        cards.append(json.loads(message["content"]))
        cards.extend(message["updates"])
    return cards


def markdown_of(card: dict[str, Any]) -> str:
    """The markdown contents of a card, joined (what Feishu renders as markdown)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("tag") == "markdown":
                found.append(str(node.get("content", "")))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(card)
    return "\n".join(found)


def urls_of(card: dict[str, Any]) -> list[str]:
    text = json.dumps(card)
    found = []
    for marker in ('"default_url": "', '"url": "'):
        for part in text.split(marker)[1:]:
            found.append(part.split('"', 1)[0])
    return found


async def gateway_with_app(tmp_path: Path, feishu: FeishuContractServer) -> TestServer:
    client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(),
        "feishu_app": FeishuAppNotifier(client, {p: "oc_oncall" for p in Priority}),
    }
    return await start(f"sqlite:///{tmp_path / 'store.db'}", token=TOKEN, notifiers=notifiers)


async def test_acknowledger_names_are_plain_text_never_mentions(tmp_path: Path) -> None:
    async with FeishuContractServer(apps={"cli_app": "secret"}) as feishu:
        server = await gateway_with_app(tmp_path, feishu)
        try:
            # three causes, three incidents: three cards (one group would be one card)
            causes = [alert(n, priority="P1", alertname=f"GPUXid{n}") for n in (1, 2, 3)]
            await post_alerts(server, causes, TOKEN)
            assert len(feishu.messages) == 3
            await ack(server, 1, {"by": "all"})
            # a console sign-in name or an API caller that looks like an open_id
            await ack(server, 2, {"by": "ou_mallory"})
            await ack(server, 3, {"by": '<at user_id="all"></at>', "comment": MENTIONS[0]})
            await server.app[GATEWAY_KEY].settle()
            redrawn = [u for m in feishu.messages.values() for u in m["updates"]]
            assert len(redrawn) == 3  # each card redrawn in place, accepted by Feishu
            drawn = "\n".join(markdown_of(card) for card in redrawn)
            assert "Acknowledged by all" in drawn
            assert "Acknowledged by ou_mallory" in drawn
            assert "<at" not in drawn, drawn
        finally:
            await close_in_process(server)


async def test_alert_text_forms_no_mention_link_or_styled_text(tmp_path: Path) -> None:
    evil = " ".join((*MENTIONS, *CLICKABLE))
    attack = alert(1, priority="P1", team=evil, node="gpu-0001")
    attack["annotations"] = {
        "summary": "[ACK HERE](https://evil.example/ack) <at id=all></at>",
        "description": evil,
        "value": "<font color='green'>ok</font>",
        "runbook_url": "javascript:alert(document.cookie)",
        "dashboard_url": "lark://applink.feishu.cn/client/chat/open",
    }
    attack["generatorURL"] = "JavaScript:alert(1)"
    fine = alert(2, priority="P1", alertname="GPUHot")  # another cause: a card of its own
    fine["annotations"]["runbook_url"] = "https://runbooks.example/gpu-xid"
    async with FeishuContractServer(apps={"cli_app": "secret"}) as feishu:
        server = await gateway_with_app(tmp_path, feishu)
        try:
            await post_alerts(server, [attack, fine], TOKEN)
            await ack(server, 1, {"by": "oncall-hana"})
            await server.app[GATEWAY_KEY].settle()
            cards = cards_of(feishu)
            assert len(cards) == 3  # two cards and the ack's redraw, all accepted
            for card in cards:
                text = markdown_of(card)
                assert "ACK HERE" in text or "gpu-0002" in text
                for needle in MARKUP:
                    assert needle not in text, (needle, text)
                assert all(url.startswith(("https://", "http://")) for url in urls_of(card))
            urls = [url for card in cards for url in urls_of(card)]
            assert "https://runbooks.example/gpu-xid" in urls
            assert not [u for u in urls if "javascript" in u.lower() or u.startswith("lark:")]
        finally:
            await close_in_process(server)
