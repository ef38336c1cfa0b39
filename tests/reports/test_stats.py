"""Weekly statistics over a seeded store (SQLite and the real PostgreSQL), numbers by hand."""

from __future__ import annotations

from datetime import date, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.reports.figures import Durations, nearest_rank
from trainsentry.reports.period import parse_period
from trainsentry.reports.stats import StatsOptions, collect
from trainsentry.store.report_loads import Scope

from .seed import AFTER, DAY, END, HOUR, T0, TZ, seed_week

WEEK = timedelta(days=7)  # the shipped node_health.half_life

OPTS = StatsOptions()  # the shipped policy's K=4, T=900 s, R=3600 s


def _period():  # type: ignore[no-untyped-def]
    return parse_period("last-week", AFTER, TZ)


async def test_known_week(engine: AsyncEngine) -> None:
    await seed_week(engine)
    period = _period()
    assert period.start == T0
    async with engine.connect() as conn:
        s = await collect(conn, period, OPTS)

    # 8 occurrences started in the week (local time); R1/E0 are last week's, E2 next week's
    assert s.total == 8
    assert dict(s.by_priority) == {"P0": 2, "P1": 1, "P2": 4, "P3": 1}
    assert dict(s.by_component) == {"fabric": 4, "gpu": 3, "kubernetes": 1}
    assert [(j.job, j.total) for j in s.by_job] == [
        ("team-b/vit", 4), ("team-a/llm", 3), ("(no job)", 1),
    ]  # fmt: skip
    assert s.by_job[1].by_priority["P0"] == 2

    # new: A1 A2 A3 F1 E1; recurring: F2 (2 min after F1), R2 (40 min after R1); flapping: F3
    by_name = {}
    for occ in s.occurrences:
        by_name.setdefault(occ.alertname, []).append(s.classes[occ.id])
    assert by_name["IBLinkErrorRecovery"] == ["new", "recurring", "flapping"]
    assert by_name["KubeJobPodRestarting"] == ["recurring"]
    assert (s.count_class("new"), s.count_class("recurring"), s.count_class("flapping")) == (
        5,
        2,
        1,
    )
    assert s.flapping_fingerprints == 1

    # MTTA: A1 300, A2 900 (P0), A3 600 (P1)
    assert s.mtta["all"] == Durations(3, 600.0, 900.0)
    assert s.mtta["P0"] == Durations(2, 600.0, 900.0)
    assert s.mtta["P1"] == Durations(1, 600.0, 600.0)
    assert s.mtta["P2"] == Durations()
    # MTTR: 60 120 120 1800 3600 7200 (R2 open; E1 resolved after the week's end)
    assert s.mttr["all"] == Durations(6, 960.0, 7200.0)
    assert s.mttr["P0"] == Durations(2, 5400.0, 7200.0)
    assert s.mttr["P2"] == Durations(3, 120.0, 120.0)
    assert s.open_at_end == 2
    assert s.unacked_p0_p1 == 0

    # one storm (started on two channels = one), 41 alerts at most, peak P0, lasted 5 min
    [storm] = s.storms
    assert (storm.job, storm.alerts, storm.peak) == ("trainingjob:team-b/vit", 41, "P0")
    assert storm.ended_at is not None and storm.ended_at - storm.started_at == timedelta(minutes=5)

    # pages: A1 (2 calls), A2 (1 sent, 1 dead) -> 2 incidents, 3 calls, both acked
    assert (s.pages.incidents, s.pages.calls, s.pages.acked) == (2, 3, 2)

    # noisy rules: the flapping link first (3 fired, all short-lived), then by median lifetime
    assert [(r.alertname, r.fired) for r in s.top_rules] == [
        ("IBLinkErrorRecovery", 3), ("IBSymbolErrors", 1), ("GPUXidDoubleBitECC", 1),
        ("GPUFellOffBus", 1), ("GPUTemperatureHigh", 1), ("KubeJobPodRestarting", 1),
    ]  # fmt: skip
    top = s.top_rules[0]
    assert (top.median_lifetime_s, top.short_lived, top.tuning_candidate) == (120.0, 3, True)
    assert not s.top_rules[1].tuning_candidate

    # hardware faults only (IBSymbolErrors and KubeJobPodRestarting are none): n1 A1 (DBE,
    # weight 8) + A2 (fell off the bus, 6); n2 F1-3 (IB link flaps, 2 each); n3 E1 (thermal,
    # 1). Ranked by the score decayed to the period's end (half-life 7 days), not by count:
    # n1 ≈ 8·0.5^(6.96/7) + 6·0.5^(5.92/7) ≈ 7.35 before n2's three flaps ≈ 6·0.5^(3.55/7) ≈ 4.2
    assert s.hardware == 6
    assert [(h.key, h.count) for h in s.hot_nodes] == [("n1", 2), ("n2", 3), ("n3", 1)]
    assert s.hot_nodes[0].score == pytest.approx(
        8 * 0.5 ** ((END - (T0 + HOUR)) / WEEK) + 6 * 0.5 ** ((END - (T0 + DAY + 2 * HOUR)) / WEEK)
    )
    assert s.hot_nodes[1].alertnames == ("IBLinkErrorRecovery",)
    assert s.hot_nodes[0].score > s.hot_nodes[1].score > s.hot_nodes[2].score > 0
    assert [(h.key, h.count) for h in s.hot_gpus] == [
        ("n1 GPU 3", 1), ("n1 GPU 5", 1), ("n3 GPU 0", 1),
    ]  # fmt: skip
    assert [(h.key, h.count) for h in s.hot_ports] == [("n2 mlx5_0:1", 3)]
    assert [(x.code, x.count, x.gpus) for x in s.xids] == [("48", 1, 1), ("79", 1, 1)]

    # per local day: Mon A1+R2, Tue A2, Wed A3, Thu F1-3, Sun E1 (23:59 local, 15:59 UTC)
    days = {d: dict(c) for d, c in s.per_day}
    assert days[date(2026, 11, 9)] == {"P0": 1, "P1": 0, "P2": 0, "P3": 1}
    assert days[date(2026, 11, 12)]["P2"] == 3
    assert days[date(2026, 11, 14)] == {"P0": 0, "P1": 0, "P2": 0, "P3": 0}
    assert days[date(2026, 11, 15)]["P2"] == 1
    mttr_days = dict(s.mttr_per_day)
    assert mttr_days[date(2026, 11, 10)] == 7200.0 and mttr_days[date(2026, 11, 12)] == 120.0
    assert mttr_days[date(2026, 11, 15)] is None

    # previous week: R1 (P3, resolved 5400 s) and E0 (P1, open); 1 page never acked; 1 storm
    prev = s.previous
    assert prev is not None
    assert (prev.total, prev.by_priority["P1"], prev.by_priority["P3"]) == (2, 1, 1)
    assert (prev.mttr_median_s, prev.mtta_median_s) == (5400.0, None)
    assert (prev.pages, prev.pages_acked, prev.storms) == (1, 0, 1)
    changes = {c.name: c for c in s.changes}
    assert (changes["Alerts"].delta, changes["Alerts"].percent) == (6, 300.0)
    assert changes["Alerts"].verdict == "worse"
    assert changes["MTTR median"].delta == 960.0 - 5400.0
    assert changes["MTTR median"].verdict == "better"
    assert changes["MTTA median"].verdict == "n/a"


async def test_team_scope(engine: AsyncEngine) -> None:
    await seed_week(engine)
    scope = Scope("vision", namespaces=frozenset({"team-b"}))
    async with engine.connect() as conn:
        s = await collect(conn, _period(), OPTS, scope)
    assert s.total == 4 and s.by_priority["P1"] == 1 and s.by_priority["P2"] == 3
    assert len(s.storms) == 1 and s.pages.incidents == 0
    job_scope = Scope("llm", jobs=frozenset({"team-a/llm"}))
    async with engine.connect() as conn:
        s = await collect(conn, _period(), OPTS, job_scope)
    assert s.total == 3 and s.pages.incidents == 2 and s.storms == ()
    assert s.previous is not None and s.previous.storms == 1  # team-a's storm last week


async def test_empty_week(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        s = await collect(conn, _period(), OPTS)
    assert s.total == 0 and s.mttr["all"] == Durations() and s.storms == ()
    assert all(sum(c.values()) == 0 for _, c in s.per_day) and len(s.per_day) == 7


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([1.0], 0.9, 1.0), ([3.0, 1.0, 2.0], 0.5, 2.0), ([float(i) for i in range(1, 11)], 0.9, 9.0),
     ([float(i) for i in range(1, 12)], 0.9, 10.0), ([5.0, 1.0], 0.9, 5.0)],
)  # fmt: skip
def test_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert nearest_rank(values, q) == expected
