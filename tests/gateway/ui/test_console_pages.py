"""The console's On call, Silences and windows, Nodes and History pages over HTTP against a
real in-process gateway (SQLite and PostgreSQL where the store is read): each page drawn from
the same services as the API, each change made through them (and seen by the API), every
change needing the sign-in and the CSRF token."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.gateway.ui.helpers import TOKEN, alert, csrf_of, post_alerts, signed_in, start
from tests.support import oncall_gateway as oncall
from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from tests.support.webhook_factory import make_alert


async def api(server: TestServer, path: str, token: str = TOKEN) -> Any:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(server.make_url(path)) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def post_form(
    session: aiohttp.ClientSession, server: TestServer, path: str, form: dict[str, str]
) -> tuple[int, str, str]:
    """Posts the console's form; (status, the page answered or redirected to, its path)."""
    async with session.post(server.make_url(path), data=form) as r:
        return r.status, await r.text(), r.url.path_qs


def rows(page: str, marker: str) -> list[str]:
    """The `<tr>` rows carrying `marker` (an attribute), as text."""
    return re.findall(rf"<tr[^>]*{marker}[^>]*>.*?</tr>", page, flags=re.S)


async def test_history_lists_one_row_per_incident_with_its_alerts_inside(db_url: str) -> None:
    """Three alerts of one cause on three nodes and one of another job are two incidents,
    not four rows: each with its priority, how long it lasted, who acknowledged it and after
    how long, and its alerts inside; the search finds an incident by one of its alerts."""
    server = await start(db_url, token=TOKEN)
    fired = [alert(i, priority="P1") for i in (1, 2, 3)]
    other = alert(9, alertname="NodeDiskFull", priority="P2", trainingjob="other-job")
    try:
        await post_alerts(server, [*fired, other], token=TOKEN)
        session = await signed_in(server, "ann")
        try:
            async with session.get(server.make_url("/ui/alerts/1")) as r:
                page = await r.text()
            form = {"csrf": csrf_of(page), "comment": "draining"}
            status, _page, _path = await post_form(session, server, "/ui/alerts/1/ack", form)
            assert status == 200
            resolved = [
                make_alert(i, status="resolved", labels={"priority": "P1"}) for i in (1, 2, 3)
            ]
            done = make_alert(
                9, status="resolved", name="NodeDiskFull",
                labels={"priority": "P2", "trainingjob": "other-job"},
            )  # fmt: skip
            await post_alerts(server, [*resolved, done], token=TOKEN)
            incidents = (await api(server, "/api/v1/incidents?status=resolved"))["items"]
            assert len(incidents) == 2
            async with session.get(server.make_url("/ui/history?days=7")) as r:
                assert r.status == 200
                page = await r.text()
            drawn = rows(page, "data-incident-id")
            assert len(drawn) == 2 and "2 incidents resolved" in page
            [xid] = [row for row in drawn if "GPUXidError" in row]
            assert "P1" in xid and "3 alerts" in xid and "by ann" in xid and "after " in xid
            assert sorted(re.findall(r'data-alert-id="(\d+)"', xid)) == ["1", "2", "3"]
            [disk] = [row for row in drawn if "NodeDiskFull" in row]
            assert "not acknowledged" in disk and "ml/other-job" in disk
            async with session.get(server.make_url("/ui/history?q=gpu-0002&days=7")) as r:
                found = rows(await r.text(), "data-incident-id")
            assert len(found) == 1 and "GPUXidError" in found[0]
        finally:
            await session.close()
    finally:
        await close_in_process(server)


async def test_on_call_shows_now_and_next_and_overrides_are_added_and_removed(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    server = await oncall.start(db_url, receiver, Clock(oncall.START), tmp_path)
    try:
        session = await signed_in(server, "ivy", oncall.TOKEN)
        try:
            async with session.get(server.make_url("/ui/oncall")) as r:
                page = await r.text()
            now = page[page.index('class="now-on-call"') : page.index('class="next-on-call"')]
            assert re.search(r"primary\">alice</span> <small>\(primary, until 2026-11-23 08", now)
            assert "bob</span> <small>(backup" in now
            nxt = page[page.index('class="next-on-call"') : page.index("<h3>Layers")]
            assert "from 2026-11-23 08:00:00 UTC" in nxt and 'primary">carol' in nxt
            layers = page[page.index('class="layers"') : page.index("<h3>Overrides")]
            assert "alice, carol" in layers and "1 w" in layers
            # a wrong override: the service's reason, nothing stored
            form = {
                "csrf": csrf_of(page), "schedule": "gpu-infra", "kind": "override",
                "who": "bob", "start": "2026-11-20T09:00", "end": "2026-11-20T05:00",
                "reason": "swap for the <b>offsite</b>",
            }  # fmt: skip
            status, answer, _path = await post_form(session, server, "/ui/oncall/overrides", form)
            assert status == 400 and "end: is not after start" in answer
            assert (await api(server, "/api/v1/oncall/overrides", oncall.TOKEN))["items"] == []
            forged = {**form, "csrf": "forged", "end": "2026-11-20T12:00"}
            status, _answer, _path = await post_form(
                session, server, "/ui/oncall/overrides", forged
            )
            assert status == 403
            # bob takes the pager from 05:00 to 12:00 Berlin time (03:00 UTC is 04:00 there)
            form.update(start="2026-11-20T04:00", end="2026-11-20T12:00")
            status, answer, path = await post_form(session, server, "/ui/oncall/overrides", form)
            assert status == 200 and path == "/ui/oncall?done=override-added"
            assert "The override is added" in answer
            now = answer[answer.index('class="now-on-call"') : answer.index('class="next-on-call"')]
            assert 'primary">bob</span> <small>(override, until 2026-11-20 11:00:00 UTC' in now
            assert "swap for the &lt;b&gt;offsite&lt;/b&gt;" in answer
            [stored] = (await api(server, "/api/v1/oncall/overrides", oncall.TOKEN))["items"]
            assert stored["who"] == "bob" and stored["created_by"] == "ivy (break-glass token)"
            who = await api(server, "/api/v1/oncall?schedule=gpu-infra", oncall.TOKEN)
            assert who["on_call"][0]["name"] == "bob"
            # removed from the page, through the same service
            action = f"/ui/oncall/overrides/{stored['id']}/remove"
            assert f'action="{action}"' in answer
            form = {"csrf": csrf_of(answer)}
            status, answer, path = await post_form(session, server, action, form)
            assert status == 200 and path == "/ui/oncall?done=override-removed"
            assert f'action="{action}"' not in answer
            listed = await api(server, "/api/v1/oncall/overrides?removed=true", oncall.TOKEN)
            assert listed["items"][0]["removed_by"] == "ivy (break-glass token)"
            status, answer, _path = await post_form(session, server, action, form)
            assert status == 404
        finally:
            await session.close()
    finally:
        await close_in_process(server)


async def test_a_window_is_previewed_made_and_ended_from_the_silences_page(db_url: str) -> None:
    server = await start(db_url, token=TOKEN)
    try:
        await post_alerts(server, [alert(1, priority="P1"), alert(2, priority="P2")], token=TOKEN)
        session = await signed_in(server, "kim")
        try:
            async with session.get(server.make_url("/ui/silences")) as r:
                page = await r.text()
            assert r.status == 200 and "No window open." in page
            form = {
                "csrf": csrf_of(page), "mode": "preview", "matchers": "node=gpu-0001",
                "minutes": "90", "timezone": "UTC", "reason": "<b>NVLink</b> swap",
            }  # fmt: skip
            status, answer, _path = await post_form(session, server, "/ui/silences/windows", form)
            assert status == 200 and "Preview: node=gpu-0001" in answer
            assert "It would mute 1 of the 2 open alerts" in answer and "Active now" in answer
            preview = answer[answer.index('id="preview"') :]
            assert 'data-alert-id="1"' in preview and 'data-alert-id="2"' not in preview
            assert 'value="&lt;b&gt;NVLink&lt;/b&gt; swap"' in answer  # the form, kept
            assert (await api(server, "/api/v1/maintenance"))["items"] == []  # nothing made
            # the API's validation: a window every alert without a label would match
            bad = {**form, "matchers": "rack~.*"}
            status, answer, _path = await post_form(session, server, "/ui/silences/windows", bad)
            assert status == 400 and "every matcher matches the empty string" in answer
            bad = {**form, "matchers": "just-a-word"}
            status, answer, _path = await post_form(session, server, "/ui/silences/windows", bad)
            assert status == 400 and "LABEL=VALUE or LABEL~REGEX" in answer
            status, answer, path = await post_form(
                session, server, "/ui/silences/windows", {**form, "mode": "create"}
            )
            assert status == 200 and path == "/ui/silences?done=window-created"
            [made] = (await api(server, "/api/v1/maintenance"))["items"]
            assert made["created_by"] == "kim (break-glass token)"
            assert made["matchers"] == {"node": "gpu-0001"}
            assert made["active"] is True
            [row] = rows(answer, "data-window-id")
            assert made["id"] in row and "node=gpu-0001" in row and "&lt;b&gt;NVLink" in row
            # ended early, back on this page
            end = {"csrf": csrf_of(answer), "from": "silences"}
            status, answer, path = await post_form(
                session, server, f"/ui/maintenance/{made['id']}/end", end
            )
            assert status == 200 and path == "/ui/silences?done=window-ended"
            assert rows(answer, "data-window-id") == []
            [ended] = (await api(server, "/api/v1/maintenance?all=1"))["items"]
            assert ended["ended_by"] == "kim (break-glass token)"
        finally:
            await session.close()
        async with aiohttp.ClientSession() as anonymous:  # no sign-in: no change
            url = server.make_url("/ui/silences/windows")
            async with anonymous.post(url, data=form, allow_redirects=False) as r:
                assert r.status in (303, 403)
        assert len((await api(server, "/api/v1/maintenance?all=1"))["items"]) == 1
    finally:
        await close_in_process(server)


async def test_the_silences_the_gateway_made_are_listed(tmp_path: Path) -> None:
    """A silence from the console (a real Alertmanager) is listed with who made it, from
    which alert, until when, and its state in Alertmanager (expired there early: said so);
    one whose length ran out is not."""
    from tests.support.realservers import start_alertmanager
    from trainsentry.notifiers.alertmanager import SilenceClient

    am_config = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
    with start_alertmanager(tmp_path, am_config) as am:
        clock = Clock()
        silences = SilenceClient(am.url)
        db = f"sqlite:///{tmp_path / 'store.db'}"
        server = await start(db, token=TOKEN, silences=silences, clock=clock)
        try:
            await post_alerts(server, [alert(1, priority="P1")], token=TOKEN)
            session = await signed_in(server, "lee")
            try:
                async with session.get(server.make_url("/ui/alerts/1")) as r:
                    page = await r.text()
                form = {"csrf": csrf_of(page), "minutes": "60"}
                status, _page, _path = await post_form(
                    session, server, "/ui/alerts/1/silence", form
                )
                assert status == 200
                async with session.get(server.make_url("/ui/silences")) as r:
                    page = await r.text()
                listed = page[page.index('class="silences"') :]
                [silence_id] = re.findall(r"<code>([0-9a-f-]{36})</code>", listed)
                assert "GPUXidError" in listed and "lee" in listed and "gpu-0001" in listed
                [row] = rows(page, "data-silence-id")
                assert row.endswith("<td>active</td></tr>")  # as Alertmanager says
                # ended early in Alertmanager's own UI: the page says so
                await silences.expire_silence(silence_id)
                async with session.get(server.make_url("/ui/silences")) as r:
                    [row] = rows(await r.text(), "data-silence-id")
                assert silence_id in row and "expired: ended early there" in row
                clock.now += timedelta(minutes=61)
                async with session.get(server.make_url("/ui/silences")) as r:
                    page = await r.text()
                assert silence_id not in page and "None in force" in page
            finally:
                await session.close()
        finally:
            await close_in_process(server)
            await silences.aclose()


async def test_nodes_show_health_incidents_and_cordons_and_approvers_decide(
    tmp_path: Path,
) -> None:
    """A sick node with a cordon recommended: its score, faults and open incident are drawn;
    someone who is not an approver is refused (403) and nothing changes; the approver
    (alice) approves it from the page, through the service behind the card's button (the
    Node turns unschedulable in the cluster), and uncordons it through the service behind
    the API's uncordon."""
    from tests.gateway.stages.cordon_harness import (
        emulated_cluster,
        fault,
        gateways,
        unschedulable,
    )
    from trainsentry.gateway.policy.cordon import NodeDecision, Status
    from trainsentry.store.cordon import SCOPE
    from trainsentry.store.policy_state import save_states

    node = "gpu-node-3"
    async with (
        emulated_cluster() as cluster,
        gateways(cluster, tmp_path, f"sqlite:///{tmp_path / 'store.db'}") as run,
    ):
        running = await run()
        server = running.server
        await running.post(fault(1, node, None, 0.5), fault(2, node, None, 0.2, gpu="5"))
        now = datetime.now(UTC)
        recommended = NodeDecision(Status.RECOMMENDED, now, score=21.0, jobs=("ml/big",))
        async with running.gateway.engine.begin() as conn:
            await save_states(conn, SCOPE, {node: (recommended.to_json(), None)}, now)
        mallory = await signed_in(server, "mallory", "api-token")
        try:
            async with mallory.get(server.make_url("/ui/nodes")) as r:
                page = await r.text()
            assert r.status == 200
            [row] = rows(page, f'data-node="{node}"')
            assert "fell_off_bus 2" in row and "recommended" in row
            assert re.search(r'href="/ui/incidents/\d+">P\d GPUFellOffBus', row)
            assert "Approve cordon" not in row  # not an approver: no button
            form = {"csrf": csrf_of(page)}
            status, answer, _path = await post_form(
                mallory, server, f"/ui/nodes/{node}/approve", form
            )
            assert status == 403 and "may not decide cordons" in answer
            assert not unschedulable(cluster, node)
        finally:
            await mallory.close()
        alice = await signed_in(server, "alice", "api-token")
        try:
            async with alice.get(server.make_url("/ui/nodes")) as r:
                page = await r.text()
            assert f'action="/ui/nodes/{node}/approve"' in page
            form = {"csrf": csrf_of(page)}
            status, answer, path = await post_form(alice, server, f"/ui/nodes/{node}/approve", form)
            assert status == 200 and path == "/ui/nodes?done=cordon-approved", answer[-500:]
            assert unschedulable(cluster, node)
            [row] = rows(answer, f'data-node="{node}"')
            assert "cordoned</span> by alice" in row
            assert f'action="/ui/nodes/{node}/uncordon"' in row
            status, answer, path = await post_form(
                alice, server, f"/ui/nodes/{node}/uncordon", {"csrf": csrf_of(answer)}
            )
            assert status == 200 and path == "/ui/nodes?done=uncordoned"
            assert not unschedulable(cluster, node)
            [row] = rows(answer, f'data-node="{node}"')
            assert "uncordoned</span> by alice" in row
            # uncordoned already: the service's refusal, as the API answers it
            status, answer, _path = await post_form(
                alice, server, f"/ui/nodes/{node}/uncordon", {"csrf": csrf_of(answer)}
            )
            assert status == 409 and "was not cordoned by trainsentry" in answer
        finally:
            await alice.close()


async def test_the_new_pages_read_and_draw_a_bounded_amount(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """History draws the newest MAX_HISTORY incidents and HISTORY_ALERTS alerts in each (a
    large incident says how many more, and crowds no other out); a window's preview checks
    the MAX_CHECKED most urgent open alerts and says of how many; Nodes draws MAX_NODES."""
    from trainsentry.gateway.ui import handlers, ops_views, window_pages

    monkeypatch.setattr(handlers, "MAX_HISTORY", 2)
    monkeypatch.setattr(handlers, "HISTORY_ALERTS", 2)
    monkeypatch.setattr(window_pages, "MAX_CHECKED", 2)
    monkeypatch.setattr(ops_views, "MAX_NODES", 1)
    server = await start(db_url, token=TOKEN)
    big = [alert(i, priority="P1", trainingjob="big") for i in (1, 2, 3, 4)]
    small = [
        alert(5, alertname="NodeDiskFull", trainingjob="a"),
        alert(6, alertname="NodeDiskFull", trainingjob="b"),
    ]
    try:
        await post_alerts(server, [*big, *small], token=TOKEN)
        session = await signed_in(server, "kim")
        try:
            async with session.get(server.make_url("/ui/silences")) as r:
                page = await r.text()
            form = {"csrf": csrf_of(page), "mode": "preview", "matchers": "alertname~.+",
                    "minutes": "30"}  # fmt: skip
            status, answer, _path = await post_form(session, server, "/ui/silences/windows", form)
            assert status == 200
            assert "It would mute 2 of the 2 open alerts checked (the most urgent of 6)" in answer
            resolved = [
                make_alert(i, status="resolved", labels={"priority": "P1", "trainingjob": "big"})
                for i in (1, 2, 3, 4)
            ]
            done = [
                make_alert(
                    index, status="resolved", name="NodeDiskFull", labels={"trainingjob": job}
                )
                for index, job in ((5, "a"), (6, "b"))
            ]
            await post_alerts(server, [*resolved, *done], token=TOKEN)
            assert len((await api(server, "/api/v1/incidents?status=resolved"))["items"]) == 3
            async with session.get(server.make_url("/ui/history")) as r:
                page = await r.text()
            drawn = rows(page, "data-incident-id")
            assert len(drawn) == 2 and "(the newest 2)" in page
            async with session.get(server.make_url("/ui/history?q=big")) as r:
                [row] = rows(await r.text(), "data-incident-id")
            assert "4 alerts" in row and "and 2 more on its page" in row
            assert len(re.findall(r'data-alert-id="\d+"', row)) == 2
            fell = [  # the chart's cluster-wide rule's (no namespace: trusted evidence)
                make_alert(10 + n, name="GPUFellOffBus", starts_at=datetime.now(UTC),
                           labels={"node": f"gpu-node-{n}", "component": "gpu"})
                for n in (1, 2)
            ]  # fmt: skip
            for one in fell:
                del one["labels"]["namespace"], one["labels"]["trainingjob"]
            await post_alerts(server, fell, token=TOKEN)
            async with session.get(server.make_url("/ui/nodes")) as r:
                page = await r.text()
            assert len(rows(page, "data-node=")) == 1 and "2 nodes (the first 1 drawn)" in page
        finally:
            await session.close()
    finally:
        await close_in_process(server)


CHANGES = [
    ("/ui/oncall/overrides", {"schedule": "gpu-infra", "who": "bob",
                              "start": "2026-11-20T04:00", "end": "2026-11-20T12:00"}),
    ("/ui/oncall/overrides/1/remove", {}),
    ("/ui/silences/windows", {"mode": "create", "matchers": "node=gpu-0001", "minutes": "30"}),
    ("/ui/nodes/gpu-node-3/uncordon", {}),
    ("/ui/nodes/gpu-node-3/approve", {}),
    ("/ui/nodes/gpu-node-3/dismiss", {}),
]  # fmt: skip


async def test_every_new_change_needs_a_sign_in_the_csrf_token_and_this_origin(
    receiver: Receiver, tmp_path: Path
) -> None:
    """Each state-changing form of the new pages: refused without a sign-in, with a wrong
    CSRF token, and from another site's page (with the right token); nothing is stored."""
    server = await oncall.start(
        f"sqlite:///{tmp_path / 'store.db'}", receiver, Clock(oncall.START), tmp_path
    )
    try:
        session = await signed_in(server, "ivy", oncall.TOKEN)
        try:
            async with session.get(server.make_url("/ui/oncall")) as r:
                csrf = csrf_of(await r.text())
            async with aiohttp.ClientSession() as anonymous:
                for path, form in CHANGES:
                    url = server.make_url(path)
                    async with anonymous.post(url, data=form, allow_redirects=False) as r:
                        assert r.status == 303 and r.headers["Location"].startswith("/ui/login")
                    async with session.post(url, data={**form, "csrf": "forged"}) as r:
                        assert r.status == 403, path
                    evil = {"Origin": "https://evil.example"}
                    async with session.post(url, data={**form, "csrf": csrf}, headers=evil) as r:
                        assert r.status == 403, path
        finally:
            await session.close()
        assert (await api(server, "/api/v1/oncall/overrides", oncall.TOKEN))["items"] == []
        assert (await api(server, "/api/v1/maintenance?all=1", oncall.TOKEN))["items"] == []
    finally:
        await close_in_process(server)
