"""Incidents in the console and the API (issue 34 item 6), over HTTP against a real
in-process gateway, on SQLite and PostgreSQL: Now lists incidents with their alerts inside,
the bulk acks (per incident and per job, CSRF and sign-in required), the incident page, and
`GET /api/v1/incidents`, `GET /api/v1/incidents/{id}`, `POST /api/v1/incidents/{id}/ack`
with their bounds."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.gateway.ui.helpers import TOKEN, alert, post_alerts, start
from tests.gateway.ui.test_console_http import csrf_of, get, signed_in
from tests.support.gateway_process import close_in_process
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.ui.handlers import NOW_CACHE_KEY

API = {"Authorization": f"Bearer {TOKEN}"}


def disk(index: int, job: str = "llama-70b") -> dict[str, Any]:
    """One node's full checkpoint disk: the alerts of one job share a group."""
    return alert(index, alertname="NodeFilesystemSpaceLow", priority="P1", trainingjob=job)


async def api(server: TestServer, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession(headers=kwargs.pop("headers", API)) as session:
        async with session.request(method, server.make_url(path), **kwargs) as r:
            return r.status, await r.json()


async def incidents(server: TestServer, query: str = "") -> list[dict[str, Any]]:
    status, body = await api(server, "GET", f"/api/v1/incidents{query}")
    assert status == 200, body
    return list(body["items"])


def sections(page: str) -> list[tuple[str, str]]:
    """(incident id, its section's HTML) for each incident drawn on Now, in order."""
    found = re.findall(
        r'(<section class="incident-group[^>]*data-incident-id="(\d+)".*?</section>)', page, re.S
    )
    return [(number, html) for html, number in found]


async def test_now_lists_incidents_with_their_alerts_inside(db_url: str) -> None:
    server = await start(db_url)
    try:
        await post_alerts(server, [*(disk(i) for i in range(1, 6)), alert(9, priority="P0")])
        status, page = await get(server, "/ui/")
        assert status == 200
        drawn = sections(page)
        assert len(drawn) == 2, page
        (first, p0), (second, group) = drawn
        assert "GPUXidError" in p0 and "P0" in p0, "the most urgent incident first"
        assert "5 firing" in group and "5 nodes" in group
        assert group.count('<a class="card ') == 5 and p0.count('<a class="card ') == 1
        assert f'href="/ui/incidents/{second}"' in group
        # the console's incidents are the API's
        listed = {str(i["id"]): i for i in await incidents(server, "?status=firing")}
        assert listed[second]["alerts_firing"] == 5 and listed[first]["priority"] == "P0"
        assert 'class="bulk-ack' not in page, "read only: no action forms"
    finally:
        await close_in_process(server)


async def test_bulk_ack_per_incident_from_now_needs_sign_in_and_csrf(db_url: str) -> None:
    server = await start(db_url, token=TOKEN)
    try:
        await post_alerts(server, [*(disk(i) for i in range(1, 6)), alert(9, priority="P0")], TOKEN)
        group = next(i for i in await incidents(server) if i["alerts_total"] == 5)
        session = await signed_in(server, "erin")
        try:
            async with session.get(server.make_url("/ui/")) as r:
                page = await r.text()
            form = f'action="/ui/incidents/{group["id"]}/ack"'
            assert form in page and "Acknowledge all 5" in page
            url = server.make_url(f"/ui/incidents/{group['id']}/ack")
            async with session.post(url, data={"from": "now"}, allow_redirects=False) as r:
                assert r.status == 403  # no CSRF token: refused, nothing acknowledged
            assert (await api(server, "GET", f"/api/v1/incidents/{group['id']}"))[1][
                "acked_by"
            ] is None
            data = {"csrf": csrf_of(page), "from": "now"}
            async with session.post(url, data=data, allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"].startswith("/ui/?done=")
            _status, detail = await api(server, "GET", f"/api/v1/incidents/{group['id']}")
            assert detail["acked_by"] == "erin (break-glass token)"  # the token's sign-in
            assert {a["acked_by"] for a in detail["alerts"]} == {"erin (break-glass token)"}
            other = next(i for i in await incidents(server) if i["id"] != group["id"])
            assert other["acked_by"] is None, "the other incident is not touched"
            async with session.get(server.make_url("/ui/")) as r:
                page = await r.text()
            drawn = dict(sections(page))
            assert "acked by erin" in drawn[str(group["id"])]
            assert f'action="/ui/incidents/{group["id"]}/ack"' not in page
        finally:
            await session.close()
    finally:
        await close_in_process(server)


async def test_bulk_ack_per_job_acknowledges_that_job_only(db_url: str) -> None:
    server = await start(db_url, token=TOKEN)
    try:
        mine = [*(disk(i) for i in range(1, 4)), alert(5, priority="P0")]
        await post_alerts(server, [*mine, disk(20, job="bert-large")], TOKEN)
        session = await signed_in(server, "ravi")
        try:
            async with session.get(server.make_url("/ui/")) as r:
                page = await r.text()
            assert page.count('action="/ui/jobs/ack"') == 2
            data = {"csrf": csrf_of(page), "namespace": "ml", "name": "llama-70b"}
            url = server.make_url("/ui/jobs/ack")
            async with session.post(url, data=data, allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/ui/?done=job-acked"
            async with session.post(url, data={**data, "name": ""}, allow_redirects=False) as r:
                assert r.status == 400  # the job is required
        finally:
            await session.close()
        by_job = {i["job"]: i for i in await incidents(server)}
        assert by_job["ml/bert-large"]["acked_by"] is None
        acked = [i for i in await incidents(server) if i["job"] == "ml/llama-70b"]
        assert len(acked) == 2 and {i["acked_by"] for i in acked} == {"ravi (break-glass token)"}
    finally:
        await close_in_process(server)


async def test_the_incident_page_shows_its_alerts_timeline_and_notifications(db_url: str) -> None:
    server = await start(db_url, token=TOKEN)
    try:
        await post_alerts(server, [disk(i) for i in range(1, 4)], TOKEN)
        [found] = await incidents(server)
        session = await signed_in(server, "erin")
        try:
            path = f"/ui/incidents/{found['id']}"
            async with session.get(server.make_url(path)) as r:
                assert r.status == 200
                page = await r.text()
            assert "NodeFilesystemSpaceLow" in page and "3</b> firing of 3 alerts" in page
            assert page.count('<a class="card ') == 3
            assert "gpu-0002" in page and "ev-firing" in page  # the alerts' events
            assert "<td>console</td><td>alert</td>" in page  # its card on the console channel
            async with session.post(
                server.make_url(f"{path}/ack"),
                data={"csrf": csrf_of(page), "comment": "draining the pool"},
                allow_redirects=False,
            ) as r:
                assert r.status == 303 and r.headers["Location"] == f"{path}?done=acked"
            async with session.get(server.make_url(f"/ui/fragments/incidents/{found['id']}")) as r:
                fragment = await r.text()
            assert "acknowledged by erin" in fragment and "draining the pool" in fragment
            for bad, status in (("/ui/incidents/999", 404), ("/ui/incidents/x1", 400)):
                async with session.get(server.make_url(bad)) as r:
                    assert r.status == status, bad
        finally:
            await session.close()
    finally:
        await close_in_process(server)


async def test_the_shared_now_list_carries_each_viewers_own_csrf_token(db_url: str) -> None:
    """Now's alert list is drawn once for every viewer of its filters (render_cache.py); the
    bulk-ack forms in it carry each viewer's own CSRF token."""
    server = await start(db_url, token=TOKEN)
    try:
        await post_alerts(server, [disk(i) for i in range(1, 3)], TOKEN)
        first, second = await signed_in(server, "a"), await signed_in(server, "b")
        try:
            pages = []
            for session in (first, second):
                async with session.get(server.make_url("/ui/fragments/now")) as r:
                    pages.append(await r.text())
            tokens = [csrf_of(page) for page in pages]
            assert tokens[0] != tokens[1]
            assert pages[0].replace(tokens[0], "T") == pages[1].replace(tokens[1], "T")
            assert server.app[NOW_CACHE_KEY].builds == 1, "drawn once for both"
        finally:
            await first.close()
            await second.close()
    finally:
        await close_in_process(server)


async def test_the_incidents_api_is_bounded_paged_and_acks_the_incident(db_url: str) -> None:
    server = await start(db_url, token=TOKEN)
    try:
        await post_alerts(server, [*(disk(i) for i in range(1, 6)), alert(9, priority="P0")], TOKEN)
        for query, reason in (
            ("?limit=0", "limit"), ("?limit=1001", "limit"), ("?before=x", "before"),
            ("?status=open", "status"), ("?priority=P9", "priority"), ("?job=" + "j" * 1025, "job"),
        ):  # fmt: skip
            status, body = await api(server, "GET", f"/api/v1/incidents{query}")
            assert status == 400 and reason in body["error"], (query, body)
        status, body = await api(server, "GET", "/api/v1/incidents", headers={})
        assert status == 401
        page = await api(server, "GET", "/api/v1/incidents?limit=1")
        assert len(page[1]["items"]) == 1 and page[1]["next_before"] is not None
        rest = await incidents(server, f"?limit=1&before={page[1]['next_before']}")
        assert len(rest) == 1 and rest[0]["id"] < page[1]["items"][0]["id"]
        assert [i["priority"] for i in await incidents(server, "?priority=P0")] == ["P0"]
        assert len(await incidents(server, "?job=llama-70b")) == 2
        assert len(await incidents(server, "?job=ml/llama-70b")) == 2
        assert await incidents(server, "?job=other") == []
        assert await incidents(server, "?status=resolved") == []
        group = next(i for i in await incidents(server) if i["alerts_total"] == 5)
        path = f"/api/v1/incidents/{group['id']}"
        # its alerts, a page at a time (newest first below `alerts_before`)
        status, detail = await api(server, "GET", f"{path}?alerts_limit=2")
        assert status == 200 and len(detail["alerts"]) == 2
        seen = [a["id"] for a in detail["alerts"]]
        before = detail["alerts_next_before"]
        while before is not None:
            _, more = await api(server, "GET", f"{path}?alerts_limit=2&alerts_before={before}")
            seen += [a["id"] for a in more["alerts"]]
            before = more["alerts_next_before"]
        assert len(set(seen)) == 5
        assert (await api(server, "GET", f"{path}?alerts_limit=5000"))[0] == 400
        assert (await api(server, "GET", "/api/v1/incidents/99999"))[0] == 404
        assert (await api(server, "GET", "/api/v1/incidents/0"))[0] == 400
        # the ack: authenticated, validated, the incident's every alert
        ack = f"{path}/ack"
        assert (await api(server, "POST", ack, json={"by": "x"}, headers={}))[0] == 401
        assert (await api(server, "POST", ack, json={}))[0] == 400
        assert (await api(server, "POST", ack, json={"by": "x", "silence_minutes": -1}))[0] == 400
        assert (await api(server, "POST", "/api/v1/incidents/99999/ack", json={"by": "x"}))[
            0
        ] == 404
        status, answer = await api(server, "POST", ack, json={"by": "lee", "comment": "on it"})
        assert status == 200 and answer["incident_id"] == group["id"]
        assert answer["alerts_acked"] == 5 and answer["acked_by"] == "lee"
        status, again = await api(server, "POST", ack, json={"by": "kim"})
        assert again["already_acked"] and again["acked_by"] == "lee"
        await server.app[GATEWAY_KEY].settle()
    finally:
        await close_in_process(server)
