"""The weekly report's hangs: one per job and stall, time to detection from the stall's
start (the probe trigger's `stalled_since`) to the first notification; numbers by hand,
on SQLite and the real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.reports.figures import Durations
from trainsentry.reports.period import parse_period
from trainsentry.reports.stats import StatsOptions, collect
from trainsentry.reports.weekly import render
from trainsentry.store.schema import alerts, notifications

from .seed import AFTER, DAY, END, HOUR, MIN, T0, TZ, _alert, _notification

SEC = timedelta(seconds=1)


def _hang(
    name: str, fp: str, job: str, starts: Any, *, stalled: Any = None, verdict: str = ""
) -> dict[str, Any]:
    row = _alert(name, fp, "P0", "training", starts, job=job)
    if stalled is not None:
        row["annotations"] = {**row["annotations"], "stalled_since": stalled}
    if verdict:
        row["verdict"] = {"verdict": verdict}
    return row


async def _seed(engine: AsyncEngine) -> None:
    s1 = T0 + DAY  # job a: a stall the probe saw at +20 s, paged at +23 s
    s2 = T0 + 2 * DAY  # job a: a checkpoint, held back: nothing sent
    s3 = T0 + 3 * DAY  # job b: a hang only the rules saw, paged 40 s after the rule fired
    s4 = T0 + 4 * DAY  # job c: a hostile stalled_since, ignored; paged 30 s after startsAt
    s5 = END - 10 * MIN  # job d: paged only after the week's end: not paged as of then
    rows = [
        _hang("TrainingCollectiveStalled", "h1", "team-a/llm", s1 + 20 * SEC,
              stalled=s1.isoformat()),
        # the fallback rule fires for the same stall a minute later: the same hang
        _hang("TrainingRankStalledBehindPeers", "h1r", "team-a/llm", s1 + 80 * SEC),
        _hang("TrainingCollectiveStalled", "h2", "team-a/llm", s2 + 20 * SEC,
              stalled=s2.isoformat(), verdict="checkpoint"),
        _hang("TrainingJobHang", "h3", "team-b/vit", s3),
        _hang("TrainingCollectiveStalled", "h4", "team-c/moe", s4,
              stalled=(s4 - 30 * DAY).isoformat()),
        _hang("TrainingCollectiveStalled", "h5", "team-d/dit", s5, stalled=s5.isoformat()),
        # not a hang alert: not counted
        _alert("GPUFellOffBus", "x1", "P0", "gpu", s1, job="team-a/llm"),
    ]  # fmt: skip
    rows = [{**row, "id": i} for i, row in enumerate(rows, start=1)]
    sent = [
        _notification("n1", "feishu", "alert", "P0", s1 + 23 * SEC, "sent", 1),
        _notification("n1r", "feishu", "alert", "P0", s1 + 95 * SEC, "sent", 2),
        _notification("n2", "feishu", "alert", "P0", s2 + 26 * SEC, "cancelled", 3),
        _notification("n3", "feishu", "alert", "P0", s3 + 40 * SEC, "sent", 4),
        _notification("n4", "feishu", "alert", "P0", s4 + 30 * SEC, "sent", 5),
        _notification("n5", "feishu", "alert", "P0", END + HOUR, "sent", 6),
        _notification("n6", "feishu", "alert", "P0", s1 + 5 * SEC, "sent", 7),
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(alerts), rows)
        await conn.execute(insert(notifications), sent)


async def test_hangs_are_counted_with_their_time_to_detection(engine: AsyncEngine) -> None:
    await _seed(engine)
    period = parse_period("last-week", AFTER, TZ)
    async with engine.connect() as conn:
        s = await collect(conn, period, StatsOptions())
    # five stalls (h1+h1r one), paged: h1 23 s, h3 40 s, h4 30 s; not: h2 (checkpoint), h5
    assert (s.hangs.incidents, s.hangs.paged, s.hangs.not_paged) == (5, 3, 2)
    assert s.hangs.detection == Durations(3, 30.0, 40.0)
    assert s.hangs.max_detection_s == 40.0
    line = next(x for x in render(s).text.splitlines() if x.startswith("Hangs:"))
    assert line == (
        "Hangs: 5 (3 paged, 2 not paged); stall to first notice median 30 s, p90 40 s, max 40 s."
    )
    assert "Hangs: 5 (3 paged, 2 not paged); stall to first notice median 30 s" in render(s).html
