"""One Feishu app, one set of message limits: the `feishu_app` and `feishu_job` channels (and
the phone provider's messages) send through clients of the same app, and Feishu counts its
50/s and 1000/min per app, so the gateway keeps them under those limits together
(gateway/channels.py gives every client of the app one message gate)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.notifiers.helpers import alert_payload
from tests.support.feishu_server import FeishuContractServer
from trainsentry.alerts import NotificationDraft, Priority, utcnow
from trainsentry.config import Settings
from trainsentry.gateway.channels import add_job_channel, build
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.notifiers.feishu.job import JobDestination, Problem
from trainsentry.store import create_engine, migrate
from trainsentry.store.schema import notifications
from trainsentry.store.writes import insert_notifications

PER_CHANNEL = 70  # each channel alone is within 50/s only by waiting; together, more so


class TeamChats:
    """Every job's cards go to its team's chat."""

    def destination(self, job: str) -> JobDestination | None:
        return JobDestination(chat_id="oc_team")

    def report(self, job: str, problem: Problem | None, *, fallback: bool) -> None:
        assert problem is None


def cards(channel: str) -> list[NotificationDraft]:
    payload = alert_payload("P1")
    if channel == "feishu_job":
        payload["job_route"] = {"job": "team-a/llama", "fallback": ["feishu_app"], "owners": []}
    return [
        NotificationDraft(
            channel=channel,
            kind="alert",
            priority=Priority.P1,
            idempotency_key=f"{channel}-{i}",
            payload={**payload, "alert_id": i},
            group_key=f"{channel}-{i}",  # no order between them: all may go at once
        )
        for i in range(PER_CHANNEL)
    ]


async def send_all(outbox: Outbox, engine: AsyncEngine, count: int) -> None:
    """Drains the outbox until `count` rows are sent (a row put back as rate limited is due
    again a little later, when `drain` has already returned)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while loop.time() < deadline:
        await outbox.drain(within=60)
        async with engine.connect() as conn:
            sent = await conn.scalar(select(func.count()).where(notifications.c.status == "sent"))
        if sent == count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{sent} of {count} sent within 60 s")


def most_in_a_second(times: list[float]) -> int:
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t < start + 1.0) for i, start in enumerate(times))


async def test_the_app_and_job_channels_share_the_apps_message_limits(tmp_path: Path) -> None:
    async with FeishuContractServer(apps={"cli_app": "app-secret"}) as feishu:
        settings = Settings.model_validate(
            {
                "gateway": {"db": f"sqlite:///{tmp_path / 'gw.db'}"},
                "channels": {
                    "feishu_app": {
                        "base_url": feishu.base_url,
                        "app_id": "cli_app",
                        "chats": {"oc_global": ["P0", "P1", "P2", "P3"]},
                    }
                },
            }
        )
        channels = build(settings, {"FEISHU_APP_SECRET": "app-secret"})
        add_job_channel(channels, TeamChats())
        engine = create_engine(settings.gateway.db)
        await migrate(engine)
        outbox = Outbox(engine, channels.notifiers, rate_limits=channels.rate_limits)
        try:
            async with engine.begin() as conn:
                drafts = cards("feishu_app") + cards("feishu_job")
                await insert_notifications(conn, drafts, utcnow())
            await send_all(outbox, engine, 2 * PER_CHANNEL)
        finally:
            await outbox.aclose()
            await engine.dispose()
            assert channels.built is not None
            await channels.built.aclose()
    sent = [t for t, app, api in feishu.message_arrivals if app == "cli_app" and api == "send"]
    assert feishu.rejections == []  # Feishu never had to refuse one for its limit
    chats = sorted(m["receive_id"] for m in feishu.messages.values())
    assert chats == ["oc_global"] * PER_CHANNEL + ["oc_team"] * PER_CHANNEL
    assert most_in_a_second(sent) <= 50
