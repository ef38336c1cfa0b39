"""Sending the weekly report from a long-running process (the gateway) instead of a CronJob.

`report_loop` calls `send_reports` every `interval_s` (hourly by default). Sending is
idempotent per audience and period and claimed in the store, so every gateway replica may
run the loop: the first run after a week ends sends it, the others skip, and a gateway that
was down catches the missed weeks up when it comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from trainsentry.alerts import utcnow
from trainsentry.config.reports import ReportSettings
from trainsentry.notifiers.email import SmtpConfig
from trainsentry.reports.delivery import DigestPoster, Outcome, send_reports
from trainsentry.reports.stats import StatsOptions
from trainsentry.store.engine import Engine
from trainsentry.tasks import wait_for_event

log = logging.getLogger(__name__)


async def report_loop(
    engine: Engine,
    settings: ReportSettings,
    smtp: SmtpConfig,
    *,
    stop: asyncio.Event,
    interval_s: float = 3600.0,
    opts: StatsOptions | None = None,
    digest: DigestPoster | None = None,
    clock: Callable[[], datetime] = utcnow,
    on_result: Callable[[list[Outcome]], None] | None = None,
) -> None:
    """Runs until `stop` is set; a failing round is logged and retried next round."""
    while not stop.is_set():
        try:
            outcomes = await send_reports(
                engine, settings, smtp, now=clock(), opts=opts, digest=digest
            )
            if on_result is not None:
                on_result(outcomes)
        except Exception as exc:  # the store may be briefly away; try again next round
            log.error("event=report_round_failed error=%s: %s", type(exc).__name__, exc)
        await wait_for_event(stop, interval_s)
