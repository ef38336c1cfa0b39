"""The console over plain HTTP against a real in-process gateway, on SQLite and PostgreSQL:
auth (read only without a token, sign-in, the trusted proxy header, CSRF and origin),
bad parameters, history search, the job page's hardware, the drawn hang diagnosis and the
live feed."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.gateway.ui.helpers import (
    TOKEN,
    alert,
    csrf_of,
    hang_verdict,
    post_alerts,
    signed_in,
    start,
    store_verdict,
)
from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from tests.support.webhook_factory import make_alert
from trainsentry.config import ConsoleSettings
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.notifiers.base import OutboundNotification, PermanentError, Receipt


async def get(server: TestServer, path: str, **kwargs: Any) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(server.make_url(path), allow_redirects=False, **kwargs) as r:
            return r.status, await r.text()


async def acked_by(server: TestServer, alert_id: int) -> str | None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(server.make_url(f"/api/v1/alerts/{alert_id}")) as r:
            return (await r.json())["acked_by"]


async def test_without_a_token_the_console_is_read_only(db_url: str) -> None:
    server = await start(db_url)
    try:
        await post_alerts(server, [alert(1, priority="P0")])
        status, page = await get(server, "/ui/alerts/1")
        assert status == 200 and "Read only" in page and 'id="action-ack"' not in page
        async with aiohttp.ClientSession() as session:
            url = server.make_url("/ui/alerts/1/ack")
            async with session.post(url, data={"comment": "x"}) as r:
                assert r.status == 403
        assert await acked_by(server, 1) is None
    finally:
        await close_in_process(server)


async def test_with_a_token_reads_need_a_sign_in_and_actions_need_csrf_and_origin(
    db_url: str,
) -> None:
    server = await start(db_url, token=TOKEN)
    try:
        await post_alerts(server, [alert(1, priority="P1")], token=TOKEN)
        for path in ("/ui/", "/ui/alerts/1", "/ui/history", "/ui/job?name=llama-70b"):
            status, _ = await get(server, path)
            assert status == 303, path
        assert (await get(server, "/ui/fragments/now"))[0] == 401
        assert (await get(server, "/ui/events"))[0] == 401
        # a forged session cookie is no session
        status, _ = await get(server, "/ui/", cookies={"ts_session": "eyJ1IjoiZXZlIn0.AAAA"})
        assert status == 303
        session = await signed_in(server)
        try:
            async with session.get(server.make_url("/ui/alerts/1")) as r:
                page = await r.text()
            url = server.make_url("/ui/alerts/1/ack")
            form = {"csrf": csrf_of(page), "comment": ""}
            async with session.post(url, data={"comment": ""}, allow_redirects=False) as r:
                assert r.status == 403  # no token in the form
            evil = {"Origin": "https://evil.example"}
            async with session.post(url, data=form, headers=evil, allow_redirects=False) as r:
                assert r.status == 403  # right token, another site's page
            assert await acked_by(server, 1) is None
            async with session.post(url, data=form, allow_redirects=False) as r:
                assert r.status == 303
            assert await acked_by(server, 1) == "erin (break-glass token)"  # the token's
        finally:
            await session.close()
    finally:
        await close_in_process(server)


async def test_a_trusted_proxy_names_the_user_and_others_cannot(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    trusted = ConsoleSettings(trusted_proxies=["127.0.0.0/8"], user_header="X-Auth-User")
    server = await start(db, token=TOKEN, console=trusted)
    try:
        status, page = await get(server, "/ui/", headers={"X-Auth-User": "frank"})
        assert status == 200 and "frank" in page
    finally:
        await close_in_process(server)
    untrusted = ConsoleSettings(trusted_proxies=["10.0.0.0/8"], user_header="X-Auth-User")
    server = await start(db, token=TOKEN, console=untrusted)
    try:
        status, _ = await get(server, "/ui/", headers={"X-Auth-User": "frank"})
        assert status == 303
    finally:
        await close_in_process(server)


async def test_bad_parameters_are_400_naming_them(tmp_path: Path) -> None:
    server = await start(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        for path, word in (
            ("/ui/?priority=P9", "priority"),
            ("/ui/?job=" + "x" * 300, "job"),
            ("/ui/?component=%00", "component"),
            ("/ui/history?days=9999", "days"),
            ("/ui/job", "name"),
            ("/ui/alerts/99999999999999999999999", "alert id"),
        ):
            status, page = await get(server, path)
            assert status == 400 and word in page, path
        assert (await get(server, "/ui/alerts/5"))[0] == 404
    finally:
        await close_in_process(server)


async def test_filters_history_search_and_job_hardware(db_url: str) -> None:
    server = await start(db_url)
    try:
        port = {"component": "fabric", "device": "mlx5_3", "port": "1", "priority": "P1"}
        await post_alerts(
            server,
            [
                alert(1, priority="P0", node="gpu-0007", gpu="3"),
                alert(2, priority="P2", node="gpu-0007", gpu="3"),
                alert(3, node="gpu-0009", **port),
                alert(4, priority="P3", trainingjob="other-job", rack="r42-special"),
            ],
        )
        status, page = await get(server, "/ui/?priority=P0")
        assert status == 200 and 'data-alert-id="1"' in page and 'data-alert-id="2"' not in page
        status, page = await get(server, "/ui/?component=fabric")
        assert 'data-alert-id="3"' in page and 'data-alert-id="1"' not in page
        resolved = make_alert(4, status="resolved", labels={"trainingjob": "other-job",
                                                             "rack": "r42-special"})  # fmt: skip
        await post_alerts(server, [resolved])
        status, page = await get(server, "/ui/history?q=R42-SPECIAL&days=56")
        assert status == 200 and 'data-alert-id="4"' in page and 'data-alert-id="1"' not in page
        _status, page = await get(server, "/ui/history?q=no-such-thing%25")
        assert 'data-alert-id="4"' not in page
        status, page = await get(server, "/ui/job?namespace=ml&name=llama-70b&days=56")
        assert status == 200
        hardware = page[page.index("Hardware that alerted most") : page.index("Alerts by name")]
        rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>(\d+)</td></tr>", hardware)
        assert ("node", "gpu-0007", "2") in rows
        assert ("GPU", "gpu-0007 GPU 3", "2") in rows
        assert ("IB port", "gpu-0009 mlx5_3 port 1", "1") in rows
    finally:
        await close_in_process(server)


async def test_a_hang_diagnosis_is_drawn_rank_by_rank(tmp_path: Path) -> None:
    server = await start(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        await post_alerts(server, [alert(1, priority="P0", component="training")])
        verdict = hang_verdict(tmp_path, world=16, culprit=5)
        await store_verdict(server, 1, verdict)
        status, page = await get(server, "/ui/alerts/1")
        assert status == 200
        cells = re.findall(r'class="rank s-(\w+)" title="rank (\d+):', page)
        assert len(cells) == 16
        assert [int(rank) for state, rank in cells if state == "culprit"] == [5]
        assert all(state == "arrived" for state, rank in cells if rank != "5")
        assert "Stuck collective" in page and "default_pg" in page
        assert verdict["summary"].split(" ")[0] in page
        await post_alerts(server, [alert(2, priority="P1", component="training")])
        await store_verdict(server, 2, hang_verdict(tmp_path / "slow", 16, 3, scenario="slow"))
        _status, page = await get(server, "/ui/alerts/2")
        cells = re.findall(r'class="rank s-(\w+)" title="rank (\d+):', page)
        assert [int(rank) for state, rank in cells if state == "slow"] == [3]
        assert {state for state, rank in cells if rank != "3"} == {"ok"}
        assert "persistently last" in page
    finally:
        await close_in_process(server)


async def test_the_live_feed_says_change_when_the_store_moves(tmp_path: Path) -> None:
    server = await start(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        _status, page = await get(server, "/ui/")
        marker = re.search(r'id="live"[^>]*data-marker="([\d.]+)"', page)
        assert marker is not None
        async with aiohttp.ClientSession() as session:
            url = server.make_url(f"/ui/events?since={marker.group(1)}")
            async with session.get(url) as stream:
                assert stream.headers["Content-Type"] == "text/event-stream"
                assert await stream.content.readline() == b"retry: 2000\n"
                await post_alerts(server, [alert(1)])
                seen = b""
                async with asyncio.timeout(10):
                    while b"event: change" not in seen:
                        seen += await stream.content.readline()
    finally:
        await close_in_process(server)


async def test_ack_comments_are_kept_the_same_from_the_api_and_the_console(db_url: str) -> None:
    server = await start(db_url, token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        await post_alerts(server, [alert(1, priority="P2")], token=TOKEN)
        async with aiohttp.ClientSession(headers=headers) as api:
            url = server.make_url("/api/v1/alerts/1/ack")
            async with api.post(url, json={"by": "gina", "comment": "bad\x00"}) as r:
                assert r.status == 400 and "comment" in (await r.json())["error"]
            async with api.post(url, json={"by": "gina", "comment": "on it"}) as r:
                assert r.status == 200
        session = await signed_in(server, "hank")
        try:
            async with session.get(server.make_url("/ui/alerts/1")) as r:
                page = await r.text()
            form = {"csrf": csrf_of(page), "comment": "ib cable swapped"}
            url = server.make_url("/ui/alerts/1/ack")
            async with session.post(url, data=form) as r:
                page = await r.text()
                assert "It was acknowledged already" in page  # the notice, fixed text
                assert "acknowledged by gina" in page  # the incident's state
            form["comment"] = "x" * 1001
            async with session.post(url, data=form, allow_redirects=False) as r:
                assert r.status == 400
            # no phone escalation on this gateway: no Escalate button, and its POST is a 404
            assert 'id="action-escalate"' not in page
            escalate = server.make_url("/ui/alerts/1/escalate")
            async with session.post(escalate, data=form, allow_redirects=False) as r:
                assert r.status == 404
        finally:
            await session.close()
        async with aiohttp.ClientSession(headers=headers) as api:
            async with api.get(server.make_url("/api/v1/alerts/1")) as r:
                events = (await r.json())["events"]
        assert [(e["kind"], e["detail"]) for e in events[1:]] == [
            ("acked", {"by": "gina", "comment": "on it", "incident": 1, "via": "api-token"}),
            (
                "comment",
                {
                    "by": "hank (break-glass token)",
                    "comment": "ib cable swapped",
                    "incident": 1,
                    "via": "break-glass",
                },
            ),
        ]
    finally:
        await close_in_process(server)


async def test_a_job_in_a_storm_says_so(tmp_path: Path) -> None:
    server = await start(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        status, page = await get(server, "/ui/")
        assert 'class="storm"' not in page
        burst = [alert(i, priority="P2") for i in range(40)]
        await post_alerts(server, burst)
        status, page = await get(server, "/ui/")
        assert status == 200
        group = page[page.index("ml/llama-70b") :]
        assert 'class="storm"' in group and "storm since" in group
    finally:
        await close_in_process(server)


async def test_who_is_on_call_comes_from_the_escalation_roster(tmp_path: Path) -> None:
    from datetime import timedelta

    from trainsentry.alerts import Person
    from trainsentry.gateway.policy.escalation import (
        EscalationPolicy,
        Escalator,
        Layer,
        Roster,
    )

    start_at = datetime(2026, 11, 20, tzinfo=UTC)
    rotating = Layer(
        "primary",
        (Person("alice"), Person("bob")),
        rotation_start=start_at,
        shift=timedelta(days=1),
    )
    escalator = Escalator(Roster((rotating, Layer("lead", (Person("carol"),)))), EscalationPolicy())
    db = f"sqlite:///{tmp_path / 'store.db'}"
    server = await start(db, escalator=escalator, clock=lambda: start_at + timedelta(hours=25))
    try:
        _status, page = await get(server, "/ui/")
        assert "<b>primary</b>: bob</li>" in page and "<b>lead</b>: carol</li>" in page
    finally:
        await close_in_process(server)
    server = await start(db)
    try:
        _status, page = await get(server, "/ui/")
        assert "Not known to this gateway: no phone escalation is configured" in page
    finally:
        await close_in_process(server)


async def test_who_is_on_call_comes_from_the_schedules_with_overrides(
    db_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """With an `oncall:` section the panel shows the schedules' answer (as GET
    /api/v1/oncall), primary first with until-times, and a stored override changes it."""
    from tests.support import oncall_gateway as support

    server = await support.start(db_url, receiver, Clock(support.START), tmp_path)
    try:
        session = await signed_in(server, "ivy", token=support.TOKEN)
        try:
            async with session.get(server.make_url("/ui/")) as r:
                page = await r.text()
            assert "from the on-call schedules" in page
            assert (
                '<b>gpu-infra</b>: <span class="person primary">alice</span> '
                "<small>(primary, until 2026-11-23 08:00:00 UTC)</small>, "
                '<span class="person">bob</span> <small>(backup)</small>'
            ) in page
            override = {"schedule": "gpu-infra", "who": "carol", "by": "ivy"}
            override |= {"start": "2026-11-20T04:00", "end": "2026-11-20T18:00"}
            status, _ = await support.call(server, "POST", "/api/v1/oncall/overrides", override)
            assert status == 201
            _, api = await support.call(server, "GET", "/api/v1/oncall")
            async with session.get(server.make_url("/ui/")) as r:
                page = await r.text()
            first = api["schedules"][0]["on_call"][0]
            assert first["name"] == "carol"
            assert f'<span class="person primary">carol</span> <small>({first["layer"]}' in page
            assert "until 2026-11-20 17:00:00 UTC" in page
        finally:
            await session.close()
    finally:
        await close_in_process(server)


async def test_a_change_through_another_replica_reaches_the_live_feed(db_url: str) -> None:
    """Two gateways on one store: an alert posted to B wakes a stream opened on A."""
    first = await start(db_url)
    second = await start(db_url)
    try:
        _status, page = await get(first, "/ui/")
        marker = re.search(r'id="live"[^>]*data-marker="([\d.]+)"', page)
        assert marker is not None
        async with aiohttp.ClientSession() as session:
            url = first.make_url(f"/ui/events?since={marker.group(1)}")
            async with session.get(url) as stream:
                assert await stream.content.readline() == b"retry: 2000\n"
                await post_alerts(second, [alert(1, priority="P0")])
                seen = b""
                async with asyncio.timeout(10):
                    while b"event: change" not in seen:
                        seen += await stream.content.readline()
        _status, page = await get(first, "/ui/fragments/now")
        assert 'data-alert-id="1"' in page
    finally:
        await close_in_process(second)
        await close_in_process(first)


async def test_the_timeline_shows_what_the_policy_did_flapping_and_storm(tmp_path: Path) -> None:
    from datetime import timedelta

    from tests.support.webhook_factory import BASE_TIME

    server = await start(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        for n in range(3):  # fires, resolves, fires again: the same alert, new occurrences
            start_at = BASE_TIME + timedelta(minutes=n)
            for status in ("firing", "resolved"):
                await post_alerts(
                    server,
                    [make_alert(0, status=status, fingerprint="flappy", starts_at=start_at,
                                labels={"priority": "P1"})],
                )  # fmt: skip
        async with aiohttp.ClientSession() as api:  # the three occurrences, resolved
            async with api.get(server.make_url("/api/v1/alerts?status=resolved")) as r:
                ids = sorted(int(item["id"]) for item in (await r.json())["items"])
        assert len(ids) == 3
        _status, page = await get(server, f"/ui/alerts/{ids[-1]}")
        assert "ev-flapping" in page and "status changes in the flap window" in page
        _status, page = await get(server, f"/ui/alerts/{ids[0]}")
        assert "ev-flapping" not in page  # an earlier occurrence: not what the state says
        # 40 causes (one group each): the incidents opened in the storm are folded into it
        storm = [alert(100 + i, priority="P2", alertname=f"Disk{i:02d}") for i in range(40)]
        await post_alerts(server, storm)
        _status, page = await get(server, "/ui/?priority=P2")
        newest = max(int(i) for i in re.findall(r'data-alert-id="(\d+)"', page))
        _status, page = await get(server, f"/ui/alerts/{newest}")
        assert "ev-storm" in page and "storm summary" in page
    finally:
        await close_in_process(server)


async def test_maintenance_windows_are_shown_and_ended_through_the_service(db_url: str) -> None:
    from datetime import timedelta

    server = await start(db_url, token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    now = datetime.now(UTC)
    window = {
        "matchers": {"node": "gpu-0001"},
        "starts_at": (now - timedelta(minutes=5)).isoformat(),
        "ends_at": (now + timedelta(hours=2)).isoformat(),
        "reason": "<b>NVLink</b> swap",
        "created_by": "ops-jane",
    }
    try:
        async with aiohttp.ClientSession(headers=headers) as api:
            async with api.post(server.make_url("/api/v1/maintenance"), json=window) as r:
                assert r.status == 201, await r.text()
                window_id = (await r.json())["id"]
        await post_alerts(server, [alert(1, priority="P1")], token=TOKEN)  # node gpu-0001
        session = await signed_in(server, "kim")
        try:
            async with session.get(server.make_url("/ui/")) as r:
                page = await r.text()
            assert "&lt;b&gt;NVLink&lt;/b&gt; swap" in page and "node=gpu-0001" in page
            assert f'action="/ui/maintenance/{window_id}/end"' in page
            assert "muted: &lt;b&gt;NVLink&lt;/b&gt; swap" in page  # the card says so
            async with session.get(server.make_url("/ui/alerts/1")) as r:
                incident = await r.text()
            assert f"Muted by maintenance window {window_id}" in incident
            url = server.make_url(f"/ui/maintenance/{window_id}/end")
            async with session.post(url, data={"csrf": "forged"}, allow_redirects=False) as r:
                assert r.status == 403
            async with session.post(url, data={"csrf": csrf_of(page)}) as r:
                page = await r.text()
                assert r.status == 200 and "The maintenance window is ended." in page
                assert f'action="/ui/maintenance/{window_id}/end"' not in page
        finally:
            await session.close()
        async with aiohttp.ClientSession(headers=headers) as api:
            async with api.get(server.make_url("/api/v1/maintenance?all=1")) as r:
                [ended] = (await r.json())["items"]
        assert ended["ended_by"] == "kim (break-glass token)" and ended["ended_at"] is not None
    finally:
        await close_in_process(server)


async def test_no_window_open_says_so(tmp_path: Path) -> None:
    server = await start(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        _status, page = await get(server, "/ui/")
        assert "No window open." in page
    finally:
        await close_in_process(server)


class RefusingChat:
    """A chat channel whose provider refuses every card (it ends `dead`, with the reason)."""

    name = "feishu_bot"

    async def send(self, notification: OutboundNotification) -> Receipt:
        raise PermanentError("Feishu refused: code 19021 sign match fail", code=19021)

    async def aclose(self) -> None:
        return None


def deliveries(page: str) -> list[tuple[str, str, str, str]]:
    """(channel, kind, to, outcome) of each row of the incident's notifications table."""
    table = page[page.index("<h2>Notifications and calls</h2>") :]
    table = table[: table.index("</table>")]
    rows = re.findall(
        r'<tr class="o-(\w+)"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td><td>(\w+)', table
    )
    for status, *_rest, outcome in rows:
        assert status == outcome  # the row's class is its outcome
    return sorted((channel, kind, to, outcome) for _s, channel, kind, to, outcome in rows)


async def test_an_incident_lists_every_notification_and_call_with_its_outcome(
    tmp_path: Path, receiver: Receiver
) -> None:
    """The incident page names each notification and call: channel, kind, who was called,
    the outcome (sent, dead with the provider's reason), and the runbook, Grafana and
    Prometheus links of the alert (only http(s) ones: annotations are attacker-controlled)."""
    from trainsentry.alerts import Person
    from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Layer, Roster
    from trainsentry.notifiers.console import ConsoleNotifier
    from trainsentry.notifiers.webhook import WebhookNotifier

    escalator = Escalator(
        Roster((Layer("primary", (Person("alice", phone="+8613800000001"),)),)),
        EscalationPolicy(ack_timeout=timedelta(minutes=5)),
    )
    notifiers = {
        "console": ConsoleNotifier(),
        "feishu_bot": RefusingChat(),
        "phone": WebhookNotifier(receiver.url, name="phone"),
    }
    server = await start(
        f"sqlite:///{tmp_path / 'store.db'}", notifiers=notifiers, escalator=escalator
    )
    try:
        linked = make_alert(1, labels={"priority": "P0"})
        linked["annotations"].update(
            runbook_url="https://runbooks.example/xid-79",
            grafana_url="https://grafana.example/d/gpu?var-node=gpu-0001",
        )
        hostile = make_alert(2, labels={"priority": "P2"})
        hostile["annotations"]["runbook_url"] = "javascript:alert(1)"
        hostile["annotations"]["dashboard_url"] = "https://grafana.example/d/fallback"
        hostile["generatorURL"] = "data:text/html,<script>alert(1)</script>"
        await post_alerts(server, [linked, hostile])
        status, page = await get(server, "/ui/alerts/1")
        assert status == 200
        assert deliveries(page) == [
            ("console", "alert", "", "sent"),
            ("feishu_bot", "alert", "", "dead"),
            ("phone", "call", "alice", "sent"),
        ]
        assert "code 19021 sign match fail" in page  # the dead card says why
        links = re.findall(r'<p class="links">(.*?)</p>', page)
        assert len(links) == 1
        anchors = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', links[0])
        assert anchors == [
            ("https://runbooks.example/xid-79", "Runbook"),
            ("https://grafana.example/d/gpu?var-node=gpu-0001", "Grafana"),
            ("http://prometheus.local/graph", "Prometheus"),
        ]
        _status, page = await get(server, "/ui/alerts/2")
        anchors = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', page)
        assert ("https://grafana.example/d/fallback", "Grafana") in anchors
        assert not any(text in ("Runbook", "Prometheus") for _href, text in anchors)
        assert "javascript:" not in page.split("<h2>Annotations</h2>")[0]
        # acknowledged: the ack notices join the list, each with its outcome
        gateway = server.app[GATEWAY_KEY]
        assert gateway.ack is not None
        assert await gateway.ack.acknowledge(1, "erin") is not None
        await gateway.settle()
        _status, page = await get(server, "/ui/alerts/1")
        acks = [row for row in deliveries(page) if row[1] == "ack"]
        assert acks == [("console", "ack", "", "sent"), ("feishu_bot", "ack", "", "dead")]
    finally:
        await close_in_process(server)


async def test_the_job_and_namespace_filters(db_url: str) -> None:
    """`job` and `namespace` narrow the Now page, alone and together, and its live fragment."""
    server = await start(db_url)
    try:
        await post_alerts(
            server,
            [
                alert(1, trainingjob="llama-70b", namespace="ml"),
                alert(2, trainingjob="bert-ft", namespace="ml"),
                alert(3, trainingjob="llama-70b", namespace="research"),
                alert(4, trainingjob="bert-ft", namespace="research"),
            ],
        )

        async def shown(query: str) -> list[str]:
            status, page = await get(server, f"/ui/?{query}")
            assert status == 200, query
            _status, fragment = await get(server, f"/ui/fragments/now?{query}")
            ids = sorted(re.findall(r'data-alert-id="(\d+)"', page))
            assert sorted(re.findall(r'data-alert-id="(\d+)"', fragment)) == ids, query
            return ids

        assert await shown("") == ["1", "2", "3", "4"]
        assert await shown("job=llama-70b") == ["1", "3"]
        assert await shown("namespace=research") == ["3", "4"]
        assert await shown("job=bert-ft&namespace=ml") == ["2"]
        assert await shown("job=no-such-job") == []
    finally:
        await close_in_process(server)


async def test_the_session_cookie_is_httponly_samesite_and_expires(tmp_path: Path) -> None:
    """Sign-in sets the session cookie HttpOnly, SameSite=Lax, on /ui/ only, for the
    configured hours (the CSRF nonce SameSite=Strict); past its expiry the signed session
    is refused even if a browser kept the cookie."""
    clock = Clock()
    console = ConsoleSettings(session_hours=2)
    server = await start(
        f"sqlite:///{tmp_path / 'store.db'}", token=TOKEN, console=console, clock=clock
    )
    try:
        session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
        try:
            async with session.get(server.make_url("/ui/login")) as r:
                form = {"csrf": csrf_of(await r.text()), "name": "gina", "token": TOKEN}
            url = server.make_url("/ui/login")
            async with session.post(url, data=form, allow_redirects=False) as r:
                assert r.status == 303
                set_cookies = r.headers.getall("Set-Cookie")
            cookies = {c.split("=", 1)[0]: c for c in set_cookies}
            attributes = [a.strip().lower() for a in cookies["ts_session"].split(";")[1:]]
            assert "httponly" in attributes and "samesite=lax" in attributes
            assert "path=/ui/" in attributes and "max-age=7200" in attributes
            assert "secure" not in attributes  # plain HTTP here; Secure on HTTPS
            csrf = [a.strip().lower() for a in cookies["ts_csrf"].split(";")[1:]]
            assert "httponly" in csrf and "samesite=strict" in csrf
            async with session.get(server.make_url("/ui/"), allow_redirects=False) as r:
                assert r.status == 200
            clock.now += timedelta(hours=2, seconds=1)
            async with session.get(server.make_url("/ui/"), allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"].startswith("/ui/login")
        finally:
            await session.close()
    finally:
        await close_in_process(server)
