"""Sending the weekly report: once per audience and period, recorded in `report_runs`.

Idempotency (the table's SQL is store/report_runs.py): before mailing, a run *claims* the
period by writing its `report_runs` row with `detail.state = "sending"` (the primary key
makes two concurrent runs collide; the loser skips). After the SMTP server took the mail
the row becomes `"sent"`. If sending fails the claim is withdrawn (or the previous record
restored), so the next run tries again. A claim older than `STALE_CLAIM` (a run that died
mid-send) may be taken over. Crash between the SMTP answer and the update: the next run
sends again (at-least-once, never silently none).

Catch-up: `send` without an explicit period sends every full week after the newest one
already sent for the audience, up to the last full week (at most `catch_up_weeks`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from trainsentry.config.reports import CLUSTER, ReportSettings
from trainsentry.notifiers.email import SmtpConfig, send_email
from trainsentry.reports.digest import digest_card, post_digest
from trainsentry.reports.figures import WeeklyStats
from trainsentry.reports.period import Period, due_weeks, last_full_week, parse_period
from trainsentry.reports.stats import StatsOptions, collect
from trainsentry.reports.weekly import RenderedReport, RenderOptions, render, to_message
from trainsentry.store.engine import Engine
from trainsentry.store.report_loads import Scope
from trainsentry.store.report_runs import SENT, claim, last_sent_week, mark_sent, release

log = logging.getLogger(__name__)


DigestPoster = Callable[[WeeklyStats, RenderedReport, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Outcome:
    audience: str
    period: str  # Period.key
    status: str  # sent | skipped | failed | no-recipients
    recipients: tuple[str, ...] = ()
    message_id: str | None = None
    reason: str = ""
    digest: str = ""  # "", sent, failed: <why>
    totals: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "audience": self.audience,
            "period": self.period,
            "status": self.status,
            "recipients": list(self.recipients),
            "message_id": self.message_id,
            "reason": self.reason,
            "digest": self.digest,
            "totals": self.totals,
        }


def run_key(audience: str, period: Period) -> str:
    return f"weekly/{audience}/{period.key}"


def scope_of(settings: ReportSettings, audience: str) -> Scope:
    """Pure: the alerts a report covers: all of them for the cluster's, a team's jobs for
    a team's."""
    if audience == CLUSTER:
        return Scope(CLUSTER)
    team = settings.teams[audience]
    return Scope(audience, frozenset(team.namespaces), frozenset(team.jobs))


def render_options(settings: ReportSettings, period: Period) -> RenderOptions:
    start, end = period.start, period.end
    link = settings.link(
        start.isoformat(),
        end.isoformat(),
        int(start.timestamp() * 1000),
        int(end.timestamp() * 1000),
    )
    return RenderOptions(settings.subject_prefix, settings.cluster_name, link)


async def build(
    engine: Engine,
    settings: ReportSettings,
    period: Period,
    audience: str,
    opts: StatsOptions,
) -> tuple[WeeklyStats, RenderedReport]:
    async with engine.connect() as conn:
        stats = await collect(conn, period, opts, scope_of(settings, audience))
    return stats, render(stats, render_options(settings, period))


def periods_to_send(
    settings: ReportSettings, spec: str, now: datetime, last_sent: date | None, *, force: bool
) -> list[Period]:
    tz, week_start = settings.timezone, settings.week_start
    if spec == "last-week" and not force:
        # Nothing due still yields the last week, so the run reports it as already sent.
        due = due_weeks(last_sent, now, tz, week_start, settings.catch_up_weeks)
        return due or [last_full_week(now, tz, week_start)]
    return [parse_period(spec, now, tz, week_start)]


async def send_reports(
    engine: Engine,
    settings: ReportSettings,
    smtp: SmtpConfig,
    *,
    now: datetime,
    spec: str = "last-week",
    force: bool = False,
    opts: StatsOptions | None = None,
    audiences: Sequence[str] | None = None,
    digest: DigestPoster | None = None,
) -> list[Outcome]:
    """Sends every due report; one Outcome per (audience, period) considered."""
    opts = opts or StatsOptions()
    outcomes: list[Outcome] = []
    for audience in audiences if audiences is not None else settings.audiences():
        recipients = settings.recipients_of(audience)
        async with engine.connect() as conn:
            last = await last_sent_week(conn, audience, settings.timezone)
        for period in periods_to_send(settings, spec, now, last, force=force):
            outcomes.append(
                await _send_one(
                    engine, settings, smtp, period, audience, recipients, now, force, opts, digest
                )
            )
    return outcomes


async def _send_one(
    engine: Engine,
    settings: ReportSettings,
    smtp: SmtpConfig,
    period: Period,
    audience: str,
    recipients: list[str],
    now: datetime,
    force: bool,
    opts: StatsOptions,
    digest: DigestPoster | None,
) -> Outcome:
    key = run_key(audience, period)
    if not recipients:
        return Outcome(audience, period.key, "no-recipients", reason="no recipients configured")
    if period.end > now:
        return Outcome(audience, period.key, "skipped", reason="the period has not ended yet")
    claimed, previous, why = await claim(engine, key, now, recipients, force=force)
    if not claimed:
        log.info("event=report_skipped key=%s reason=%r", key, why)
        return Outcome(audience, period.key, "skipped", tuple(recipients), reason=why)
    try:
        stats, report = await build(engine, settings, period, audience, opts)
        message = to_message(report, smtp.sender, recipients)
        message_id = await send_email(smtp, message, recipients)
    except Exception as exc:
        await release(engine, key, previous)
        log.error("event=report_failed key=%s error=%s: %s", key, type(exc).__name__, exc)
        return Outcome(
            audience, period.key, "failed", tuple(recipients), reason=f"{type(exc).__name__}: {exc}"
        )
    digest_status = ""
    if digest is not None:
        try:
            await digest(stats, report, render_options(settings, period).link)
            digest_status = "sent"
        except Exception as exc:  # the mail went out; a digest failure must not resend it
            digest_status = f"failed: {type(exc).__name__}: {exc}"
            log.warning("event=report_digest_failed key=%s error=%r", key, digest_status)
    sends = int(((previous or {}).get("detail") or {}).get("sends", 0)) + 1
    totals = {"alerts": stats.total, **dict(stats.by_priority)}
    await mark_sent(
        engine,
        key,
        now,
        recipients,
        {
            "state": SENT,
            "sends": sends,
            "forced": force,
            "message_id": message_id,
            "subject": report.subject,
            "digest": digest_status,
            "totals": totals,
        },
    )
    log.info(
        "event=report_sent key=%s recipients=%d message_id=%s", key, len(recipients), message_id
    )
    return Outcome(
        audience,
        period.key,
        "sent",
        tuple(recipients),
        message_id,
        digest=digest_status,
        totals=totals,
    )


def feishu_digest_poster(url: str, secret: str | None, timeout_s: float) -> DigestPoster:
    async def post(stats: WeeklyStats, report: RenderedReport, link: str) -> None:
        await post_digest(
            url, digest_card(stats, report.headline, link), secret, timeout_s=timeout_s
        )

    return post


async def write_preview(
    engine: Engine,
    out: Path,
    *,
    now: datetime,
    spec: str = "this-week",
    settings: ReportSettings | None = None,
    audience: str = "cluster",
    opts: StatsOptions | None = None,
) -> RenderedReport:
    """Writes the report's preview HTML (images embedded) to `out`; for the demo and `render`."""
    settings = settings or ReportSettings()
    period = parse_period(spec, now, settings.timezone, settings.week_start)
    _, report = await build(engine, settings, period, audience, opts or StatsOptions())
    await asyncio.to_thread(out.write_text, report.preview_html, encoding="utf-8")
    return report
