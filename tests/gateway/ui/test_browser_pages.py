"""The console's On call, Silences and windows, Nodes and History pages in a real browser
(headless Chromium, tests/support/browser.py) against a real in-process gateway with on-call
schedules: see who is on call, add an override, preview and make a window, see a node, and
History shows incidents. Every read waits for what it reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gateway.ui.helpers import post_alerts
from tests.gateway.ui.test_browser import sign_in
from tests.support import oncall_gateway as oncall
from tests.support.browser import CHROMIUM, Browser, Page
from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from tests.support.webhook_factory import make_alert

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with Browser.launch(tmp_path) as tab:
        yield tab


def has_text(selector: str, text: str) -> str:
    """A page expression: the element exists and its text holds `text`."""
    found, wanted = json.dumps(selector), json.dumps(text)
    return f"(document.querySelector({found})?.innerText || '').includes({wanted})"


def faults(status: str = "firing") -> list[dict[str, object]]:
    """The chart's cluster-wide rule's alert (no namespace: trusted evidence, which alone
    makes a node sick)."""
    labels = {"node": "gpu-node-7", "priority": "P1", "component": "gpu"}
    alert = make_alert(8, status=status, name="GPUFellOffBus", labels=labels)
    del alert["labels"]["namespace"], alert["labels"]["trainingjob"]
    return [alert]


async def test_on_call_windows_nodes_and_history_in_a_browser(
    page: Page, tmp_path: Path, receiver: Receiver
) -> None:
    server = await oncall.start(
        f"sqlite:///{tmp_path / 'store.db'}", receiver, Clock(oncall.START), tmp_path
    )
    try:
        # who is on call: alice now, carol next
        await page.goto(str(server.make_url("/ui/oncall")))
        await sign_in(page, server, "ivy", oncall.TOKEN)
        await page.wait_for(has_text(".now-on-call .person.primary", "alice"))
        assert "carol" in await page.text(".next-on-call")
        assert "alice, carol" in await page.text("table.layers")
        # an override from the form: bob has the pager now
        await page.fill("#override-who", "bob")
        await page.fill("#override-start", "2026-11-20T04:00")
        await page.fill("#override-end", "2026-11-20T12:00")
        await page.fill("#override-reason", "alice at the offsite")
        await page.click("#override-add")
        await page.wait_for("location.search.includes('done=override-added')")
        await page.wait_for(has_text(".now-on-call .person.primary", "bob"))
        assert "alice at the offsite" in await page.text("table.overrides")
        # a window: previewed (what it would match), then made
        await post_alerts(server, faults(), token=oncall.TOKEN)
        await page.goto(str(server.make_url("/ui/silences")))
        await page.wait_for("document.querySelector('#window-matchers') !== null")
        await page.fill("#window-matchers", "node=gpu-node-7")
        await page.fill("#window-minutes", "60")
        await page.fill("#window-reason", "GPU reseat")
        await page.click("#window-preview")
        await page.wait_for(has_text("#preview", "It would mute 1 of the 1 open alert"))
        assert "GPUFellOffBus" in await page.text("#preview .cards")
        await page.click("#window-create")
        await page.wait_for("location.search.includes('done=window-created')")
        await page.wait_for(has_text("table.windows tr.window", "node=gpu-node-7"))
        assert "GPU reseat" in await page.text("table.windows")
        # the node, with its fault and its open incident
        await page.goto(str(server.make_url("/ui/nodes")))
        await page.wait_for(has_text("tr[data-node='gpu-node-7']", "GPUFellOffBus"))
        assert "fell_off_bus 1" in await page.text("tr[data-node='gpu-node-7']")
        # resolved, History shows the incident (its alert inside)
        await post_alerts(server, faults("resolved"), token=oncall.TOKEN)
        await page.goto(str(server.make_url("/ui/history")))
        await page.wait_for(has_text("tr.incident-row", "GPUFellOffBus"))
        row = await page.text("tr.incident-row")
        assert "P1" in row and "1 alert" in row and "not acknowledged" in row
    finally:
        await close_in_process(server)
