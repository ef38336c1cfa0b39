"""An unchanged Alertmanager group re-sent is recognised at intake and skips the policy
(issue 34 item 5), through the real gateway (in-process, real HTTP) on SQLite and the real
PostgreSQL: no inbox row, no notification, no alert row written; anything changed in the
group is recorded and planned as before; the stale-alert sweep sees what it saw before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.resends import Resends
from trainsentry.store.resends import resend_probe
from trainsentry.store.schema import (
    alert_events,
    alerts,
    notifications,
    policy_inbox,
    webhook_receipts,
)
from trainsentry.store.writes import record_receipts

GROUP = '{}/{severity="P2"}:{alertname="GPUXidError", trainingjob="llama-70b"}'


@dataclass
class Running:
    server: TestServer
    clock: Clock

    @property
    def gateway(self) -> Gateway:
        return self.server.app[GATEWAY_KEY]

    async def post(self, body: bytes, after_s: float = 0) -> dict[str, Any]:
        """Posts one webhook `after_s` seconds after the previous one; the answer's JSON."""
        self.clock.now += timedelta(seconds=after_s)
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.server.make_url(WEBHOOK_PATH), data=body) as response,
        ):
            assert response.status == 200, await response.text()
            answer: dict[str, Any] = await response.json()
        return answer

    async def count(self, table: Any, *where: Any) -> int:
        async with self.gateway.engine.connect() as conn:
            query = select(func.count()).select_from(table).where(*where)
            return int((await conn.execute(query)).scalar_one())

    async def last_received(self) -> dict[str, datetime]:
        async with self.gateway.engine.connect() as conn:
            rows = await conn.execute(select(alerts.c.fingerprint, alerts.c.last_received_at))
            return {row.fingerprint: row.last_received_at for row in rows}

    async def statuses(self) -> dict[str, str]:
        async with self.gateway.engine.connect() as conn:
            rows = await conn.execute(select(alerts.c.fingerprint, alerts.c.status))
            return {row.fingerprint: row.status for row in rows}

    def resends_counted(self) -> float:
        return self.gateway.metrics.receipts.labels("resend")._value.get()


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[Running]:
    clock = Clock(BASE_TIME)
    settings = GatewaySettings(listen="127.0.0.1:0", db=db_url)
    server = TestServer(create_app(settings, clock=clock, tick_interval=3600), host="127.0.0.1")
    await server.start_server()
    try:
        yield Running(server, clock)
    finally:
        await close_in_process(server)


def group(alerts_: list[dict[str, Any]], **extra: Any) -> bytes:
    return encode({**make_body(alerts_, group_key=GROUP), **extra})


async def test_an_unchanged_group_resent_skips_the_policy_and_writes_no_alert(
    running: Running,
) -> None:
    body = group([make_alert(i) for i in range(50)])
    first = await running.post(body)
    assert first["new"] == 50 and first["resend"] is False
    await running.gateway.settle()
    planned = running.gateway.policy_worker.planned  # type: ignore[union-attr]
    assert planned == 50
    # an hour on (the policy's timers of the first send fire), Alertmanager's repeat_interval
    # brings the same notification again
    running.clock.now += timedelta(hours=1)
    await running.gateway.settle()
    sent = await running.count(notifications)
    assert sent > 0
    seen_before = await running.last_received()

    answer = await running.post(body)
    assert answer["resend"] is True
    assert answer["replay"] is True
    assert (answer["alerts"], answer["new"], answer["changed"], answer["unchanged"]) == (
        50,
        0,
        0,
        50,
    )
    assert await running.count(policy_inbox) == 0, "nothing queued for the policy"
    await running.gateway.settle()
    assert running.gateway.policy_worker.planned == planned  # type: ignore[union-attr]
    assert await running.count(notifications) == sent
    assert await running.last_received() == seen_before, "no alert row was written"
    assert running.resends_counted() == 1
    # the receipt still counts it (written after the answer, with the next transaction)
    async with running.gateway.engine.connect() as conn:
        times = (await conn.execute(select(webhook_receipts.c.times_received))).scalars().all()
    assert times == [2]


async def test_a_changed_group_is_recorded_and_planned(running: Running) -> None:
    """A label changed (Alertmanager fingerprints an alert by its labels: another alert),
    an alert added, an alert resolved: each resend is recorded and its change planned; a
    repeat of the new content is recognised as unchanged (while every alert fires)."""
    members = [make_alert(i) for i in range(10)]
    await running.post(group(members))
    await running.gateway.settle()
    worker = running.gateway.policy_worker
    assert worker is not None
    relabelled = [*members]
    relabelled[3] = make_alert(3, labels={"gpu": "5"}, fingerprint="00000000000000f3")
    added = [*relabelled, make_alert(10)]
    resolved = [make_alert(7, status="resolved") if i == 7 else a for i, a in enumerate(added)]
    for body, all_firing in ((relabelled, True), (added, True), (resolved, False)):
        planned, events = worker.planned, await running.count(alert_events)
        answer = await running.post(group(body), after_s=60)
        assert answer["resend"] is False
        assert answer["new"] + answer["changed"] == 1
        await running.gateway.settle()
        assert worker.planned == planned + 1, "the change reached the policy"
        assert await running.count(alert_events) == events + 1
        # a repeat is compared with the group's new content
        again = await running.post(group(body), after_s=60)
        assert again["resend"] is all_firing  # a resolved alert (it has an endsAt): recorded
        assert again["new"] + again["changed"] == 0
        await running.gateway.settle()
        assert worker.planned == planned + 1
    statuses = await running.statuses()
    assert statuses["0000000000000007"] == "resolved"
    assert statuses["00000000000000f3"] == "firing"
    assert statuses["000000000000000a"] == "firing"


async def test_a_resend_of_an_all_firing_group_after_a_change_is_recognised(
    running: Running,
) -> None:
    members = [make_alert(i) for i in range(10)]
    await running.post(group(members))
    grown = [*members, make_alert(10)]
    assert (await running.post(group(grown), after_s=60))["new"] == 1
    assert (await running.post(group(grown), after_s=60))["resend"] is True
    # a late copy of the older notification (an HA peer) is recorded as before, not skipped
    late = await running.post(group(members), after_s=1)
    assert late["resend"] is False and late["replay"] is True
    assert running.gateway.metrics.receipts.labels("replay")._value.get() == 1
    assert running.resends_counted() == 1


async def test_another_groups_change_to_an_alert_is_not_skipped_over(running: Running) -> None:
    """The same alert in two groups (two routes to the gateway): the second resolves it, then
    the first is re-sent as it was. Recorded as before (the alert fires again), not skipped:
    a resend is only answered from the store while its alerts are firing there."""
    alert = make_alert(1)
    first = group([alert])
    await running.post(first)
    other = encode(make_body([make_alert(1, status="resolved")], group_key="{}:other"))
    assert (await running.post(other, after_s=60))["changed"] == 1
    answer = await running.post(first, after_s=60)
    assert answer["resend"] is False and answer["changed"] == 1
    assert (await running.statuses())["0000000000000001"] == "firing"


async def test_a_new_body_of_an_unchanged_group_is_stored_then_recognised(
    running: Running,
) -> None:
    """Newer Alertmanagers say why they notify (`notification_reason`, notify/notify.go):
    the first repeat is a new body with the same alerts. It is kept (one row per distinct
    body) and recorded, and its own repeats are recognised."""
    members = [make_alert(i) for i in range(5)]
    await running.post(group(members, notification_reason="first notification"))
    repeat = group(members, notification_reason="repeat interval elapsed")
    answer = await running.post(repeat, after_s=3600)
    assert answer["resend"] is False and answer["replay"] is False
    assert (answer["new"], answer["changed"], answer["unchanged"]) == (0, 0, 5)
    assert (await running.post(repeat, after_s=3600))["resend"] is True
    assert await running.count(webhook_receipts) == 2


async def test_the_stale_sweep_sees_resent_alerts_as_fresh(running: Running) -> None:
    """The sweep expires a firing alert whose endsAt passed and that no webhook mentioned for
    stale_after_seconds (24.5 h). Alertmanager's firing alerts have no endsAt: skipped resends
    of them cannot make them stale. A sender that gives an endsAt (as Alertmanager's API v2
    lists alerts) is recorded in full, so the sweep still sees each resend."""
    ticker = running.gateway.ticker
    assert ticker is not None
    plain = group([make_alert(i) for i in range(3)])
    ends = BASE_TIME + timedelta(minutes=5)
    dated = encode(
        make_body([make_alert(i, ends_at=ends) for i in range(3, 6)], group_key="{}:dated")
    )
    await running.post(plain)
    await running.post(dated)
    assert (await running.post(plain, after_s=24 * 3600))["resend"] is True
    assert (await running.post(dated))["resend"] is False
    await ticker.run_once(BASE_TIME + timedelta(hours=25))
    assert set((await running.statuses()).values()) == {"firing"}
    await running.gateway.settle()
    # nothing mentioned the dated ones for 24.5 h after their last resend: they expire
    await ticker.run_once(BASE_TIME + timedelta(hours=49))
    statuses = await running.statuses()
    assert {statuses[f"{i:016x}"] for i in range(3)} == {"firing"}
    assert {statuses[f"{i:016x}"] for i in range(3, 6)} == {"resolved"}


async def test_the_bodies_kept_to_skip_their_parse_are_bounded(engine: AsyncEngine) -> None:
    """The intake keeps the probes of bodies seen lately so their resends are not parsed
    again, up to a number of occurrences: the least recently seen go first (their resends are
    then parsed and recognised all the same)."""
    flushes: list[int] = []
    resends = Resends(
        engine,
        on_answer=lambda _outcome: None,
        request_flush=lambda: flushes.append(1),
        max_known_occurrences=10,
    )
    receipts = [
        parse_webhook(encode(make_body([make_alert(10 * g + i) for i in range(5)], group_key=key)))
        for g, key in enumerate(("{}:a", "{}:b", "{}:c"))
    ]
    async with engine.begin() as conn:
        await record_receipts(conn, receipts)
    probes = [resend_probe(receipt) for receipt in receipts]
    try:
        for probe in probes:
            assert probe is not None
            resends.remember(probe)
        first, second, third = (receipt.body_sha256 for receipt in receipts)
        assert await resends.answer_known(first, BASE_TIME) is None, "the oldest went"
        answered = await resends.answer_known(third, BASE_TIME)
        assert answered is not None and answered.resend and answered.unchanged == 5
        assert await resends.answer_known(second, BASE_TIME) is not None
        assert resends.owed
    finally:
        await resends.close()
