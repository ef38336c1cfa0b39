"""Pure parts: periods (timezones, DST, catch-up), classification edge cases, formatting,
the MIME assembly and the Feishu digest (posted to a real HTTP server on loopback)."""

from __future__ import annotations

import json
import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from trainsentry.config.reports import ReportSettings
from trainsentry.notifiers.base import PermanentError
from trainsentry.notifiers.feishu.sign import bot_sign
from trainsentry.reports.digest import digest_card, post_digest
from trainsentry.reports.figures import Change
from trainsentry.reports.period import PeriodError, due_weeks, parse_period, week_containing
from trainsentry.reports.stats import StatsOptions, classify_occurrences, compute
from trainsentry.reports.weekly import change_text, duration, render, to_message
from trainsentry.store.report_loads import Occurrence

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)  # Friday


# ---------------------------------------------------------------- periods


def test_last_week_depends_on_the_timezone() -> None:
    # Mon 2026-11-16 20:00 UTC is already Tuesday in Shanghai but still Monday in Los Angeles
    moment = datetime(2026, 11, 16, 20, 0, tzinfo=UTC)
    sh = parse_period("last-week", moment, "Asia/Shanghai")
    assert (sh.first_day, sh.start.utcoffset()) == (date(2026, 11, 9), timedelta(hours=8))
    # Sun 2026-11-15 20:00 UTC: Monday 04:00 in Shanghai (new week), Sunday in LA
    sunday = datetime(2026, 11, 15, 20, 0, tzinfo=UTC)
    assert parse_period("last-week", sunday, "Asia/Shanghai").first_day == date(2026, 11, 9)
    assert parse_period("last-week", sunday, "America/Los_Angeles").first_day == date(2026, 11, 2)


def test_dst_week_is_169_hours() -> None:
    week = parse_period("2026-W43", NOW, "Europe/Berlin")  # clocks go back on Sun 25 Oct
    assert week.first_day == date(2026, 10, 19)
    # (same-zone subtraction is wall-clock in Python: compare in UTC for elapsed time)
    assert week.end.astimezone(UTC) - week.start.astimezone(UTC) == timedelta(hours=169)
    assert len(week.day_list()) == 7 and week.last_day == date(2026, 10, 25)


def test_period_specs() -> None:
    assert parse_period("this-week", NOW, "UTC").first_day == date(2026, 11, 16)
    assert parse_period("2-weeks-ago", NOW, "UTC").first_day == date(2026, 11, 2)
    rng = parse_period("2026-11-01..2026-11-03", NOW, "UTC")
    assert (rng.days, rng.weekly, rng.key) == (3, False, "3d:2026-11-01:UTC")
    assert rng.previous().first_day == date(2026, 10, 29)
    friday = week_containing(NOW, "UTC", "friday")
    assert friday.first_day == date(2026, 11, 20) and friday.previous().first_day == date(
        2026, 11, 13
    )
    for bad in ("yesterday", "2026-W60", "2026-11-05..2026-11-01", "2026-13-01..2026-13-02"):
        with pytest.raises(PeriodError):
            parse_period(bad, NOW, "UTC")
    with pytest.raises(PeriodError):
        parse_period("last-week", NOW, "Not/AZone")


def test_due_weeks_catch_up() -> None:
    assert [p.first_day for p in due_weeks(None, NOW, "UTC")] == [date(2026, 11, 9)]
    assert due_weeks(date(2026, 11, 9), NOW, "UTC") == []
    assert [p.first_day for p in due_weeks(date(2026, 10, 19), NOW, "UTC")] == [
        date(2026, 10, 26), date(2026, 11, 2), date(2026, 11, 9),
    ]  # fmt: skip
    # a long outage catches up at most `catch_up` weeks (the newest ones)
    assert [p.first_day for p in due_weeks(date(2026, 1, 5), NOW, "UTC", catch_up=2)] == [
        date(2026, 11, 2), date(2026, 11, 9),
    ]  # fmt: skip


# ---------------------------------------------------------------- statistics


def _occ(i: int, fp: str, starts: datetime, lasts: timedelta | None, **kw: Any) -> Occurrence:
    base: dict[str, Any] = dict(
        id=i, fingerprint=fp, alertname=kw.pop("alertname", "X"), priority="P2",
        component="gpu", namespace="ns", job="j", labels={"node": "n"}, summary="",
        starts_at=starts, created_at=starts, acked_at=None, acked_by=None,
        resolved_at=None if lasts is None else starts + lasts,
    )  # fmt: skip
    base.update(kw)
    return Occurrence(**base)


def test_recurrence_window_edges() -> None:
    t = datetime(2026, 11, 10, tzinfo=UTC)
    end = t + timedelta(days=2)
    opts = StatsOptions(recurrence_window_s=3600, flap_transitions=4, flap_window_s=900)
    occs = [
        _occ(1, "a", t, timedelta(minutes=10)),
        _occ(2, "a", t + timedelta(minutes=70), timedelta(minutes=10)),  # exactly R after: recurs
        _occ(3, "a", t + timedelta(minutes=140, seconds=1), None),  # R + 1 s: new
        _occ(4, "b", t, timedelta(days=5)),  # resolved after the end: open
        _occ(5, "b", t + timedelta(days=1), None),  # previous still open then: new
    ]
    assert classify_occurrences(occs, [], end, opts) == {
        1: "new", 2: "recurring", 3: "new", 4: "new", 5: "new",
    }  # fmt: skip


def test_change_verdicts_and_formatting() -> None:
    assert Change("MTTR", 600.0, 1200.0, "seconds").verdict == "better"
    assert Change("Alerts", 12, 10).verdict == "worse" and Change("Alerts", 5, 5).verdict == "same"
    assert Change("MTTA", None, 10.0).verdict == "n/a"
    assert change_text(Change("MTTR", 600.0, 1200.0, "seconds")) == "−10 min (−50%)"
    assert change_text(Change("Alerts", 3, 0)) == "+3"
    assert [duration(s) for s in (None, 42, 600, 3660, 90000)] == [
        "—", "42 s", "10 min", "1 h 01 min", "1 d 1 h",
    ]  # fmt: skip


def _stats_with_text() -> Any:
    period = parse_period("last-week", NOW, "UTC")
    t = period.start + timedelta(hours=3)
    occs = [
        _occ(1, "a", t, timedelta(minutes=3), alertname="<script>alert(1)</script>", priority="P0",
             summary='quote " and, comma'),
    ]  # fmt: skip
    return compute(period, occs)


def test_html_is_escaped_and_message_parts() -> None:
    report = render(_stats_with_text())
    assert "<script>" not in report.html and "&lt;script&gt;" in report.html
    # mail-client safe: inline styles only, nothing fetched from the network
    assert "<style" not in report.html and "<link" not in report.html
    assert not re.search(r'src="(?!cid:)', report.html)
    assert "<script>alert(1)</script>" in report.text  # plain text stays plain
    assert b'"quote "" and, comma"' in report.csv  # CSV quoting
    message = to_message(report, "ts@example.com", ["a@example.com"])
    types = [part.get_content_type() for part in message.walk()]
    assert types == ["multipart/mixed", "multipart/alternative", "text/plain",
                     "multipart/related", "text/html", "image/png", "image/png", "image/png",
                     "text/csv"]  # fmt: skip


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        ReportSettings.model_validate({"timezone": "Nowhere/City"})
    with pytest.raises(ValueError):
        ReportSettings.model_validate({"teams": {"cluster": {"recipients": ["a@b.c"]}}})
    with pytest.raises(ValueError):
        ReportSettings.model_validate({"teams": {"t": {"recipients": ["a@b.c"], "jobs": ["nons"]}}})
    s = ReportSettings.model_validate({"teams": {"t": {"recipients": ["a@b.c"]}}})
    assert s.audiences() == ["t"]  # no cluster-wide recipients: only the team report


# ---------------------------------------------------------------- Feishu digest


async def test_digest_posted_signed_to_a_bot() -> None:
    received: list[dict[str, Any]] = []
    answer = {"code": 0, "msg": "success"}

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/open-apis/bot/v2/hook/x", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/open-apis/bot/v2/hook/x"
    try:
        stats = _stats_with_text()
        report = render(stats)
        card = digest_card(stats, report.headline, "https://grafana.example/d/x")
        await post_digest(url, card, "s3cret")
        [body] = received
        assert body["msg_type"] == "interactive"
        assert body["sign"] == bot_sign(int(body["timestamp"]), "s3cret")
        content = json.dumps(body["card"], ensure_ascii=False)
        assert "Alerts" in content and "https://grafana.example/d/x" in content
        assert body["card"]["header"]["template"] == "red"  # a P0 this week
        answer.update(code=19021, msg="sign match fail")
        with pytest.raises(PermanentError):
            await post_digest(url, card, "wrong")
    finally:
        await runner.cleanup()
