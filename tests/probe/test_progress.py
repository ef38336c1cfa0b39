"""Flight Recorder dump -> progress numbers (pure), with dumps shaped like torch 2.13's."""

from __future__ import annotations

from typing import Any

from tests.support.nccl_artifacts import nccl_json, watchdog_dump
from trainsentry.probe.progress import (
    FrSnapshot,
    InFlight,
    ProgressTracker,
    group_ids,
    merge,
    op_name,
    parse_progress,
)

T0 = 1_795_312_280_000_000_000  # ns since the epoch


def entry(
    seq: int, pg: str = "0", desc: str = "default_pg", op: str = "gloo:all_reduce", **kw: Any
) -> dict[str, Any]:
    base: dict[str, Any] = {
        "collective_seq_id": seq,
        "is_p2p": False,
        "p2p_seq_id": 0,
        "pg_id": int(pg),
        "process_group": [pg, desc],
        "profiling_name": op,
        "record_id": seq,
        "retired": True,
        "state": "scheduled",
        "time_created_ns": T0 + seq * 1_000_000,
        "time_discovered_completed_ns": 0,
        "time_discovered_started_ns": 0,
    }
    base.update(kw)
    return base


def status(enq: int, done: int, started: int = -1) -> dict[str, str]:
    return {
        "last_enqueued_collective": str(enq),
        "last_completed_collective": str(done),
        "last_started_collective": str(started),
    }


def test_waiting_gloo_rank_has_oldest_unretired_collective_in_flight() -> None:
    dump = {
        "version": "2.10",
        "entries": [entry(1), entry(2), entry(3, retired=False), entry(1, pg="1", desc="tp-0")],
        "pg_status": {"0": status(3, 2), "1": status(1, 1)},
    }
    snap = parse_progress(dump, now_ns=T0 + 3_000_000 + 5 * 10**9)
    g0 = snap.groups["0"]
    assert (g0.last_enqueued, g0.last_completed, g0.desc) == (3, 2, "default_pg")
    assert g0.in_flight is not None
    assert (g0.in_flight.op, g0.in_flight.seq) == ("all_reduce", 3)
    assert abs(g0.in_flight.age_seconds - 5.0) < 1e-6
    assert snap.groups["1"].in_flight is None
    assert snap.groups["1"].desc == "tp-0"
    assert snap.entries == 4


def test_nccl_style_states_and_durations() -> None:
    dump = {
        "entries": [
            entry(7, op="nccl:reduce_scatter", state="completed", duration_ms=12.5),
            entry(8, op="nccl:all_gather", state="started", retired=False),
        ],
        "pg_status": {"0": status(8, 7, started=8)},
    }
    g = parse_progress(dump, now_ns=T0 + 10**10).groups["0"]
    assert g.last_started == 8
    assert g.in_flight is not None and g.in_flight.op == "all_gather"
    assert g.durations == ((7, 0.0125),)


def test_enqueued_beyond_buffer_still_counts_as_in_flight() -> None:
    dump = {"entries": [], "pg_status": {"0": status(10, 9)}}
    g = parse_progress(dump, T0, ids={"0": "0"}).groups["0"]
    assert g.in_flight is not None and g.in_flight.seq == 10 and g.in_flight.op == "unknown"


def test_no_status_block_falls_back_to_entries_and_skips_p2p() -> None:
    dump = {"entries": [entry(1), entry(2, retired=False), entry(0, is_p2p=True)]}
    g = parse_progress(dump, T0).groups["0"]
    assert (g.last_enqueued, g.last_completed) == (2, 1)
    assert g.in_flight is not None and g.in_flight.seq == 2


def test_garbage_is_tolerated() -> None:
    garbage = {"entries": ["x", None, {"process_group": "weird"}], "pg_status": None}
    snap = parse_progress(garbage, T0)
    assert snap.entries == 1


def test_tracker_seconds_since_completion_and_sampled_wait_time() -> None:
    tracker = ProgressTracker(started_s=0.0)
    moving = {"entries": [entry(1)], "pg_status": {"0": status(1, 1)}}
    stuck = {"entries": [entry(1), entry(2, retired=False)], "pg_status": {"0": status(2, 1)}}

    r = tracker.update(parse_progress(moving, T0 + 10**9), now_s=100.0)["0"]
    assert r.seconds_since_completion == 0.0 and r.wait_seconds_total == 0.0
    # A poll that finds a collective in flight counts the whole gap as waiting.
    r = tracker.update(parse_progress(stuck, T0 + 2_000_000 + 3 * 10**9), now_s=104.0)["0"]
    assert r.seconds_since_completion == 4.0
    assert r.wait_seconds_total == 4.0
    r = tracker.update(parse_progress(stuck, T0 + 2_000_000 + 13 * 10**9), now_s=114.0)["0"]
    assert r.seconds_since_completion == 14.0
    assert r.wait_seconds_total == 14.0
    assert r.progress.in_flight is not None and r.progress.in_flight.op == "all_reduce"
    done = {"entries": [entry(1), entry(2)], "pg_status": {"0": status(2, 2)}}
    r = tracker.update(parse_progress(done, T0 + 14 * 10**9), now_s=115.0)["0"]
    assert r.seconds_since_completion == 0.0 and r.wait_seconds_total == 14.0
    assert r.progress.in_flight is None


def test_status_only_polls_ask_for_one_full_dump_when_stuck() -> None:
    tracker = ProgressTracker(started_s=0.0)

    def status_only(enq: int, done: int) -> FrSnapshot:
        dump = {"pg_status": {"0": status(enq, done)}}
        return parse_progress(dump, T0, {"0": "tp-3"}, {"0": "0"})

    snap = status_only(5, 4)
    assert snap.entries == -1 and snap.groups["0"].desc == "tp-3"
    assert tracker.stuck(snap) == []  # first sight: may finish within ms
    r = tracker.update(snap, now_s=10.0)["0"]
    assert r.progress.in_flight == InFlight("unknown", 5, 0.0)
    snap = status_only(5, 4)
    assert tracker.stuck(snap) == ["0"]  # same collective a poll later: worth a full dump
    full = parse_progress(
        {"entries": [entry(5, retired=False, desc="tp-3")], "pg_status": {"0": status(5, 4)}},
        T0 + 5_000_000 + 7 * 10**9,
    )
    r = tracker.update(merge(snap, full, ["0"]), now_s=12.0)["0"]
    assert r.progress.in_flight is not None
    assert r.progress.in_flight.op == "all_reduce"
    assert abs(r.progress.in_flight.age_seconds - 7.0) < 1e-6
    # Later status-only polls keep the op and keep ageing, without more full dumps.
    snap = status_only(5, 4)
    assert tracker.stuck(snap) == []
    r = tracker.update(snap, now_s=14.0)["0"]
    assert r.progress.in_flight is not None and r.progress.in_flight.op == "all_reduce"
    assert abs(r.progress.in_flight.age_seconds - 9.0) < 1e-6
    # A different collective in flight starts over.
    r = tracker.update(status_only(6, 5), now_s=16.0)["0"]
    assert r.progress.in_flight == InFlight("unknown", 6, 0.0)
    assert r.seconds_since_completion == 0.0


def test_tracker_first_sight_of_a_stuck_group_uses_its_age() -> None:
    tracker = ProgressTracker(started_s=0.0)
    stuck = {"entries": [entry(5, retired=False)], "pg_status": {"0": status(5, 4)}}
    r = tracker.update(parse_progress(stuck, T0 + 5_000_000 + 60 * 10**9), now_s=500.0)["0"]
    assert abs(r.seconds_since_completion - 60.0) < 1e-6


def test_tracker_reports_each_duration_once() -> None:
    tracker = ProgressTracker(started_s=0.0)
    first = {"entries": [entry(1, state="completed", duration_ms=5.0)]}
    second = {
        "entries": [
            entry(1, state="completed", duration_ms=5.0),
            entry(2, state="completed", duration_ms=7.0),
        ]
    }
    assert tracker.update(parse_progress(first, T0), 1.0)["0"].new_durations == (0.005,)
    assert tracker.update(parse_progress(second, T0), 2.0)["0"].new_durations == (0.007,)
    assert tracker.update(parse_progress(second, T0), 3.0)["0"].new_durations == ()


def test_op_name() -> None:
    assert op_name("nccl:all_reduce") == "all_reduce"
    assert op_name("barrier") == "barrier"
    assert op_name("") == "unknown"


def test_pg_status_keys_are_local_pg_ids_named_through_the_entries() -> None:
    """torch keys pg_status by the rank-local pg_id; only entries tie an id to a name.

    Shape of rank 3 of a real 4-rank gloo job with TP pairs and DP groups (torch 2.13): its
    pg_id 1 is group "2" (tp-1) and pg_id 2 is group "4" (dp-1); on rank 0 the same ids are
    "1" (tp-0) and "3" (dp-0). Reading the keys as names put one group's counters on another.
    """
    dump = {
        "entries": [
            entry(3, pg="0"),
            {**entry(3, pg="2", desc="tp-1"), "pg_id": 1},
            {**entry(4, pg="4", desc="dp-1", retired=False), "pg_id": 2},
        ],
        "pg_status": {"0": status(3, 3), "1": status(3, 3), "2": status(4, 3)},
    }
    snap = parse_progress(dump, T0 + 10**10)
    assert set(snap.groups) == {"0", "2", "4"}
    assert snap.groups["2"].desc == "tp-1" and snap.groups["2"].last_enqueued == 3
    dp = snap.groups["4"]
    assert (dp.desc, dp.last_enqueued, dp.last_completed) == ("dp-1", 4, 3)
    assert dp.in_flight is not None and dp.in_flight.seq == 4
    assert snap.unmapped == ()
    assert group_ids(dump) == {"0": "0", "1": "2", "2": "4"}


def test_a_status_key_nobody_names_is_not_taken_for_a_group_name() -> None:
    snap = parse_progress({"pg_status": {"0": status(5, 5), "1": status(7, 6)}}, T0, ids={"0": "0"})
    assert set(snap.groups) == {"0"}
    assert snap.unmapped == ("1",)
    named = parse_progress({"pg_status": {"1": status(7, 6)}}, T0, ids={"1": "3"})
    assert named.groups["3"].in_flight == InFlight("unknown", 7, 0.0)


def test_real_nccl_json_of_a_hang_shows_the_waiting_ranks_and_the_absent_one() -> None:
    """`_dump_nccl_trace_json()` from the H100 hang: ranks 0, 1, 3 wait in all_reduce #20."""
    for rank in range(4):
        dump = nccl_json(rank)
        created = max(e["time_created_ns"] for e in dump["entries"])
        g = parse_progress(dump, now_ns=created + 25 * 10**9).groups["0"]
        assert (g.desc, g.backend) == ("default_pg", "nccl")
        if rank == 2:
            assert (g.last_enqueued, g.last_completed, g.in_flight) == (19, 19, None)
        else:
            assert (g.last_enqueued, g.last_completed) == (20, 19)
            assert g.in_flight is not None
            assert (g.in_flight.op, g.in_flight.seq, g.in_flight.state) == (
                "all_reduce",
                20,
                "scheduled",
            )
            assert 24.0 < g.in_flight.age_seconds < 26.0


def test_real_nccl_timing_tells_the_rank_whose_gpu_never_started() -> None:
    """TORCH_NCCL_ENABLE_TIMING=1, rank 3's GPU stuck in a kernel queued before #20."""
    states = {}
    for rank in range(4):
        g = parse_progress(watchdog_dump("compute_timing", rank), now_ns=2**62).groups["0"]
        assert g.in_flight is not None and g.in_flight.seq == 20
        states[rank] = (g.in_flight.state, g.last_started)
    assert states == {
        0: ("started", 20),
        1: ("started", 20),
        2: ("started", 20),
        3: ("scheduled", 19),
    }


def test_real_nccl_pipeline_hang_shows_the_p2p_op_each_rank_waits_in() -> None:
    """A send/recv pipeline (0->1->2->3) whose rank 2 stopped: 1 waits in send, 3 in recv."""
    waits = {}
    for rank in range(4):
        g = parse_progress(watchdog_dump("pp", rank), now_ns=2**62).groups["0"]
        waits[rank] = None if g.in_flight is None else g.in_flight.op
    assert waits[1] == "send 1->2"
    assert waits[3] == "recv 3<-2"
    assert waits[2] is None
