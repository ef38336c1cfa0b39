"""People and teams (issue 43 finding 9) through a real gateway over loopback HTTP: people
signed in through the trusted proxy (oauth2-proxy's `X-Forwarded-User` and
`X-Forwarded-Groups`) act on their teams' incidents only, in the console and the API; an
admin group acts on all; the shared token is break-glass and the audit trail says so.

Two teams on one cluster: team-a's job `train-a` in namespace team-a, team-b's `train-b` in
team-b, each with a P0 paged by phone (the first layer rung), and a maintenance window that
team-b made for its namespace."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.gateway.ui.helpers import alert, post_alerts
from tests.gateway.ui.test_browser import ESCALATOR
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from trainsentry.config import AccessSettings, ConsoleSettings, GatewaySettings, TeamSettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.webhook import WebhookNotifier

TOKEN = "people-teams-token"
API = {"Authorization": f"Bearer {TOKEN}"}
ACCESS = AccessSettings(
    teams={
        "team-a": TeamSettings(namespaces=("team-a",)),
        "team-b": TeamSettings(namespaces=("team-b",), groups=("b-oncall", "b-devs")),
    },
    admin_groups=("sre",),
)


def person(name: str, groups: str) -> dict[str, str]:
    """What oauth2-proxy (`--pass-user-headers`) adds to each request it lets through."""
    return {"X-Forwarded-User": name, "X-Forwarded-Groups": groups}


def job_p0(index: int, team: str) -> dict[str, Any]:
    job = "train-a" if team == "team-a" else "train-b"
    return alert(index, priority="P0", namespace=team, trainingjob=job, node=f"gpu-00{index:02d}")


@pytest.fixture
async def gateway(db_url: str, receiver: Receiver) -> AsyncIterator[TestServer]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        webhook_token=SecretStr(TOKEN),
        api_token=SecretStr(TOKEN),
        console=ConsoleSettings(trusted_proxies=["127.0.0.0/8"]),
        access=ACCESS,
    )
    notifiers: dict[str, Notifier] = {
        "console": ConsoleNotifier(),
        "phone": WebhookNotifier(receiver.url, name="phone"),
    }
    app = create_app(settings, notifiers=notifiers, escalator=ESCALATOR, tick_interval=3600)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        await post_alerts(server, [job_p0(1, "team-a"), job_p0(2, "team-b")], TOKEN)
        yield server
    finally:
        await close_in_process(server)


async def api(server: TestServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession(headers=kwargs.pop("headers", API)) as session:
        async with session.request(method, server.make_url(path), **kwargs) as r:
            return r.status, await r.json()


async def incident_of(server: TestServer, namespace: str) -> dict[str, Any]:
    status, body = await api(server, "GET", "/api/v1/incidents")
    assert status == 200, body
    for item in body["items"]:
        _status, detail = await api(server, "GET", f"/api/v1/incidents/{item['id']}")
        if detail["alerts"][0]["namespace"] == namespace:
            return dict(detail)
    raise AssertionError(f"no incident in {namespace}")


async def team_b_window(server: TestServer, through_proxy: bool = False) -> str:
    """A window of team-b's namespace, made by team-b's bo (through the proxy, or the
    platform's API token naming bo)."""
    now = datetime.now(UTC)
    window = {
        "matchers": {"namespace": "team-b", "node": "gpu-0099"},
        "starts_at": (now - timedelta(minutes=5)).isoformat(),
        "ends_at": (now + timedelta(hours=2)).isoformat(),
        "reason": "team-b's node swap",
        "created_by": "bo",
    }
    headers = person("bo", "b-oncall") if through_proxy else API
    status, body = await api(server, "POST", "/api/v1/maintenance", json=window, headers=headers)
    assert status == 201, body
    return str(body["id"])


class Console:
    """A browser session behind the proxy: the proxy's headers on every request, the
    gateway's CSRF cookie kept."""

    def __init__(self, server: TestServer, headers: dict[str, str]) -> None:
        self.server = server
        self.session = aiohttp.ClientSession(
            headers=headers, cookie_jar=aiohttp.CookieJar(unsafe=True)
        )
        self.csrf = ""

    async def open(self) -> Console:
        async with self.session.get(self.server.make_url("/ui/")) as r:
            page = await r.text()
        found = re.search(r'name="csrf" value="([^"]+)"', page)
        assert r.status == 200 and found is not None, page[:500]
        self.csrf = found.group(1)
        return self

    async def post(self, path: str, **fields: str) -> tuple[int, str]:
        data = {"csrf": self.csrf, **fields}
        url = self.server.make_url(path)
        async with self.session.post(url, data=data, allow_redirects=False) as r:
            return r.status, await r.text()

    async def close(self) -> None:
        await self.session.close()


def calls(receiver: Receiver) -> list[str]:
    return [b["payload"]["person"]["name"] for b in receiver.bodies]


async def test_a_team_member_cannot_act_on_another_teams_incidents_in_the_console(
    gateway: TestServer, receiver: Receiver
) -> None:
    """Finding 9: team-a's person bulk-acknowledges, silences, escalates, acknowledges and
    ends a window of team-b: each refused (403, the reason says why), nothing changed, no
    call made; their own job's ack goes through, audited with how they signed in."""
    window_id = await team_b_window(gateway)
    team_b = await incident_of(gateway, "team-b")
    team_a = await incident_of(gateway, "team-a")
    assert calls(receiver) == ["alice", "alice"]  # each P0 rang the first layer
    ann = await Console(gateway, person("ann", "team-a,readers")).open()
    try:
        refused = [
            await ann.post("/ui/jobs/ack", namespace="team-b", name="train-b"),
            await ann.post(f"/ui/incidents/{team_b['id']}/silence", minutes="60"),
            await ann.post(f"/ui/incidents/{team_b['id']}/escalate"),
            await ann.post(f"/ui/incidents/{team_b['id']}/ack", comment="mine now"),
            await ann.post(f"/ui/alerts/{team_b['alerts'][0]['id']}/ack"),
            await ann.post(f"/ui/maintenance/{window_id}/end"),
        ]
        for status, page in refused:
            assert status == 403, page[:300]
            assert "ann may not act on" in page and "team-b" in page and "team-a" in page
        await gateway.app[GATEWAY_KEY].settle()
        assert (await incident_of(gateway, "team-b"))["acked_by"] is None
        assert calls(receiver) == ["alice", "alice"], "nobody rung by the refused escalate"
        _status, windows = await api(gateway, "GET", "/api/v1/maintenance")
        assert [w["id"] for w in windows["items"]] == [window_id], "the window stays"
        status, _page = await ann.post("/ui/jobs/ack", namespace="team-a", name="train-a")
        assert status == 303
    finally:
        await ann.close()
    _status, windows = await api(gateway, "GET", "/api/v1/maintenance")
    assert windows["items"][0]["created_by"] == "bo (API token)", "the token's typed name"
    mine = await incident_of(gateway, "team-a")
    assert mine["id"] == team_a["id"] and mine["acked_by"] == "ann"
    status, page = await page_of(gateway, f"/ui/alerts/{mine['alerts'][0]['id']}", "ann", "team-a")
    assert "by ann (signed in through the proxy)" in page


async def page_of(server: TestServer, path: str, name: str, groups: str) -> tuple[int, str]:
    async with aiohttp.ClientSession(headers=person(name, groups)) as session:
        async with session.get(server.make_url(path)) as r:
            return r.status, await r.text()


async def test_an_admin_acts_on_every_team_and_a_team_on_its_own(
    gateway: TestServer, receiver: Receiver
) -> None:
    """A member of team-b (by one of the team's groups) acts on team-b's incident; an admin
    (the `sre` group) escalates it and ends team-b's window."""
    window_id = await team_b_window(gateway, through_proxy=True)
    team_b = await incident_of(gateway, "team-b")
    root = await Console(gateway, person("root", "sre")).open()
    try:
        status, page = await root.post(f"/ui/incidents/{team_b['id']}/escalate")
        assert status == 303, page[:300]
        await gateway.app[GATEWAY_KEY].settle()
        assert calls(receiver) == ["alice", "alice", "bob"]
        status, page = await root.post(f"/ui/maintenance/{window_id}/end")
        assert status == 303, page[:300]
    finally:
        await root.close()
    _status, windows = await api(gateway, "GET", "/api/v1/maintenance?all=1")
    [ended] = windows["items"]
    assert ended["created_by"] == "bo (signed in through the proxy)"
    assert ended["ended_by"] == "root (signed in through the proxy)"
    dev = await Console(gateway, person("bea", "b-devs")).open()
    try:
        status, page = await dev.post("/ui/jobs/ack", namespace="team-b", name="train-b")
        assert status == 303, page[:300]
    finally:
        await dev.close()
    assert (await incident_of(gateway, "team-b"))["acked_by"] == "bea"


async def test_nobody_of_a_team_acts_on_the_clusters_own(gateway: TestServer) -> None:
    """A window that names no namespace mutes every team's alerts: only an admin makes it."""
    now = datetime.now(UTC)
    window = {
        "matchers": {"node": "gpu-0001"},
        "starts_at": now.isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat(),
    }
    status, body = await api(
        gateway, "POST", "/api/v1/maintenance", json=window, headers=person("ann", "team-a")
    )
    assert status == 403 and "no namespace" in body["error"], body
    status, body = await api(
        gateway, "POST", "/api/v1/maintenance", json=window, headers=person("root", "sre")
    )
    assert status == 201 and body["created_by"] == "root (signed in through the proxy)"


async def test_the_api_enforces_the_same_rule(gateway: TestServer, receiver: Receiver) -> None:
    """The API's acts, called by a person through the proxy: refused on another team's
    incident (403 with the reason); a `by` cannot speak for someone else; a form posted
    across sites is not believed; the API token is the platform's and is audited as such."""
    team_b = await incident_of(gateway, "team-b")
    alert_b = team_b["alerts"][0]["id"]
    ann = person("ann", "team-a")
    for method, path in (
        ("POST", f"/api/v1/incidents/{team_b['id']}/ack"),
        ("POST", f"/api/v1/alerts/{alert_b}/ack"),
        ("POST", f"/api/v1/alerts/{alert_b}/escalate"),
    ):
        status, body = await api(gateway, method, path, json={"by": "bo"}, headers=ann)
        assert status == 403 and "ann may not act on" in body["error"], (path, body)
    await gateway.app[GATEWAY_KEY].settle()
    assert calls(receiver) == ["alice", "alice"]
    # a form (what a page of another site can post with the proxy's cookie) is refused
    async with aiohttp.ClientSession(headers=person("bo", "b-oncall")) as session:
        url = gateway.make_url(f"/api/v1/alerts/{alert_b}/ack")
        async with session.post(url, data={"by": "bo"}) as r:
            assert r.status == 403 and "JSON" in (await r.json())["error"]
    # team-b's own person: the proxy's name is recorded, whatever `by` says
    status, body = await api(
        gateway, "POST", f"/api/v1/alerts/{alert_b}/ack", json={"by": "someone-else"},
        headers=person("bo", "b-oncall"),
    )  # fmt: skip
    assert status == 200 and body["acked_by"] == "bo", body
    # the API token acts on every team's, named by `by`, audited as the API token
    team_a = await incident_of(gateway, "team-a")
    status, body = await api(
        gateway, "POST", f"/api/v1/incidents/{team_a['id']}/ack", json={"by": "ci-bot"}
    )
    assert status == 200 and body["acked_by"] == "ci-bot"
    status, page = await page_of(gateway, f"/ui/incidents/{team_a['id']}", "root", "sre")
    assert "by ci-bot (API token)" in page
    status, page = await page_of(gateway, f"/ui/incidents/{team_b['id']}", "root", "sre")
    assert "by bo (signed in through the proxy)" in page


async def test_the_shared_token_is_break_glass_and_audited_as_such(gateway: TestServer) -> None:
    """Signing in with the token and a typed name acts on every team's incident; the audit
    trail names the typed name with `break-glass token`, never the name alone."""
    from tests.gateway.ui.test_console_http import csrf_of, signed_in

    team_b = await incident_of(gateway, "team-b")
    session = await signed_in(gateway, "erin", TOKEN)
    try:
        async with session.get(gateway.make_url("/ui/")) as r:
            page = await r.text()
        url = gateway.make_url(f"/ui/incidents/{team_b['id']}/ack")
        async with session.post(url, data={"csrf": csrf_of(page)}, allow_redirects=False) as r:
            assert r.status == 303
        async with session.get(gateway.make_url(f"/ui/incidents/{team_b['id']}")) as r:
            page = await r.text()
    finally:
        await session.close()
    assert (await incident_of(gateway, "team-b"))["acked_by"] == "erin (break-glass token)"
    assert "by erin (break-glass token)" in page
    assert not re.search(r"\berin\b(?! \(break-glass token\))", page), "never the name alone"
