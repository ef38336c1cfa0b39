"""The weekly report lists maintenance windows still open at the period's end although every
alert they muted resolved long before; not a window whose alert still fires, nor one whose
alerts resolved recently, nor one ended."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.reports.period import parse_period
from trainsentry.reports.stats import StatsOptions, collect
from trainsentry.reports.weekly import render
from trainsentry.store.maintenance_windows import (
    RESOLVED,
    WindowRow,
    close_mutes,
    end_window,
    insert_mutes,
    insert_window,
)
from trainsentry.store.schema import alerts

from .seed import AFTER, TZ, seed_week


def window(window_id: str, created_at, ends_at) -> WindowRow:  # type: ignore[no-untyped-def]
    return WindowRow(
        id=window_id,
        created_at=created_at,
        created_by="alice",
        reason=f"reason of {window_id}",
        request={"matchers": {"node": "x"}},
        starts_at=created_at,
        ends_at=ends_at,
        ended_at=None,
        ended_by=None,
        announced_end=None,
    )


async def test_forgotten_windows_are_listed(engine: AsyncEngine) -> None:
    await seed_week(engine)
    period = parse_period("last-week", AFTER, TZ)
    end = period.end
    async with engine.begin() as conn:
        rows = (
            await conn.execute(select(alerts.c.id, alerts.c.status, alerts.c.resolved_at))
        ).all()
        resolved = sorted(
            (r for r in rows if r.resolved_at is not None), key=lambda r: r.resolved_at
        )
        old, recent = resolved[0], resolved[-1]
        assert end - old.resolved_at > timedelta(days=1) > end - recent.resolved_at
        firing = next(r for r in rows if r.status == "firing")
        start = period.start
        for window_id, alert_id in (
            ("mw-forgot", old.id),
            ("mw-recent", recent.id),
            ("mw-firing", firing.id),
            ("mw-ended", resolved[1].id),
        ):
            await insert_window(conn, window(window_id, start, end + timedelta(days=3)))
            await insert_mutes(conn, [(alert_id, window_id, end, [])], start)
        await close_mutes(conn, [old.id, recent.id, resolved[1].id], RESOLVED, end)
        await end_window(conn, "mw-ended", by="bob", now=end - timedelta(hours=1))
    async with engine.connect() as conn:
        stats = await collect(conn, period, StatsOptions(maintenance_quiet_s=86400))
    assert [(w.id, w.muted, w.last_resolved_at) for w in stats.quiet_windows] == [
        ("mw-forgot", 1, old.resolved_at)
    ]
    report = render(stats)
    assert "MAINTENANCE WINDOWS STILL OPEN" in report.text and "mw-forgot" in report.text
    assert "mw-forgot" in report.html and "reason of mw-forgot" in report.html
    assert "mw-recent" not in report.text
