"""Incidents in a real browser (headless Chromium over the DevTools protocol,
tests/support/browser.py) against a real, in-process gateway (issue 34 item 6): Now lists
incidents with their alerts inside and follows them live; the bulk acks per incident and per
job; the incident page with its alerts, timeline and notifications; labels (attacker-
controlled: the alertname an incident is titled by among them) shown as text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.ui.helpers import TOKEN, alert, post_alerts, start
from tests.gateway.ui.test_browser import STREAM_OPEN, sign_in, sqlite
from tests.support.browser import CHROMIUM, Browser, Page
from tests.support.gateway_process import close_in_process

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]

EVIL = "<script>window.__xss = 1</script><img src=x onerror=window.__xss=2>"


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with Browser.launch(tmp_path) as tab:
        yield tab


def evil_disk(index: int, job: str = "llama-70b") -> dict[str, Any]:
    """One node's alert of a group whose very alertname is hostile markup."""
    return alert(index, alertname=EVIL, priority="P1", trainingjob=job, note=EVIL)


async def incident_of(server: Any, alert_id: int) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        async with api.get(server.make_url("/api/v1/incidents")) as r:
            items = (await r.json())["items"]
        for item in items:
            async with api.get(server.make_url(f"/api/v1/incidents/{item['id']}")) as r:
                found = await r.json()
            if alert_id in [a["id"] for a in found["alerts"]]:
                return dict(found)
    raise AssertionError(f"alert {alert_id} is in no incident")


async def no_script_ran(page: Page) -> None:
    assert await page.evaluate("window.__xss === undefined")
    assert await page.evaluate("document.querySelectorAll('script').length") == 1
    assert await page.evaluate("document.querySelectorAll('img').length") == 0


async def test_now_lists_incidents_live_and_acks_one_or_a_whole_job(
    page: Page, tmp_path: Path
) -> None:
    server = await start(sqlite(tmp_path), token=TOKEN)
    try:
        group = [evil_disk(i) for i in (1, 2, 3)]
        await post_alerts(server, [*group, alert(9, priority="P0"), evil_disk(20, "bert")], TOKEN)
        await page.goto(str(server.make_url("/ui/")))
        await sign_in(page, server, "lee", TOKEN)
        await page.wait_for(STREAM_OPEN)
        disk = await incident_of(server, 1)
        here = f"section.incident-group[data-incident-id='{disk['id']}']"
        text = await page.text_with(here, "3 firing")
        assert EVIL in text and "not acked" in text
        assert await page.evaluate(f'document.querySelectorAll("{here} a.card").length') == 3
        await no_script_ran(page)
        # a fourth node joins the group: drawn inside its incident, without a reload
        await page.evaluate("window.__same_page = true")
        await post_alerts(server, [*group, evil_disk(4)], TOKEN)
        await page.wait_for(f'document.querySelectorAll("{here} a.card").length === 4', within=20)
        assert await page.evaluate("window.__same_page") is True
        await page.text_with(here, "4 firing")
        # acknowledge that incident from Now: all its alerts, back on Now
        await page.click(f"{here} form.incident-ack button")
        await page.wait_for(
            f'document.querySelector("{here}") !== null'
            f" && document.querySelector(\"{here}\").innerText.includes('acked by lee')"
        )
        assert await page.evaluate("location.pathname") == "/ui/"
        acked = await incident_of(server, 1)
        lee = "lee (break-glass token)"  # signed in with the token
        assert acked["acked_by"] == lee and {a["acked_by"] for a in acked["alerts"]} == {lee}
        # acknowledge the whole job: its other incident (the P0); another job untouched
        await page.click("section.group[aria-label='ml/llama-70b'] form.job-ack button")
        await page.wait_for('document.body.innerText.includes("the job\'s open incidents")')
        assert (await incident_of(server, 4))["acked_by"] == lee  # the P0 (alert 4)
        assert (await incident_of(server, 5))["acked_by"] is None  # bert's
        await no_script_ran(page)
    finally:
        await close_in_process(server)


async def test_the_incident_page_shows_its_alerts_timeline_and_acks_them_all(
    page: Page, tmp_path: Path
) -> None:
    server = await start(sqlite(tmp_path), token=TOKEN)
    try:
        await post_alerts(server, [evil_disk(i) for i in (1, 2, 3)], TOKEN)
        found = await incident_of(server, 1)
        path = f"/ui/incidents/{found['id']}"
        await page.goto(str(server.make_url(f"/ui/login?next={path}")))
        await sign_in(page, server, "oncall-carol", TOKEN)
        assert await page.evaluate("location.pathname") == path
        await page.text_with("h1", EVIL)
        alerts = await page.text("section[aria-label='Alerts']")
        assert all(f"gpu-000{i}" in alerts for i in (1, 2, 3))
        await page.text_with("ol.timeline", "firing")
        await page.text_with("section[aria-label='Notifications and calls']", "console")
        await page.text_with("dl.kv", EVIL)
        await no_script_ran(page)
        await page.fill("form.action-ack input[name=comment]", "draining the pool")
        await page.click("#action-ack")
        await page.wait_for("document.body.innerText.includes('acknowledged by oncall-carol')")
        await page.text_with("ol.timeline", "draining the pool")
        assert await page.evaluate("location.pathname") == path
        acked = await incident_of(server, 1)
        assert {a["acked_by"] for a in acked["alerts"]} == {"oncall-carol (break-glass token)"}
        # an alert's card links to the alert, which links back to its incident
        await page.click("section[aria-label='Alerts'] a.card")
        await page.wait_for("location.pathname.startsWith('/ui/alerts/')")
        await page.click(f"main a[href='{path}']")
        await page.wait_for(f"location.pathname === '{path}'")
    finally:
        await close_in_process(server)
