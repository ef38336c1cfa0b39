"""The adaptive stall detector (pure): what counts as a stall for a given process group."""

from __future__ import annotations

from trainsentry.probe.progress import InFlight, PgProgress, PgReport
from trainsentry.probe.stall import StallDetector, StallPolicy


def report(seq: int | None, age: float, pg: str = "0", desc: str = "default_pg") -> PgReport:
    flight = None if seq is None else InFlight(op="all_reduce", seq=seq, age_seconds=age)
    done = (seq - 1) if seq is not None else 0
    progress = PgProgress(pg, desc, done + 1, done + 1, done, flight)
    return PgReport(progress, age, 0.0, ())


def learn(detector: StallDetector, waits: list[float], start_seq: int = 1) -> int:
    """Feed one observed wait per collective; returns the next sequence number."""
    seq = start_seq
    for wait in waits:
        assert detector.observe({"0": report(seq, wait)}) == []
        seq += 1
    detector.observe({"0": report(None, 0.0)})  # the last one ends too
    return seq


def test_without_history_only_the_startup_threshold_counts() -> None:
    detector = StallDetector(StallPolicy(floor_s=20, factor=10, startup_s=300))
    assert detector.observe({"0": report(1, 100.0)}) == []  # NCCL set-up, first data load
    (stall,) = detector.observe({"0": report(1, 301.0)})
    assert (stall.pg, stall.seq, stall.op, stall.threshold_s) == ("0", 1, "all_reduce", 300.0)


def test_a_fast_group_stalls_at_the_floor() -> None:
    detector = StallDetector(StallPolicy(floor_s=20, factor=10, startup_s=300))
    seq = learn(detector, [0.01, 0.2, 0.05, 0.3, 0.02, 0.1])
    assert detector.thresholds() == {"0": 20.0}
    assert detector.observe({"0": report(seq, 19.0)}) == []
    (stall,) = detector.observe({"0": report(seq, 21.0)})
    assert stall.seq == seq and stall.waited_s == 21.0


def test_a_group_that_normally_waits_long_gets_a_longer_threshold() -> None:
    """A rank that is slow but progressing (peers wait 3-4 s each step) is not a hang."""
    detector = StallDetector(StallPolicy(floor_s=20, factor=10, startup_s=300))
    seq = learn(detector, [3.0, 3.5, 4.0, 3.2, 3.8, 3.1, 3.9])
    assert detector.thresholds()["0"] == 40.0
    assert detector.observe({"0": report(seq, 25.0)}) == []
    assert [s.seq for s in detector.observe({"0": report(seq, 41.0)})] == [seq]


def test_each_collective_is_reported_once_and_a_later_one_again() -> None:
    detector = StallDetector(StallPolicy(floor_s=5, factor=10, startup_s=5))
    assert len(detector.observe({"0": report(7, 6.0)})) == 1
    assert detector.observe({"0": report(7, 60.0)}) == []
    assert detector.observe({"0": report(8, 1.0)}) == []
    assert [s.seq for s in detector.observe({"0": report(8, 60.0)})] == [8]


def test_nothing_in_flight_is_never_a_stall() -> None:
    """Evaluation, or every rank saving its own shard: no collective entered, no stall."""
    detector = StallDetector(StallPolicy(floor_s=1, factor=1, startup_s=1))
    for _ in range(10):
        assert detector.observe({"0": report(None, 0.0)}) == []


def test_groups_are_judged_apart() -> None:
    detector = StallDetector(StallPolicy(floor_s=20, factor=10, startup_s=300, min_history=2))
    for seq in (1, 2, 3):
        detector.observe({"tp": report(seq, 0.01, "tp"), "pp": report(seq, 5.0, "pp")})
    detector.observe({"tp": report(None, 0, "tp"), "pp": report(None, 0, "pp")})
    assert detector.thresholds() == {"tp": 20.0, "pp": 50.0}
    stalls = detector.observe({"tp": report(4, 30.0, "tp", "tp-3"), "pp": report(4, 30.0, "pp")})
    assert [(s.pg, s.pg_desc) for s in stalls] == [("tp", "tp-3")]


def test_progress_seen_with_nothing_in_flight_teaches_the_detector_too() -> None:
    """A fast group whose collectives are never caught in flight: each poll that finds it
    progressed is a sample of no wait, so the threshold reaches the floor within a few polls
    (otherwise it would stay at the start-up threshold until five waits were caught).
    Polls without progress are no samples."""
    detector = StallDetector(StallPolicy(floor_s=20, factor=10, startup_s=300))

    def poll(done: int) -> None:
        progress = PgProgress("0", "default_pg", done, done, done, None)
        assert detector.observe({"0": PgReport(progress, 0.0, 0.0, ())}) == []

    for done in range(1, 5):  # first sight + 3 progressions: 3 samples
        poll(done)
    for _ in range(10):
        poll(4)
    assert detector.thresholds() == {"0": 300.0}
    poll(5)
    poll(6)
    assert detector.thresholds() == {"0": 20.0}
