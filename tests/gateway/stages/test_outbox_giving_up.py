"""Provider trouble does not kill a page within minutes (issue 19, finding 2): the outbox
with its default rules, real channels against real local servers, on a virtual clock (the
outbox's own clock, advanced to each retry's due time), on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.notifiers.helpers import alert_payload
from tests.support.clock import Clock
from tests.support.feishu_server import FeishuContractServer, Hook, Window
from tests.support.receiver import Receiver
from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.config import GatewaySettings
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.notifiers.feishu.bot import BotWebhook, FeishuBotNotifier, WebhookRouter
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store.outbox import next_due_at
from trainsentry.store.schema import notifications
from trainsentry.store.writes import insert_notifications

T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


async def enqueue(engine: AsyncEngine, channel: str, priority: Priority) -> None:
    draft = NotificationDraft(
        channel=channel,
        kind="alert",
        priority=priority,
        idempotency_key=f"{channel}-page",
        payload=alert_payload(priority.value),
        group_key="alert:1",
    )
    async with engine.begin() as conn:
        await insert_notifications(conn, [draft], T0)


async def row(engine: AsyncEngine) -> tuple[str, int, datetime | None]:
    async with engine.connect() as conn:
        found = (
            await conn.execute(
                select(
                    notifications.c.status,
                    notifications.c.attempts,
                    notifications.c.failing_since,
                )
            )
        ).one()
    return found.status, found.attempts, found.failing_since


async def step(outbox: Outbox, engine: AsyncEngine, clock: Clock) -> None:
    """One send of the due row, then the clock moves to when the row is due again."""
    assert await outbox.run_once()
    async with engine.connect() as conn:
        due = await next_due_at(conn)
    if due is not None:
        clock.now = max(clock.now, due)


async def test_a_pager_answering_500_for_two_minutes_delivers_the_p0(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    """Before: 8 tries with a 1 s doubling back-off, the P0 was dead at about 100 s."""
    clock = Clock(T0)
    await enqueue(engine, "pager", Priority.P0)
    outbox = Outbox(engine, {"pager": WebhookNotifier(receiver.url)}, clock=clock)
    try:
        receiver.fail_first = 10**9  # the pager answers 500 ...
        while clock.elapsed < 120:
            await step(outbox, engine, clock)
            status, _, _ = await row(engine)
            assert status == "pending", f"{status} after {clock.elapsed:.0f} s"
        assert (await row(engine))[2] == T0  # one streak, since the first failure
        receiver.fail_first = receiver.requests  # ... for two minutes, then OK
        await step(outbox, engine, clock)
    finally:
        await outbox.aclose()
    status, attempts, failing_since = await row(engine)
    assert (status, failing_since) == ("sent", None)
    assert receiver.unique == 1 and attempts == receiver.requests
    # it was retried soon after the outage, not after a long sleep (back-off <= elapsed)
    assert clock.elapsed <= 2 * 120


async def test_a_pager_that_stays_down_gives_up_after_an_hour(
    engine: AsyncEngine, receiver: Receiver
) -> None:
    clock = Clock(T0)
    await enqueue(engine, "pager", Priority.P1)
    outbox = Outbox(engine, {"pager": WebhookNotifier(receiver.url)}, clock=clock)
    receiver.fail_first = 10**9
    try:
        while (await row(engine))[0] == "pending":
            await step(outbox, engine, clock)
    finally:
        await outbox.aclose()
    assert (await row(engine))[0] == "dead"
    assert clock.elapsed == 3600  # P1's default, to the second
    assert receiver.requests < 40  # backed off to minutes, not hammering


async def test_feishu_rate_limiting_for_hours_never_kills_a_card(engine: AsyncEngine) -> None:
    """Before: code 11232 counted as a failed try, the P1 card was dead at about 109 s."""
    clock = Clock(T0)
    async with FeishuContractServer(hooks={"h": Hook()}) as server:
        bot = FeishuBotNotifier(WebhookRouter({Priority.P1: BotWebhook("w", server.hook_url("h"))}))
        outbox = Outbox(engine, {"feishu_bot": bot}, clock=clock)
        await enqueue(engine, "feishu_bot", Priority.P1)
        server.bot_windows["h"] = Window([(0, 1.0)])  # every message: code 11232
        try:
            while clock.elapsed < 3 * 3600:
                await step(outbox, engine, clock)
                assert (await row(engine))[0] == "pending"
                clock.now += timedelta(minutes=10)  # the hours pass in a few tries
            rate_limited = len(server.rejections)
            assert rate_limited >= 17 and {code for _, code in server.rejections} == {11232}
            server.bot_windows["h"] = Window([(5, 1.0)])  # Feishu lets it through again
            await step(outbox, engine, clock)
        finally:
            await outbox.aclose()
        assert len(server.accepted["h"]) == 1
    status, attempts, failing_since = await row(engine)
    assert (status, attempts, failing_since) == ("sent", rate_limited + 1, None)


def test_the_delivery_settings_are_checked() -> None:
    settings = GatewaySettings()
    assert settings.give_up_after_seconds == {"P0": 3600, "P1": 3600, "P2": 1800, "P3": 1800}
    assert (settings.send_deadline_seconds, settings.outbox_lease_seconds) == (30, 60)
    assert settings.send_slots_per_channel == 16
    with pytest.raises(ValidationError, match="shorter than outbox_lease_seconds"):
        GatewaySettings(send_deadline_seconds=60, outbox_lease_seconds=60)
    with pytest.raises(ValidationError, match="needs P0, P1, P2 and P3"):
        GatewaySettings(give_up_after_seconds={"P0": 60})
    with pytest.raises(ValidationError, match="needs P0, P1, P2 and P3"):
        GatewaySettings(give_up_after_seconds={"P0": 60, "P1": 60, "P2": 0, "P3": 60})
