"""The console in a real browser (headless Chromium over the DevTools protocol,
tests/support/browser.py) against a real, in-process gateway: live updates without reload,
the ack button, login and CSRF, attacker-controlled labels shown as text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest

from tests.gateway.ui.helpers import TOKEN, alert, post_alerts, start
from tests.support.browser import CHROMIUM, Browser, Page
from tests.support.clock import Clock
from tests.support.feishu_server import FeishuContractServer
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from trainsentry.alerts import Person, Priority
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Layer, Roster
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier
from trainsentry.notifiers.webhook import WebhookNotifier

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]

STREAM_OPEN = "document.getElementById('live').dataset.stream === 'open'"
EVIL = "<script>window.__xss = 1</script><img src=x onerror=window.__xss=2>"


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with Browser.launch(tmp_path) as tab:
        yield tab


def sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


async def test_a_posted_incident_appears_without_reload_and_labels_stay_text(
    page: Page, tmp_path: Path
) -> None:
    server = await start(sqlite(tmp_path))
    try:
        await page.goto(str(server.make_url("/ui/")))
        await page.text_with("#live", "Nothing is open")
        await page.evaluate("window.__same_page = true")
        await page.wait_for(STREAM_OPEN)
        await post_alerts(server, [alert(7, priority="P0", evil=EVIL, trainingjob="llama-70b")])
        await page.wait_for("document.querySelector('a.card[data-alert-id]') !== null")
        assert await page.evaluate("window.__same_page") is True  # no reload
        card = await page.text_with("a.card", "not acked")
        assert "P0" in card and "GPUXidError" in card and "not acked" in card
        # the incident's page shows the label as text; nothing of it ran
        await page.goto(str(server.make_url("/ui/alerts/1")))
        await page.text_with("dl.kv", EVIL)
        assert await page.evaluate("window.__xss === undefined")
        assert await page.evaluate("document.querySelectorAll('script').length") == 1
        assert await page.evaluate("document.querySelectorAll('img').length") == 0
    finally:
        await close_in_process(server)


ESCALATOR = Escalator(
    Roster(
        (
            Layer("primary", (Person("alice", phone="+8613800000001"),)),
            Layer("secondary", (Person("bob", phone="+8613800000002"),)),
        )
    ),
    EscalationPolicy(ack_timeout=timedelta(minutes=5)),
)


async def sign_in(page: Page, server: object, name: str, token: str) -> None:
    await page.fill("#name", name)
    await page.fill("#token", token)
    await page.click("form.login button")
    await page.wait_event("Page.loadEventFired")


async def test_the_ack_button_stops_the_escalation_and_redraws_the_card(
    page: Page, tmp_path: Path, receiver: Receiver
) -> None:
    clock = Clock()
    feishu = FeishuContractServer(apps={"cli_app": "secret"})
    async with feishu:
        client = FeishuAppClient(feishu.base_url, "cli_app", "secret")
        notifiers: dict[str, Notifier] = {
            "console": ConsoleNotifier(),
            "feishu_app": FeishuAppNotifier(client, {p: "oc_oncall" for p in Priority}),
            "phone": WebhookNotifier(receiver.url, name="phone"),
        }
        server = await start(
            sqlite(tmp_path), token=TOKEN, notifiers=notifiers, clock=clock, escalator=ESCALATOR
        )
        try:
            await post_alerts(server, [alert(1, priority="P0")], token=TOKEN)
            called = [b["payload"]["person"]["name"] for b in receiver.bodies]
            assert called == ["alice"]
            [message] = feishu.messages.values()
            await page.goto(str(server.make_url("/ui/alerts/1")))
            assert await page.evaluate("location.pathname") == "/ui/login"
            await sign_in(page, server, "oncall-carol", TOKEN)
            assert await page.evaluate("location.pathname") == "/ui/alerts/1"
            await page.text_with("#live", "not acknowledged")
            await page.fill("form.action-ack input[name=comment]", "draining gpu-0001")
            await page.click("#action-ack")
            await page.wait_for("document.body.innerText.includes('acknowledged by oncall-carol')")
            await page.text_with(".notice", "the phone escalation is stopped")
            await page.text_with("ol.timeline", "draining gpu-0001")
            # the phone stops: the next layer is never rung
            clock.now += timedelta(minutes=30)
            await server.app[GATEWAY_KEY].settle()
            assert [b["payload"]["person"]["name"] for b in receiver.bodies] == ["alice"]
            # the console's card is redrawn as acknowledged, and so is the chat's: the card
            # already in the chat is updated in place (PATCH im/v1/messages/:message_id),
            # no second card is posted
            await page.goto(str(server.make_url("/ui/")))
            await page.text_with("a.card[data-alert-id='1']", "acked by oncall-carol")
            assert list(feishu.messages.values()) == [message]
            [redrawn] = message["updates"]
            assert "Acknowledged by" in json.dumps(redrawn, ensure_ascii=False)
            assert "oncall-carol" in json.dumps(redrawn, ensure_ascii=False)
            assert "draining gpu-0001" in json.dumps(redrawn, ensure_ascii=False)
            assert [what for what, _ in feishu.rejections] == []
        finally:
            await close_in_process(server)
            await client.aclose()


async def test_the_escalate_button_calls_the_next_layer_now(
    page: Page, tmp_path: Path, receiver: Receiver
) -> None:
    """Escalate now on a P0 with two layers: the second layer is rung at once (not after the
    5-minute ack timeout), through the API's service, and the history says who asked."""
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(),
        "phone": WebhookNotifier(receiver.url, name="phone"),
    }
    server = await start(
        sqlite(tmp_path), token=TOKEN, notifiers=notifiers, clock=Clock(), escalator=ESCALATOR
    )
    try:
        await post_alerts(server, [alert(1, priority="P0")], token=TOKEN)
        assert [b["payload"]["person"]["name"] for b in receiver.bodies] == ["alice"]
        await page.goto(str(server.make_url("/ui/login?next=/ui/alerts/1")))
        await sign_in(page, server, "oncall-carol", TOKEN)
        await page.click("#action-escalate")
        await page.wait_for("document.body.innerText.includes('Escalated: the next step')")
        await server.app[GATEWAY_KEY].settle()  # the clock has not moved: no timeout passed
        assert [b["payload"]["person"]["name"] for b in receiver.bodies] == ["alice", "bob"]
        await page.text_with("ol.timeline", "oncall-carol")
        await page.goto(str(server.make_url("/ui/alerts/1")))  # bob's call, in the list
        await page.text_with("section[aria-label='Notifications and calls'] table", "bob")
        # acknowledged, there is nothing left to escalate: refused, nobody else is rung
        await page.click("#action-ack")
        await page.wait_for("document.body.innerText.includes('acknowledged by oncall-carol')")
        await page.evaluate("document.querySelector('form.action-escalate').submit()")
        await page.wait_for("document.body.innerText.includes('cannot escalate alert 1')")
        await server.app[GATEWAY_KEY].settle()
        assert [b["payload"]["person"]["name"] for b in receiver.bodies] == ["alice", "bob"]
    finally:
        await close_in_process(server)


async def test_the_now_page_shows_who_is_on_call_on_the_schedules(
    page: Page, tmp_path: Path, receiver: Receiver
) -> None:
    from tests.support import oncall_gateway as support

    server = await support.start(
        f"sqlite:///{tmp_path / 'store.db'}", receiver, Clock(support.START), tmp_path
    )
    try:
        await page.goto(str(server.make_url("/ui/")))
        await sign_in(page, server, "ivy", support.TOKEN)
        await page.text_with(
            "section[aria-label='On call']",
            "gpu-infra: alice (primary, until 2026-11-23 08:00:00 UTC), bob (backup)",
        )
        assert await page.text("ul.oncall .person.primary") == "alice"
    finally:
        await close_in_process(server)


async def test_login_and_csrf_are_enforced(page: Page, tmp_path: Path) -> None:
    server = await start(sqlite(tmp_path), token=TOKEN)
    try:
        await post_alerts(server, [alert(1, priority="P1"), alert(2)], token=TOKEN)
        await page.goto(str(server.make_url("/ui/")))
        assert await page.evaluate("location.pathname") == "/ui/login"
        await sign_in(page, server, "mallory", "not-the-token")
        await page.text_with("main", "Wrong token")
        await page.goto(str(server.make_url("/ui/login?next=/ui/alerts/1")))
        await sign_in(page, server, "dave", TOKEN)
        assert await page.evaluate("location.pathname") == "/ui/alerts/1"
        # the session cookie is HttpOnly: no script reads it
        assert "ts_session" not in await page.evaluate("document.cookie")
        # a form without the right CSRF token is refused, and nothing is acknowledged
        await page.evaluate(
            "document.querySelector('form.action-ack input[name=csrf]').value = 'forged'"
        )
        await page.click("#action-ack")
        await page.wait_for("document.body.innerText.includes('CSRF')")
        await page.goto(str(server.make_url("/ui/alerts/1")))
        await page.text_with("#live", "not acknowledged")
        # the form as the page drew it is accepted
        await page.click("#action-ack")
        await page.wait_for("document.body.innerText.includes('acknowledged by dave')")
        # an incident's page follows what others do, without a reload
        await page.goto(str(server.make_url("/ui/alerts/2")))
        await page.evaluate("window.__same_page = true")
        await page.wait_for(STREAM_OPEN)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as api:
            url = server.make_url("/api/v1/alerts/2/ack")
            async with api.post(url, json={"by": "api-user"}) as answer:
                assert answer.status == 200
        await page.wait_for("document.getElementById('live').innerText.includes('api-user')")
        assert await page.evaluate("window.__same_page") is True
    finally:
        await close_in_process(server)


LONG = "x" * 300  # one word wider than any phone


async def test_usable_on_a_phone_screen_and_by_keyboard(page: Page, tmp_path: Path) -> None:
    server = await start(sqlite(tmp_path))
    try:
        await post_alerts(
            server, [alert(i, priority=f"P{i % 4}", note=LONG, node=LONG) for i in range(12)]
        )
        await page.viewport(390, 800)
        paths = ("/ui/", "/ui/alerts/1", "/ui/history", "/ui/job?name=llama-70b",
                 "/ui/oncall", "/ui/silences", "/ui/nodes")  # fmt: skip
        for path in paths:
            await page.goto(str(server.make_url(path)))
            wide = await page.evaluate("document.documentElement.scrollWidth")
            assert wide <= 390, f"{path} scrolls sideways on a phone ({wide} px)"
        await page.viewport(1100, 800)
        await page.goto(str(server.make_url("/ui/")))
        # Tab: the first stop is the skip link, then the console's own links
        await page.press("Tab")
        assert await page.evaluate("document.activeElement.className") == "skip"
        # j / k move between incidents, Enter opens one
        await page.press("j")
        first = await page.evaluate("document.activeElement.getAttribute('data-alert-id')")
        await page.press("j")
        second = await page.evaluate("document.activeElement.getAttribute('data-alert-id')")
        assert first and second and first != second
        await page.press("k")
        assert await page.evaluate("document.activeElement.getAttribute('data-alert-id')") == first
        # a live update redraws the list; the keyboard stays on the same incident
        await page.wait_for(STREAM_OPEN)
        await post_alerts(server, [alert(99, priority="P0")])
        await page.wait_for("document.querySelector('a.card[data-alert-id=\"13\"]') !== null")
        assert await page.evaluate("document.activeElement.getAttribute('data-alert-id')") == first
        await page.press("Enter")
        await page.wait_for(f"location.pathname === '/ui/alerts/{first}'")
    finally:
        await close_in_process(server)


async def test_the_silence_button_creates_it_in_a_real_alertmanager(
    page: Page, tmp_path: Path
) -> None:
    from tests.support.realservers import start_alertmanager
    from trainsentry.notifiers.alertmanager import SilenceClient

    am_config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    with start_alertmanager(tmp_path, am_config) as am:
        silences = SilenceClient(am.url)
        server = await start(sqlite(tmp_path), token=TOKEN, silences=silences)
        try:
            await post_alerts(server, [alert(1, priority="P1")], token=TOKEN)
            await page.goto(str(server.make_url("/ui/login?next=/ui/alerts/1")))
            await sign_in(page, server, "lee", TOKEN)
            await page.evaluate("document.querySelector('form.action-silence select').value = '60'")
            await page.fill("form.action-silence input[name=comment]", "swapping the cable")
            await page.click("#action-silence")
            await page.wait_for("document.body.innerText.includes('silenced in Alertmanager')")
            timeline = await page.text_with(
                "ol.timeline", "by lee (break-glass token) for 60 min (silence "
            )
            silence_id = timeline.split("(silence ")[1].split(")")[0]
            await page.text_with("#live", "acknowledged by lee")
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{am.url}/api/v2/silence/{silence_id}") as answer:
                    silence = await answer.json()
            matchers = {m["name"]: m["value"] for m in silence["matchers"]}
            assert matchers["alertname"] == "GPUXidError" and matchers["node"] == "gpu-0001"
            assert "lee" in silence["createdBy"] + silence["comment"]
        finally:
            await close_in_process(server)
            await silences.aclose()
