"""Flight Recorder dump -> collective progress per process group (pure; no torch import).

The input is the dict decoded from one of torch's Flight Recorder JSON dumps
(`_dump_nccl_trace_json()` for NCCL groups, `_dump_fr_trace_json()` for gloo and other CPU
backends; see `recorders.py`). Its format, as torch writes it (FlightRecorderDetail.hpp):

- `pg_status` carries the last enqueued / started / completed collective sequence number per
  process group, keyed by the rank-LOCAL `pg_id` (a per-process counter over the groups this
  rank is a member of), values as strings. The same group has different pg_ids on different
  ranks (rank 0's pg_id 1 may be tp-0, rank 3's tp-1), so a key is never a group name.
- `entries` is the ring buffer of recent collectives; each names its group twice: `pg_id`
  (local) and `process_group` = [name, description] (global, the same on every rank). The
  entries are the only place in a dump that ties the two together (`group_ids`).
- `pg_config` is keyed by the global name (usable under NCCL; gloo writes a placeholder).
- `entries` is omitted when the recorder is empty or `includeCollectives=False`.

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
    """The oldest collective of a process group that has been enqueued but not completed.

    `state` is "started" once the backend saw it begin on the device (NCCL records that only
    with TORCH_NCCL_ENABLE_TIMING=1), else "scheduled": enqueued, maybe still queued behind
    compute on the GPU stream. A p2p op (send/recv) in flight has op "send 1->2" and its
    p2p sequence number.
    """

    op: str
    seq: int
    age_seconds: float
    state: str = "scheduled"


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
    #: "nccl", "gloo", ... (from the entries' `nccl:`/`gloo:` prefix or the recorder).
    backend: str = ""


@dataclass(frozen=True)
class FrSnapshot:
    """Everything the probe exports from one dump (groups keyed by global group name)."""

    version: str
    entries: int
    groups: Mapping[str, PgProgress]
    #: pg_status keys (local pg_ids) no name is known for yet; their groups are left out.
    unmapped: tuple[str, ...] = ()


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


def _backend_of(entry: Mapping[str, Any]) -> str:
    prefix, sep, _ = str(entry.get("profiling_name", "")).partition(":")
    return prefix if sep else ""


def group_ids(dump: Mapping[str, Any]) -> dict[str, str]:
    """Pure: local pg_id -> global group name, as this dump's entries state it.

    The only link between `pg_status` keys and group names that a dump carries.
    """
    ids: dict[str, str] = {}
    for entry in dump.get("entries") or []:
        if isinstance(entry, Mapping) and "pg_id" in entry:
            name, _ = _entry_pg(entry)
            if name:
                ids.setdefault(str(entry["pg_id"]), name)
    return ids


def _is_done(entry: Mapping[str, Any], last_completed: int) -> bool:
    if entry.get("state") == "completed":
        return True
    seq = _int(entry.get("collective_seq_id"))
    # gloo marks finished work as retired but never moves `state` past "scheduled".
    return bool(entry.get("retired")) and seq <= last_completed


def _config_descs(dump: Mapping[str, Any]) -> dict[str, str]:
    """Group name -> description from `pg_config` (NCCL writes it; gloo a placeholder)."""
    config = dump.get("pg_config")
    out: dict[str, str] = {}
    if isinstance(config, Mapping):
        for key, value in config.items():
            if isinstance(value, Mapping):
                name = str(value.get("name") or key)
                desc = str(value.get("desc") or "")
                if name and desc:
                    out[name] = desc
    return out


def _oldest_pending(
    entries: list[Mapping[str, Any]], last_completed: int, now_ns: int
) -> InFlight | None:
    pending = [
        e
        for e in entries
        if _int(e.get("collective_seq_id")) > last_completed and not _is_done(e, last_completed)
    ]
    if not pending:
        return None
    oldest = min(pending, key=lambda e: _int(e.get("collective_seq_id")))
    return _in_flight(oldest, _int(oldest.get("collective_seq_id")), now_ns)


def _in_flight(entry: Mapping[str, Any], seq: int, now_ns: int) -> InFlight:
    created = _int(entry.get("time_created_ns"), now_ns)
    return InFlight(
        op=op_name(str(entry.get("profiling_name", ""))),
        seq=seq,
        age_seconds=max(0.0, (now_ns - created) / NS_PER_S),
        state="started" if entry.get("state") == "started" else "scheduled",
    )


@dataclass(slots=True)
class _ByGroup:
    """A dump's entries sorted by global group name (collectives and p2p ops apart), with
    each group's backend as its entries name it and every description known for it."""

    collectives: dict[str, list[Mapping[str, Any]]]
    p2p: dict[str, list[Mapping[str, Any]]]
    backends: dict[str, str]
    descs: dict[str, str]


def parse_progress(
    dump: Mapping[str, Any],
    now_ns: int,
    descs: Mapping[str, str] | None = None,
    ids: Mapping[str, str] | None = None,
    backend: str = "",
) -> FrSnapshot:
    """Pure: progress per process group (keyed by global name) from one decoded dump.

    `ids` (local pg_id -> group name, learnt from earlier full dumps or from torch itself)
    names the `pg_status` keys; the dump's own entries add to it. A key nobody names is
    listed in `unmapped` and its group left out: taking it for a name would mix up groups
    (pg_id 1 is tp-0 on rank 0 but tp-1 on rank 3). `descs` (name -> description) fills in
    descriptions neither the entries nor `pg_config` give; `backend` is the recorder's
    default backend name for groups whose entries do not say.

    Works on a full dump and on a status-only one (`includeCollectives=False`): without
    entries an in-flight collective has op "unknown" and age 0, which the tracker refines.
    p2p entries (send/recv) have their own sequence numbers; one counts as in flight only
    when no collective of the group is.
    """
    entries = [e for e in dump.get("entries") or [] if isinstance(e, Mapping)]
    names = {**(ids or {}), **group_ids(dump)}
    by_group = _sort_entries(entries, _config_descs(dump), descs or {})
    statuses, unmapped = _named_statuses(dump, names)
    groups: dict[str, PgProgress] = {}
    for name in sorted(set(statuses) | set(by_group.collectives) | set(by_group.p2p)):
        progress = _group_progress(name, statuses.get(name) or {}, by_group, now_ns, backend)
        if progress is not None:
            groups[name] = progress
    # -1: a status-only dump (no "entries" key) says nothing about the ring buffer.
    count = len(entries) if "entries" in dump else -1
    return FrSnapshot(
        version=str(dump.get("version", "")),
        entries=count,
        groups=groups,
        unmapped=tuple(sorted(unmapped)),
    )


def _sort_entries(
    entries: list[Mapping[str, Any]], config_descs: Mapping[str, str], descs: Mapping[str, str]
) -> _ByGroup:
    """Pure: `entries` by group name, in dump order. Descriptions: `descs` over
    `config_descs` over the entries' own, an entry's filling in only an empty or missing
    one. The first entry that names a backend gives the group's backend."""
    all_descs = {**config_descs, **descs}
    by_pg: dict[str, list[Mapping[str, Any]]] = {}
    p2p: dict[str, list[Mapping[str, Any]]] = {}
    backends: dict[str, str] = {}
    for entry in entries:
        name, desc = _entry_pg(entry)
        if desc and not all_descs.get(name):
            all_descs[name] = desc
        if name not in backends and _backend_of(entry):
            backends[name] = _backend_of(entry)
        (p2p if entry.get("is_p2p") else by_pg).setdefault(name, []).append(entry)
    return _ByGroup(by_pg, p2p, backends, all_descs)


def _named_statuses(
    dump: Mapping[str, Any], names: Mapping[str, str]
) -> tuple[dict[str, Mapping[str, Any]], list[str]]:
    """Pure: the dump's `pg_status` blocks keyed by group name, and the keys (local
    pg_ids) `names` does not name. A named key whose block is not a mapping is dropped."""
    status = dump.get("pg_status") or {}
    if not isinstance(status, Mapping):
        status = {}
    statuses: dict[str, Mapping[str, Any]] = {}
    unmapped: list[str] = []
    for key, value in status.items():
        known = names.get(str(key))
        if known is None:
            unmapped.append(str(key))
        elif isinstance(value, Mapping):
            statuses[known] = value
    return statuses, unmapped


def _group_progress(
    name: str,
    pg_status: Mapping[str, Any],
    by_group: _ByGroup,
    now_ns: int,
    backend: str,
) -> PgProgress | None:
    """Pure: one group's progress; None when it has neither a status block nor collective
    entries nor anything in flight (only completed p2p entries).

    In flight: the oldest pending collective; else the oldest pending p2p op; else, when
    the status shows one enqueued past the last completed, an "unknown" one of age 0.
    """
    pg_entries = by_group.collectives.get(name, [])
    last_enqueued, last_started, last_completed = _last_seqs(pg_status, pg_entries)
    in_flight = _oldest_pending(pg_entries, last_completed, now_ns)
    if in_flight is None and name in by_group.p2p:
        in_flight = _oldest_p2p(by_group.p2p[name], now_ns)
    if in_flight is None and last_enqueued > last_completed:
        state = "started" if last_started > last_completed else "scheduled"
        in_flight = InFlight("unknown", last_completed + 1, 0.0, state)
    if not pg_status and not pg_entries and in_flight is None:
        return None
    return PgProgress(
        pg=name,
        desc=by_group.descs.get(name, ""),
        last_enqueued=last_enqueued,
        last_started=last_started,
        last_completed=last_completed,
        in_flight=in_flight,
        durations=_durations(pg_entries, last_completed),
        backend=by_group.backends.get(name, backend),
    )


def _last_seqs(
    pg_status: Mapping[str, Any], pg_entries: list[Mapping[str, Any]]
) -> tuple[int, int, int]:
    """Pure: (last enqueued, last started, last completed) from the status block (-1 where
    missing); without a status block, the highest enqueued and highest retired sequence
    numbers the ring buffer shows."""
    last_completed = _int(pg_status.get("last_completed_collective"))
    last_enqueued = _int(pg_status.get("last_enqueued_collective"))
    last_started = _int(pg_status.get("last_started_collective"))
    if not pg_status and pg_entries:
        seqs = [_int(e.get("collective_seq_id")) for e in pg_entries]
        last_enqueued = max(seqs)
        done = [s for s, e in zip(seqs, pg_entries, strict=True) if e.get("retired")]
        last_completed = max(done, default=-1)
    return last_enqueued, last_started, last_completed


def _oldest_p2p(p2p_entries: list[Mapping[str, Any]], now_ns: int) -> InFlight | None:
    """Pure: the p2p op with the lowest p2p sequence number not retired or completed."""
    waiting = [e for e in p2p_entries if not (e.get("retired") or e.get("state") == "completed")]
    if not waiting:
        return None
    oldest = min(waiting, key=lambda e: _int(e.get("p2p_seq_id")))
    return _in_flight(oldest, _int(oldest.get("p2p_seq_id")), now_ns)


def _durations(
    pg_entries: list[Mapping[str, Any]], last_completed: int
) -> tuple[tuple[int, float], ...]:
    """Pure: (record_id, seconds) of the done entries whose backend recorded a duration."""
    return tuple(
        (_int(e.get("record_id")), float(e["duration_ms"]) / 1000.0)
        for e in pg_entries
        if isinstance(e.get("duration_ms"), int | float) and _is_done(e, last_completed)
    )


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
                    state=flight.state,
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
    """Pure: `status` with the in-flight details and durations of `names` from `full`."""
    groups = dict(status.groups)
    for name in names:
        detailed = full.groups.get(name)
        if detailed is not None and name in groups:
            groups[name] = replace(
                groups[name],
                in_flight=detailed.in_flight or groups[name].in_flight,
                desc=groups[name].desc or detailed.desc,
                durations=detailed.durations,
                backend=groups[name].backend or detailed.backend,
            )
    return FrSnapshot(
        version=status.version, entries=full.entries, groups=groups, unmapped=status.unmapped
    )
