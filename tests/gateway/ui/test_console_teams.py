"""The console's new pages under divided access (issue 43 finding 9), over loopback HTTP with
the trusted proxy's headers, no browser: their overrides, maintenance windows and node
actions go through the one check (gateway/ui/acting.py `acting`), so team-a's ann, signed
in through the proxy, is refused (403, the reason on the page) on team-b's on-call schedule,
on a window that mutes team-b's or every namespace, and on a node (the cluster's); nothing
is stored. Team-b's bo changes his schedule; an admin makes a cluster-wide window and gets
past the check on a node (the cordon is off here: 409)."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway.ui.helpers import csrf_of
from tests.support import oncall_gateway as oncall
from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from trainsentry.config import AccessSettings, ConsoleSettings, TeamSettings

ACCESS = AccessSettings(
    teams={
        "team-a": TeamSettings(namespaces=("team-a",)),
        "team-b": TeamSettings(namespaces=("team-b",), schedules=("gpu-infra",)),
    },
    admin_groups=("sre",),
)
OVERRIDE = {"schedule": "gpu-infra", "kind": "override", "who": "bob",
            "start": "2026-11-20T04:00", "end": "2026-11-20T12:00"}  # fmt: skip


@pytest.fixture
async def server(db_url: str, receiver: Receiver, tmp_path: Path) -> AsyncIterator[TestServer]:
    settings = {"access": ACCESS, "console": ConsoleSettings(trusted_proxies=["127.0.0.0/8"])}
    running = await oncall.start(db_url, receiver, Clock(oncall.START), tmp_path, settings=settings)
    try:
        yield running
    finally:
        await close_in_process(running)


class Person:
    """A browser behind the proxy: its headers on every request, the CSRF cookie kept."""

    def __init__(self, server: TestServer, name: str, groups: str) -> None:
        self.server = server
        headers = {"X-Forwarded-User": name, "X-Forwarded-Groups": groups}
        self.session = aiohttp.ClientSession(
            headers=headers, cookie_jar=aiohttp.CookieJar(unsafe=True)
        )

    async def post(self, path: str, form: dict[str, str]) -> tuple[int, str]:
        async with self.session.get(self.server.make_url("/ui/oncall")) as r:
            csrf = csrf_of(await r.text())
        url = self.server.make_url(path)
        async with self.session.post(url, data={**form, "csrf": csrf}) as r:
            return r.status, html.unescape(await r.text())

    async def close(self) -> None:
        await self.session.close()


async def stored(server: TestServer) -> tuple[list[Any], list[Any]]:
    """The overrides (removed ones too) and the maintenance windows, as the API lists them."""
    _, overrides = await oncall.call(server, "GET", "/api/v1/oncall/overrides?removed=true")
    _, windows = await oncall.call(server, "GET", "/api/v1/maintenance?all=1")
    return overrides["items"], windows["items"]


async def test_a_team_member_is_refused_on_another_teams_overrides_windows_and_nodes(
    server: TestServer,
) -> None:
    body = {**OVERRIDE, "by": "bo", "start": "2026-11-21T04:00", "end": "2026-11-21T12:00"}
    status, override = await oncall.call(server, "POST", "/api/v1/oncall/overrides", body)
    assert status == 201, override
    window = {"matchers": {"namespace": "team-b", "node": "gpu-0001"},
              "starts_at": "2026-11-20T03:00:00+00:00", "ends_at": "2026-11-20T05:00:00+00:00",
              "reason": "team-b's swap", "created_by": "bo"}  # fmt: skip
    status, made = await oncall.call(server, "POST", "/api/v1/maintenance", window)
    assert status == 201, made
    before = await stored(server)

    ann = Person(server, "ann", "team-a")
    try:
        refusals = [
            ("/ui/oncall/overrides", OVERRIDE, "on-call schedule gpu-infra"),
            (f"/ui/oncall/overrides/{override['id']}/remove", {}, "gpu-infra"),
            ("/ui/silences/windows", {"mode": "create", "matchers": "node=gpu-0001",
                                      "minutes": "30"}, "(no namespace: the cluster's)"),
            ("/ui/silences/windows", {"mode": "create", "matchers": "namespace=team-b",
                                      "minutes": "30"}, "namespaces team-b"),
            (f"/ui/maintenance/{made['id']}/end", {}, "namespaces team-b"),
            ("/ui/nodes/gpu-node-3/uncordon", {}, "node gpu-node-3"),
            ("/ui/nodes/gpu-node-3/approve", {}, "node gpu-node-3"),
            ("/ui/nodes/gpu-node-3/dismiss", {}, "node gpu-node-3"),
        ]  # fmt: skip
        for path, form, words in refusals:
            status, page = await ann.post(path, form)
            assert status == 403, (path, status, page[:300])
            assert "ann may not act on" in page and words in page, (path, page[:2000])
            assert "not of your teams (team-a)" in page, path
        assert await stored(server) == before, "nothing stored, nothing removed or ended"
        # her own namespace's window is hers
        form = {"mode": "create", "matchers": "namespace=team-a\nnode=gpu-0002", "minutes": "30"}
        status, page = await ann.post("/ui/silences/windows", form)
        assert status == 200 and "ann may not act" not in page, page[:2000]
    finally:
        await ann.close()

    bo = Person(server, "bo", "team-b")
    sue = Person(server, "sue", "sre")
    try:
        status, page = await bo.post("/ui/oncall/overrides", OVERRIDE)
        assert status == 200 and "The override is added" in page, page[:2000]
        status, page = await sue.post(
            "/ui/silences/windows", {"mode": "create", "matchers": "node=gpu-0001", "minutes": "9"}
        )
        assert status == 200 and "may not act" not in page, page[:2000]
        status, page = await sue.post("/ui/nodes/gpu-node-3/uncordon", {})
        assert status == 409 and "remediation.cordon is off" in page, "past the check"
    finally:
        await bo.close()
        await sue.close()
    overrides, windows = await stored(server)
    assert "bo (signed in through the proxy)" in {o["created_by"] for o in overrides}
    assert {w["created_by"] for w in windows} >= {
        "ann (signed in through the proxy)",
        "sue (signed in through the proxy)",
    }
