"""Sending the weekly report: once per audience and period, recorded in `report_runs`.

Idempotency: before mailing, a run *claims* the period by writing its `report_runs` row with
`detail.state = "sending"` (the primary key makes two concurrent runs collide; the loser
skips). After the SMTP server took the mail the row becomes `"sent"`. If sending fails the
claim is withdrawn (or the previous record restored), so the next run tries again. A claim
older than `STALE_CLAIM` (a run that died mid-send) may be taken over. Crash between the
SMTP answer and the update: the next run sends again (at-least-once, never silently none).

Catch-up: `send` without an explicit period sends every full week after the newest one
already sent for the audience, up to the last full week (at most `catch_up_weeks`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trainsentry.notifiers.email import SmtpConfig, send_email
from trainsentry.reports.digest import digest_card, post_digest
from trainsentry.reports.period import Period, due_weeks, last_full_week, parse_period
from trainsentry.reports.settings import ReportSettings
from trainsentry.reports.stats import StatsOptions, WeeklyStats, collect
from trainsentry.reports.weekly import RenderedReport, RenderOptions, render, to_message
from trainsentry.store.schema import report_runs

log = logging.getLogger(__name__)

STALE_CLAIM = timedelta(minutes=30)
SENDING, SENT = "sending", "sent"

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


async def last_sent_week(conn: AsyncConnection, audience: str, tz: str) -> date | None:
    """First day of the newest week already sent to `audience` in zone `tz`."""
    prefix = f"weekly/{audience}/week:"
    rows = await conn.execute(
        select(report_runs.c.period_key, report_runs.c.detail).where(
            report_runs.c.period_key.startswith(prefix, autoescape=True)
        )
    )
    newest: date | None = None
    for row in rows:
        day, _, zone_name = row.period_key.removeprefix(prefix).partition(":")
        if zone_name != tz or (row.detail or {}).get("state") != SENT:
            continue
        try:
            first = date.fromisoformat(day)
        except ValueError:
            continue
        newest = first if newest is None or first > newest else newest
    return newest


async def claim(
    engine: AsyncEngine, key: str, now: datetime, recipients: Sequence[str], *, force: bool
) -> tuple[bool, dict[str, Any] | None, str]:
    """(claimed, previous row to restore on failure, why not)."""
    try:
        return await _claim(engine, key, now, recipients, force=force)
    except OperationalError as exc:
        # SQLite: a concurrent run wrote first and our snapshot is stale (SQLITE_BUSY).
        if engine.dialect.name == "sqlite" and "locked" in str(exc):
            return False, None, "another run is sending it"
        raise


async def _claim(
    engine: AsyncEngine, key: str, now: datetime, recipients: Sequence[str], *, force: bool
) -> tuple[bool, dict[str, Any] | None, str]:
    async with engine.begin() as conn:
        row = (
            await conn.execute(select(report_runs).where(report_runs.c.period_key == key))
        ).first()
        previous = None if row is None else dict(row._mapping)
        if previous is not None and not force:
            state = (previous["detail"] or {}).get("state", SENT)
            if state == SENT:
                return False, None, f"already sent at {previous['sent_at'].isoformat()}"
            if now - previous["sent_at"] < STALE_CLAIM:
                return False, None, "another run is sending it"
        if previous is not None:
            await conn.execute(delete(report_runs).where(report_runs.c.period_key == key))
        sends = int(((previous or {}).get("detail") or {}).get("sends", 0))
        try:
            await conn.execute(
                insert(report_runs).values(
                    period_key=key,
                    sent_at=now,
                    recipients=list(recipients),
                    detail={"state": SENDING, "sends": sends, "forced": force},
                )
            )
        except IntegrityError:
            return False, None, "another run is sending it"
    return True, previous, ""


async def release(engine: AsyncEngine, key: str, previous: dict[str, Any] | None) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(report_runs).where(report_runs.c.period_key == key))
        if previous is not None:
            await conn.execute(insert(report_runs).values(**previous))


async def mark_sent(
    engine: AsyncEngine, key: str, at: datetime, recipients: Sequence[str], detail: dict[str, Any]
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            update(report_runs)
            .where(report_runs.c.period_key == key)
            .values(sent_at=at, recipients=list(recipients), detail=detail)
        )


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
    engine: AsyncEngine,
    settings: ReportSettings,
    period: Period,
    audience: str,
    opts: StatsOptions,
) -> tuple[WeeklyStats, RenderedReport]:
    async with engine.connect() as conn:
        stats = await collect(conn, period, opts, settings.scope(audience))
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
    engine: AsyncEngine,
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
    engine: AsyncEngine,
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
    engine: AsyncEngine,
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
