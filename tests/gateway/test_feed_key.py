"""The iCalendar feed for calendar apps, which cannot send a bearer token: each schedule has
a subscription URL with a key (an HMAC of its name under the gateway's read token), shown
only to an authenticated caller (API and `trainsentry oncall feed`). The right key opens
that schedule's feed (200); a wrong, another schedule's or no key is a 401; the key reaches
no log line."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import aiohttp
import icalendar
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway.commands.test_oncall_commands import cli
from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.oncall_gateway import ONCALL, START, TOKEN, call, start
from tests.support.receiver import Receiver
from trainsentry.gateway.commands import serve
from trainsentry.oncall.ical import feed_key

TWO = ONCALL.replace(
    "escalation_policies:",
    """  ml:
    timezone: UTC
    layers:
      - {name: primary, start: "2026-11-16T09:00", shift: 1d, members: [carol]}
escalation_policies:""",
)


async def fetch(server: TestServer, path: str) -> tuple[int, str]:
    """Like a calendar app: no Authorization header."""
    async with aiohttp.ClientSession() as session, session.get(server.make_url(path)) as answer:
        return answer.status, await answer.text()


def test_the_key_is_an_hmac_of_the_schedule_under_the_secret() -> None:
    key = feed_key("s3cret", "gpu-infra")
    assert len(key) == 32 and int(key, 16) >= 0
    assert key == feed_key("s3cret", "gpu-infra")  # stable: subscriptions keep working
    assert key != feed_key("s3cret", "ml")  # one schedule's key opens no other
    assert key != feed_key("other", "gpu-infra")  # a new token: new keys
    assert "s3cret" not in key


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_calendar_app_subscribes_with_the_key(
    db_url: str, receiver: Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # served as `trainsentry gateway` serves: without an access log (which would show keys)
    server = await start(db_url, receiver, Clock(START), tmp_path, oncall=TWO, access_log=False)
    url = str(server.make_url("/")).rstrip("/")
    try:
        # an authenticated caller is shown each schedule's URL with its key
        assert (await call(server, "GET", "/api/v1/oncall/feeds", token=None))[0] == 401
        status, answer = await call(server, "GET", "/api/v1/oncall/feeds")
        assert status == 200, answer
        feeds = {f["schedule"]: f for f in answer["feeds"]}
        assert sorted(feeds) == ["gpu-infra", "ml"]
        key = feed_key(TOKEN, "gpu-infra")
        assert feeds["gpu-infra"]["path"] == f"/api/v1/oncall/gpu-infra.ics?key={key}"
        assert feeds["gpu-infra"]["url"] == url + feeds["gpu-infra"]["path"]
        # the right key: 200 and the calendar, without a bearer token
        status, body = await fetch(server, feeds["gpu-infra"]["path"] + "&days=14")
        assert status == 200, body
        assert icalendar.Calendar.from_ical(body).walk("VEVENT")
        status, body = await fetch(server, feeds["ml"]["path"])
        assert status == 200, body
        # a wrong key, another schedule's key, an empty one, none: 401
        ml_key = feed_key(TOKEN, "ml")
        for path in (
            f"/api/v1/oncall/gpu-infra.ics?key={key[:-1]}0"
            if not key.endswith("0")
            else f"/api/v1/oncall/gpu-infra.ics?key={key[:-1]}1",
            f"/api/v1/oncall/gpu-infra.ics?key={ml_key}",
            "/api/v1/oncall/gpu-infra.ics?key=",
            "/api/v1/oncall/gpu-infra.ics?key=%C3%A9%00",
            "/api/v1/oncall/gpu-infra.ics",
        ):
            status, body = await fetch(server, path)
            assert status == 401, (path, body)
            assert key not in body
        # the key opens the feed only: not the other read endpoints
        assert (await fetch(server, f"/api/v1/oncall?key={key}"))[0] == 401
        # the bearer token still opens the feed
        assert (await call(server, "GET", "/api/v1/oncall/gpu-infra.ics"))[0] == 200
        # the command shows the same URLs
        code, out = await cli("oncall", "feed", "--gateway", url)
        assert code == 0, out
        assert f"gpu-infra {url}/api/v1/oncall/gpu-infra.ics?key={key}" in out.splitlines()
        code, out = await cli("oncall", "feed", "--schedule", "nope", "--gateway", url)
        assert code == 3, out
        code, out = await cli("oncall", "feed", "--gateway", url, token="wrong")
        assert code == 1 and key not in out
    finally:
        await close_in_process(server)
    lines = [r.getMessage() for r in caplog.records]
    assert any(r.name.startswith("trainsentry") for r in caplog.records)  # it did log...
    assert not any(key in line or ml_key in line for line in lines)  # ...never a key


def test_the_gateway_serves_without_an_access_log() -> None:
    """A request line would carry a feed's key: `trainsentry gateway` keeps no access log."""
    source = inspect.getsource(serve)
    assert "access_log=None" in source
