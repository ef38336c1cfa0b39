"""Flight Recorder dump -> collective progress per process group (pure; no torch import).

The input is the dict decoded from `torch._C._distributed_c10d._dump_fr_trace_json()`:
`pg_status` carries the last enqueued / started / completed collective sequence number per
process group, `entries` the ring buffer of recent collectives (op name, sequence id,
`time_created_ns`, `retired`, and `duration_ms` when the backend records timing).
`ProgressTracker` adds what a single dump cannot say: when a process group last made
progress, and how long the rank spent waiting in collectives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class InFlight:
    """The oldest collective of a process group that has been enqueued but not completed."""

    op: str
    seq: int
    age_seconds: float


@dataclass(frozen=True)
class PgProgress:
    """One process group's progress as one Flight Recorder dump shows it."""

    pg: str
    desc: str
    last_enqueued: int
    last_started: int
    last_completed: int
    in_flight: InFlight | None
    # (record_id, seconds) of completed collectives whose backend recorded a duration.
    durations: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class FrSnapshot:
    """Everything the probe exports from one dump."""

    version: str
    entries: int
    groups: Mapping[str, PgProgress]


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def op_name(profiling_name: str) -> str:
    """`nccl:all_reduce` / `gloo:all_reduce` -> `all_reduce`."""
    return profiling_name.rpartition(":")[2] or profiling_name or "unknown"


def _entry_pg(entry: Mapping[str, Any]) -> tuple[str, str]:
    group = entry.get("process_group")
    if isinstance(group, Sequence) and not isinstance(group, str) and len(group) >= 1:
        name = str(group[0])
        desc = str(group[1]) if len(group) > 1 else ""
        return name, desc
    return str(entry.get("pg_id", "")), ""


def _is_done(entry: Mapping[str, Any], last_completed: int) -> bool:
    if entry.get("state") == "completed":
        return True
    seq = _int(entry.get("collective_seq_id"))
    # gloo marks finished work as retired but never moves `state` past "scheduled".
    return bool(entry.get("retired")) and seq <= last_completed


def parse_dump(
    dump: Mapping[str, Any], now_ns: int, descs: Mapping[str, str] | None = None
) -> FrSnapshot:
    """Progress per process group from a decoded Flight Recorder JSON dump.

    Works on a full dump and on a status-only one (`includeCollectives=False`): without
    entries an in-flight collective has op "unknown" and age 0, which the tracker refines.
    `descs` (pg name -> description) fills in descriptions the entries cannot give.
    """
    raw_entries = dump.get("entries") or []
    entries = [e for e in raw_entries if isinstance(e, Mapping)]
    status = dump.get("pg_status") or {}
    descs = dict(descs or {})
    by_pg: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        if entry.get("is_p2p"):
            continue  # p2p ops have their own sequence; pg_status counts collectives
        name, desc = _entry_pg(entry)
        if desc and not descs.get(name):
            descs[name] = desc
        by_pg.setdefault(name, []).append(entry)

    groups: dict[str, PgProgress] = {}
    names = {str(k) for k in status} | set(by_pg)
    for name in sorted(names):
        pg_status = status.get(name) or {}
        pg_entries = by_pg.get(name, [])
        last_completed = _int(pg_status.get("last_completed_collective"))
        last_enqueued = _int(pg_status.get("last_enqueued_collective"))
        if not pg_status and pg_entries:
            # No status block: fall back to what the ring buffer shows.
            seqs = [_int(e.get("collective_seq_id")) for e in pg_entries]
            last_enqueued = max(seqs)
            done = [s for s, e in zip(seqs, pg_entries, strict=True) if e.get("retired")]
            last_completed = max(done, default=-1)
        pending = [
            e
            for e in pg_entries
            if _int(e.get("collective_seq_id")) > last_completed and not _is_done(e, last_completed)
        ]
        in_flight: InFlight | None = None
        if pending:
            oldest = min(pending, key=lambda e: _int(e.get("collective_seq_id")))
            created = _int(oldest.get("time_created_ns"), now_ns)
            in_flight = InFlight(
                op=op_name(str(oldest.get("profiling_name", ""))),
                seq=_int(oldest.get("collective_seq_id")),
                age_seconds=max(0.0, (now_ns - created) / NS_PER_S),
            )
        elif last_enqueued > last_completed:
            in_flight = InFlight(op="unknown", seq=last_completed + 1, age_seconds=0.0)
        durations = tuple(
            (_int(e.get("record_id")), float(e["duration_ms"]) / 1000.0)
            for e in pg_entries
            if isinstance(e.get("duration_ms"), int | float) and _is_done(e, last_completed)
        )
        groups[name] = PgProgress(
            pg=name,
            desc=descs.get(name, ""),
            last_enqueued=last_enqueued,
            last_started=_int(pg_status.get("last_started_collective")),
            last_completed=last_completed,
            in_flight=in_flight,
            durations=durations,
        )
    # -1: a status-only dump (no "entries" key) says nothing about the ring buffer.
    count = len(entries) if "entries" in dump else -1
    return FrSnapshot(version=str(dump.get("version", "")), entries=count, groups=groups)


@dataclass
class PgState:
    """What the tracker remembers about one process group between polls."""

    last_completed: int
    last_completion_s: float
    wait_seconds_total: float = 0.0
    last_duration_record: int = -1
    inflight_seq: int = -1
    inflight_since_s: float = 0.0
    inflight_op: str = "unknown"


@dataclass(frozen=True)
class PgReport:
    """Derived numbers for one process group after an update."""

    progress: PgProgress
    seconds_since_completion: float
    wait_seconds_total: float
    new_durations: tuple[float, ...]


@dataclass
class ProgressTracker:
    """Turns successive snapshots into 'seconds since last completion' and wait time.

    Time is passed in (monotonic seconds), so the tracker is deterministic under test.
    Wait time is sampled: a poll that finds a collective in flight counts the whole gap
    since the previous poll as waiting, an unbiased estimate of the time spent waiting.
    """

    started_s: float
    _state: dict[str, PgState] = field(default_factory=dict)
    _last_update_s: float | None = None

    def stuck(self, snapshot: FrSnapshot) -> list[str]:
        """Groups in flight on the same collective as at the previous poll, op not known yet.

        Only for these is a full (GIL-holding) Flight Recorder dump worth taking.
        """
        names = []
        for name, progress in snapshot.groups.items():
            state = self._state.get(name)
            flight = progress.in_flight
            if (
                flight is not None
                and flight.op == "unknown"
                and state is not None
                and state.inflight_seq == flight.seq
                and state.inflight_op == "unknown"
            ):
                names.append(name)
        return names

    def update(self, snapshot: FrSnapshot, now_s: float) -> dict[str, PgReport]:
        elapsed = 0.0 if self._last_update_s is None else max(0.0, now_s - self._last_update_s)
        self._last_update_s = now_s
        reports: dict[str, PgReport] = {}
        for name, progress in snapshot.groups.items():
            state = self._state.get(name)
            flight = progress.in_flight
            if state is None:
                state = PgState(last_completed=progress.last_completed, last_completion_s=now_s)
                if flight is not None:
                    # It may have been waiting since before we looked: trust the dump's age.
                    state.last_completion_s = now_s - flight.age_seconds
                self._state[name] = state
            elif progress.last_completed != state.last_completed:
                state.last_completed = progress.last_completed
                state.last_completion_s = now_s
            if flight is None:
                state.inflight_seq, state.inflight_op = -1, "unknown"
            else:
                state.wait_seconds_total += elapsed
                if flight.seq != state.inflight_seq:
                    state.inflight_seq = flight.seq
                    state.inflight_since_s = now_s - flight.age_seconds
                    state.inflight_op = flight.op
                elif flight.op != "unknown":
                    state.inflight_op = flight.op
                    state.inflight_since_s = min(state.inflight_since_s, now_s - flight.age_seconds)
                flight = InFlight(
                    op=state.inflight_op,
                    seq=flight.seq,
                    age_seconds=max(flight.age_seconds, now_s - state.inflight_since_s),
                )
                progress = replace(progress, in_flight=flight)
            fresh = tuple(
                seconds
                for record, seconds in progress.durations
                if record > state.last_duration_record
            )
            if progress.durations:
                state.last_duration_record = max(
                    state.last_duration_record, max(r for r, _ in progress.durations)
                )
            reports[name] = PgReport(
                progress=progress,
                seconds_since_completion=max(0.0, now_s - state.last_completion_s),
                wait_seconds_total=state.wait_seconds_total,
                new_durations=fresh,
            )
        return reports


def merge(status: FrSnapshot, full: FrSnapshot, names: list[str]) -> FrSnapshot:
    """`status` with the in-flight details and durations of `names` taken from `full`."""
    groups = dict(status.groups)
    for name in names:
        detailed = full.groups.get(name)
        if detailed is not None and name in groups:
            groups[name] = replace(
                groups[name],
                in_flight=detailed.in_flight or groups[name].in_flight,
                desc=groups[name].desc or detailed.desc,
                durations=detailed.durations,
            )
    return FrSnapshot(version=status.version, entries=full.entries, groups=groups)
