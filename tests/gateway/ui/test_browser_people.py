"""People and teams in a real browser (headless Chromium, tests/support/browser.py) against a
real, in-process gateway (issue 43 finding 9): a person the proxy signed in (oauth2-proxy's
headers, set on every request the browser makes) presses "Acknowledge job" on another
team's job and is refused with the reason, nothing acknowledged; their own job's goes
through; the break-glass sign-in says so in the header and in the audit trail."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.gateway.test_people_teams import ACCESS, TOKEN, incident_of, job_p0, person
from tests.gateway.ui.helpers import post_alerts
from tests.gateway.ui.test_browser import sign_in
from tests.support.browser import CHROMIUM, Browser, Page
from tests.support.gateway_process import close_in_process
from trainsentry.config import ConsoleSettings, GatewaySettings
from trainsentry.gateway.assemble import create_app

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with Browser.launch(tmp_path) as tab:
        yield tab


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[TestServer]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=f"sqlite:///{tmp_path / 'store.db'}",
        webhook_token=SecretStr(TOKEN),
        api_token=SecretStr(TOKEN),
        console=ConsoleSettings(trusted_proxies=["127.0.0.0/8"]),
        access=ACCESS,
    )
    server = TestServer(create_app(settings, tick_interval=3600), host="127.0.0.1")
    await server.start_server()
    try:
        await post_alerts(server, [job_p0(1, "team-a"), job_p0(2, "team-b")], TOKEN)
        yield server
    finally:
        await close_in_process(server)


def submit_job_ack(job: str) -> str:
    return (
        "[...document.querySelectorAll('form.job-ack')]"
        f".find(f => f.querySelector('input[name=name]').value === '{job}').submit()"
    )


async def test_a_team_member_is_refused_another_teams_job_in_the_browser(
    page: Page, gateway: TestServer
) -> None:
    await page.send("Network.enable")
    await page.send("Network.setExtraHTTPHeaders", headers=person("ann", "team-a"))
    await page.goto(str(gateway.make_url("/ui/")))
    assert "ann" in await page.text("header .who")
    assert await page.evaluate("document.querySelectorAll('form.job-ack').length") == 2
    await page.evaluate(submit_job_ack("train-b"))
    await page.wait_for("document.body.innerText.includes('may not act on')")
    refusal = await page.text("main")
    assert "ann may not act on job team-b/train-b" in refusal and "team-a" in refusal
    assert (await incident_of(gateway, "team-b"))["acked_by"] is None
    await page.goto(str(gateway.make_url("/ui/")))
    await page.evaluate(submit_job_ack("train-a"))
    await page.wait_for('document.body.innerText.includes("the job\'s open incidents")')
    assert (await incident_of(gateway, "team-a"))["acked_by"] == "ann"
    team_a = await incident_of(gateway, "team-a")
    await page.goto(str(gateway.make_url(f"/ui/incidents/{team_a['id']}")))
    assert "by ann (signed in through the proxy)" in await page.text("ol.timeline")


async def test_the_break_glass_sign_in_says_so(page: Page, gateway: TestServer) -> None:
    team_b = await incident_of(gateway, "team-b")
    await page.goto(str(gateway.make_url(f"/ui/login?next=/ui/incidents/{team_b['id']}")))
    await sign_in(page, gateway, "erin", TOKEN)
    assert "erin (break-glass token)" in await page.text("header .who")
    await page.click("#action-ack")
    await page.wait_for("document.body.innerText.includes('acknowledged by erin')")
    assert "by erin (break-glass token)" in await page.text("ol.timeline")
    assert (await incident_of(gateway, "team-b"))["acked_by"] == "erin (break-glass token)"
