"""ProbeMetrics: samples from tracker reports, no stale in-flight op series."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trainsentry.probe.metrics import ProbeMetrics
from trainsentry.probe.progress import InFlight, PgProgress, PgReport
from trainsentry.probe.ras import RasStatus

BASE = {"namespace": "ns", "trainingjob": "tj", "node": "n1", "rank": "3", "local_rank": "1"}


def samples(metrics: ProbeMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def report(in_flight: InFlight | None, wait: float, durations: tuple[float, ...] = ()) -> PgReport:
    progress = PgProgress("0", "default_pg", 11, -1, 10, in_flight)
    return PgReport(
        progress, seconds_since_completion=4.0, wait_seconds_total=wait, new_durations=durations
    )


def names(metrics: ProbeMetrics, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples(metrics) if n == name]


def test_inflight_op_series_follow_the_op_and_disappear() -> None:
    m = ProbeMetrics(BASE, world_size=8)
    m.apply_progress({"0": report(InFlight("all_reduce", 11, 2.5), 1.0)}, entries=20)
    ops = names(m, "trainsentry_probe_inflight_info")
    assert [o["op"] for o in ops] == ["all_reduce"] and ops[0]["rank"] == "3"
    m.apply_progress({"0": report(InFlight("all_gather", 12, 0.5), 1.5)}, entries=21)
    assert [o["op"] for o in names(m, "trainsentry_probe_inflight_info")] == ["all_gather"]
    m.apply_progress({"0": report(None, 1.5, durations=(0.02, 0.4))}, entries=22)
    assert names(m, "trainsentry_probe_inflight_info") == []
    s = samples(m)
    pg = frozenset({**BASE, "pg": "0", "pg_desc": "default_pg"}.items())
    assert s[("trainsentry_probe_inflight_seq", pg)] == -1
    assert s[("trainsentry_probe_collective_wait_seconds_total", pg)] == 1.5
    assert s[("trainsentry_probe_collective_duration_seconds_count", pg)] == 2
    assert s[("trainsentry_probe_healthy", frozenset(BASE.items()))] == 1


def test_ras_gauges_keep_last_good_values() -> None:
    m = ProbeMetrics(BASE, world_size=8)
    m.apply_ras(RasStatus(ok=True, format="json", dead_processes=2, communicators=5))
    m.apply_ras(RasStatus(ok=False, error="cannot connect to x: refused"))
    s = samples(m)
    base = frozenset(BASE.items())
    assert s[("trainsentry_probe_ras_up", base)] == 0
    assert s[("trainsentry_probe_ras_dead_processes", base)] == 2
    absent = frozenset({**BASE, "result": "absent"}.items())
    assert s[("trainsentry_probe_ras_queries_total", absent)] == 1
