"""Hangs: the first collective not completed everywhere, who never arrived, and why.

Per communicator, a rank "reached" sequence number s if it recorded s (or its
`last_enqueued` says so: ring buffers forget old entries, they do not un-enqueue them).
The stuck collective is the lowest s that some member did not reach, or that some member
reached but never completed. Members that reached it waited; the others are missing.

A verdict needs idle time and agreement, so the end of a log is not mistaken for a hang:
the ranks that arrived must have waited at least `min_idle_s` before the capture ended, and
when the format records completion, the stuck entry must be incomplete on them. Waits are
measured against when each rank's record was captured, where something says so (a time
given, a sidecar, files written in place, the end of Megatrace logs); where nothing does
(dumps copied off the cluster: torch's dumps carry no capture time), the wait is unknown,
only bounded from below by the last event any rank recorded (`waited_at_least_s`), and
the idle requirement cannot be checked: the stuck collective is reported, with a note
that a snapshot of a running job would look the same.

Across communicators the waits form a graph (arrived rank -> missing rank, p2p sender or
receiver -> its peer). A missing rank that is itself waiting somewhere else is a victim;
the root causes are the ranks the waits lead to that are not waiting on anyone.

A group whose membership is not fully known (Flight Recorder without a usable pg_config,
and some member's dump missing) can only name the members it has seen; the hang says how
many members it could not name (`unidentified`, None if not even that is known), and a
stuck collective that every seen member reached is still a hang: its missing ranks are
exactly the ones nothing names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from trainsentry.diagnostics.model import ProcessVerdict, State, Stream, Trace

DEFAULT_MIN_IDLE_S = 2.0


@dataclass(frozen=True, slots=True)
class CommHang:
    comm: str
    desc: str
    op: str
    seq: int
    arrived_ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    no_dump_ranks: tuple[int, ...]
    #: How long the arrived ranks had waited when their record was captured; None when
    #: no capture time is known (or the format has no times: NCCL RAS).
    waited_s: float | None
    first_arrival_ns: int
    #: Members of the group nothing names (see `Communicator.unidentified`).
    unidentified: int | None = 0
    #: Members that enqueued the collective but never started it while others did (NCCL
    #: with TORCH_NCCL_ENABLE_TIMING=1: a GPU stuck in an earlier kernel).
    not_started_ranks: tuple[int, ...] = ()
    #: Whether the dumps record when collectives start (None: not asked, e.g. ranks missing).
    timing_recorded: bool | None = None
    #: What the entries alone show: the longest time from an arrival to the last event any
    #: rank recorded (None: no timestamps). The wait was at least this long.
    waited_at_least_s: float | None = None
    #: "global" when the ranks above are global ranks; "communicator" when they are ranks
    #: of this communicator only (NCCL RAS without probe statuses naming the processes).
    rank_space: str = "global"

    @property
    def membership_known(self) -> bool:
        return self.unidentified == 0

    @property
    def wait_bound_s(self) -> float:
        """The wait known for sure: `waited_s` if known, else `waited_at_least_s`, else 0."""
        if self.waited_s is not None:
            return self.waited_s
        return self.waited_at_least_s or 0.0


@dataclass(frozen=True, slots=True)
class P2PWait:
    rank: int
    peer: int
    comm: str
    op: str
    seq: int
    waited_s: float | None  # None: no capture time known
    waited_at_least_s: float | None = None  # to the last event any rank recorded

    @property
    def wait_bound_s(self) -> float:
        return self.waited_s if self.waited_s is not None else self.waited_at_least_s or 0.0


@dataclass
class HangAnalysis:
    hangs: list[CommHang] = field(default_factory=list)
    p2p_waits: list[P2PWait] = field(default_factory=list)
    root_cause_ranks: list[int] = field(default_factory=list)
    victim_ranks: list[int] = field(default_factory=list)
    #: Communicators that look stuck at the end of the capture but not for long enough.
    too_recent: list[CommHang] = field(default_factory=list)
    #: Ranks that enqueued a stuck collective but never started it (see CommHang).
    not_started_ranks: list[int] = field(default_factory=list)
    #: Ranks found to have skipped a collective and moved on (a cascade's first cause).
    skipped_ranks: list[int] = field(default_factory=list)
    #: Ranks the waits lead to whose own data was not read (no dump, or not fetched): what
    #: they were doing is unknown, so they are neither root causes nor victims.
    unread_ranks: list[int] = field(default_factory=list)
    #: Stuck-looking ends of communicators whose ranks ran past a blocking mismatch earlier:
    #: the mismatch explains them; they are not hangs of their own.
    after_mismatch: list[CommHang] = field(default_factory=list)
    #: NCCL RAS: the processes the verdict is about (culprits, and ranks reporting a remote
    #: error), merged across communicators; [] for other formats.
    processes: list[ProcessVerdict] = field(default_factory=list)
    #: What the analysis could not tell, in words (no timing recorded, ...).
    notes: list[str] = field(default_factory=list)

    @property
    def primary(self) -> CommHang | None:
        """The hang that involves a root cause and has waited the longest."""
        roots = set(self.root_cause_ranks)
        involved = [
            h for h in self.hangs if roots & {*h.missing_ranks, *h.not_started_ranks}
        ] or self.hangs
        if not involved:
            return None
        return max(involved, key=lambda h: (h.wait_bound_s, -h.seq))


def _first_incomplete(stream: Stream) -> int | None:
    if not stream.records_states:
        return None
    pending = np.nonzero(stream.state != State.COMPLETED)[0]
    return int(stream.seq[pending[0]]) if len(pending) else None


def _event_at(stream: Stream, seq: int) -> int | None:
    i = int(np.searchsorted(stream.seq, seq))
    if i < len(stream.seq) and int(stream.seq[i]) == seq:
        return i
    return None


def _reached(
    trace: Trace, members: tuple[int, ...], streams: Mapping[int, Stream]
) -> dict[int, int]:
    """Pure: per rank with data, the highest sequence number it reached on the communicator
    (0 for a member that has a dump but never used it); members without a dump are absent."""
    reached = {r: s.reached for r, s in streams.items()}
    for rank in members:
        if rank in trace.ranks_with_data and rank not in reached:
            if rank in trace.partial_ranks:
                continue  # its entries of this communicator may be older than those read
            reached[rank] = 0  # has a dump, never used this communicator
    return reached


def _stuck_seq(streams: Mapping[int, Stream], reached: Mapping[int, int]) -> int | None:
    """Pure: the lowest sequence number some rank did not reach (while another went past
    it), or reached but never completed; None when every rank reached the same point and
    none left an entry incomplete (as far as its format records states)."""
    top = max(reached.values())
    candidates = [reached[r] + 1 for r in reached if reached[r] < top]
    for stream in streams.values():
        pending = _first_incomplete(stream)
        if pending is not None:
            candidates.append(pending)
    return min(candidates) if candidates else None


@dataclass(frozen=True, slots=True)
class _Arrivals:
    """What the arrived ranks' entries of the stuck collective say."""

    op: str  # as the last arrived rank with an entry recorded it
    first_ns: int  # the earliest arrival
    waited_s: float | None  # the longest wait to a rank's capture; None: no capture time
    waited_at_least_s: float | None  # the longest wait to the last event any rank recorded
    started: frozenset[int]  # arrived ranks known to have started it
    completed: bool  # whether some arrived rank's entry says completed


def _arrivals(
    trace: Trace, streams: Mapping[int, Stream], arrived: tuple[int, ...], seq: int
) -> _Arrivals | None:
    """Pure: the arrived ranks' entries of `seq`; None when none is left in a ring buffer
    (they reached it per pg_status only). Each rank's wait is measured against its own
    dump's time, never our clock."""
    arrival_times: list[int] = []
    waits: list[float] = []
    bounds: list[float] = []
    started: set[int] = set()
    op = "?"
    completed = False
    for rank in arrived:
        mine = streams.get(rank)
        if mine is not None and mine.last_started >= seq:
            started.add(rank)
        i = _event_at(mine, seq) if mine is not None else None
        if mine is None or i is None:
            continue  # reached it per pg_status, but the entry left the ring buffer
        arrival_times.append(int(mine.time_ns[i]))
        captured = trace.captured_at(rank)
        if captured is not None:
            waits.append((captured - int(mine.time_ns[i])) / 1e9)
        if trace.last_event_ns:
            bounds.append((trace.last_event_ns - int(mine.time_ns[i])) / 1e9)
        op = trace.signatures[int(mine.signature[i])].describe()
        if int(mine.state[i]) >= State.STARTED:
            started.add(rank)
        if int(mine.state[i]) == State.COMPLETED:
            completed = True
    if not arrival_times:
        return None
    return _Arrivals(
        op,
        min(arrival_times),
        max(0.0, *waits) if waits else None,
        max(0.0, *bounds) if bounds else None,
        frozenset(started),
        completed,
    )


def _not_started(
    streams: Mapping[int, Stream], arrived: tuple[int, ...], started: frozenset[int]
) -> tuple[bool, tuple[int, ...]]:
    """Pure, for a collective every member reached, in a format that records states:
    (whether the dumps record when collectives start, the arrived ranks that never started
    it while others did; () when starts are not recorded or nobody started it)."""
    timing = any(
        s.last_started >= 0 or bool(np.any(s.state == State.STARTED)) for s in streams.values()
    )
    if timing and started:
        return timing, tuple(r for r in arrived if r not in started)
    return timing, ()


def _comm_hang(trace: Trace, comm_id: str, min_idle_s: float) -> tuple[CommHang | None, bool]:
    """(candidate, accepted): the communicator's stuck collective, and whether it is a verdict.

    Pure. A candidate needs agreement: where the format records states, the stuck entry is
    incomplete on every arrived rank; where it does not, some member is missing. It is
    accepted when the arrived ranks waited at least `min_idle_s`, or when no capture time
    says how long they waited (see the module doc)."""
    comm = trace.communicators[comm_id]
    streams = {s.rank: s for s in trace.streams_of(comm_id)}
    no_dump = tuple(r for r in comm.ranks if r not in trace.ranks_with_data)
    if not streams:
        return None, False
    reached = _reached(trace, comm.ranks, streams)
    seq = _stuck_seq(streams, reached)
    if seq is None:
        return None, False
    arrived = tuple(sorted(r for r in reached if reached[r] >= seq))
    missing = tuple(sorted({r for r in reached if reached[r] < seq} | set(no_dump)))
    seen = _arrivals(trace, streams, arrived, seq)
    if seen is None:
        return None, False
    states_known = any(s.records_states for s in streams.values())
    agreed = not seen.completed if states_known else bool(missing)
    if not agreed:
        return None, False
    timing: bool | None = None
    not_started: tuple[int, ...] = ()
    if states_known and not missing:
        timing, not_started = _not_started(streams, arrived, seen.started)
    hang = CommHang(
        comm_id,
        comm.desc,
        seen.op,
        seq,
        arrived,
        missing,
        no_dump,
        seen.waited_s,
        seen.first_ns,
        comm.unidentified,
        not_started,
        timing,
        seen.waited_at_least_s,
    )
    return hang, seen.waited_s is None or seen.waited_s >= min_idle_s


def _p2p_waits(trace: Trace, min_idle_s: float) -> list[P2PWait]:
    waits: list[P2PWait] = []
    for stream in trace.streams.values():
        if not stream.is_p2p or stream.peer is None:
            continue
        pending = _first_incomplete(stream)
        if pending is None:
            continue
        # A batch (batch_isend_irecv) is several ops under one number: the rank waits on
        # every peer of it, since its recorder cannot say which of them completed.
        first = int(np.searchsorted(stream.seq, pending))
        last = int(np.searchsorted(stream.seq, pending, side="right"))
        for i in range(first, last):
            peer = int(stream.peer[i])
            if peer < 0 or any(w.rank == stream.rank and w.peer == peer for w in waits):
                continue
            created = int(stream.time_ns[i])
            captured = trace.captured_at(stream.rank)
            waited = None if captured is None else (captured - created) / 1e9
            at_least = (trace.last_event_ns - created) / 1e9 if trace.last_event_ns else None
            if waited is None or waited >= min_idle_s:
                op = trace.signatures[int(stream.signature[i])].op
                waits.append(
                    P2PWait(
                        stream.rank,
                        peer,
                        stream.comm,
                        op,
                        pending,
                        waited,
                        None if at_least is None else max(0.0, at_least),
                    )
                )
    return waits


def _root_causes(edges: dict[int, set[int]]) -> list[int]:
    """Ranks the waits lead to that wait on nobody; if the waits form a cycle, its members."""
    targets = {t for ts in edges.values() for t in ts}
    roots = sorted(t for t in targets if t not in edges)
    if roots or not targets:
        return roots
    # Everyone waits on someone: pick the cycles nobody can leave (terminal components).
    reach: dict[int, set[int]] = {}
    for start in edges:
        seen: set[int] = set()
        todo = [start]
        while todo:
            node = todo.pop()
            for nxt in edges.get(node, ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    terminal = [n for n in edges if all(n in reach.get(m, set()) for m in reach[n])]
    return sorted(terminal)


def analyze_hangs(
    trace: Trace,
    min_idle_s: float = DEFAULT_MIN_IDLE_S,
    mismatch_at: Mapping[str, int] | None = None,
) -> HangAnalysis:
    """Pure. `mismatch_at`: per communicator, the first sequence number with a blocking
    mismatch; a stuck collective after it is the mismatch's consequence (the ranks pair
    different operations from there on: NCCL does not check counts, and a job can run on
    past a size mismatch), listed in `after_mismatch`, not a hang of its own."""
    analysis = HangAnalysis()
    for comm_id, comm in trace.communicators.items():
        if len(comm.ranks) < 2 and comm.membership_known:
            continue
        streams = trace.streams_of(comm_id)
        if not streams or any(s.is_p2p for s in streams):
            continue
        candidate, accepted = _comm_hang(trace, comm_id, min_idle_s)
        if candidate is None:
            continue
        if mismatch_at and candidate.seq > mismatch_at.get(comm_id, candidate.seq):
            analysis.after_mismatch.append(candidate)
        else:
            (analysis.hangs if accepted else analysis.too_recent).append(candidate)
    analysis.p2p_waits = _p2p_waits(trace, min_idle_s)
    edges: dict[int, set[int]] = {}
    for hang in analysis.hangs:
        blockers = {*hang.missing_ranks, *hang.not_started_ranks}
        for waiter in hang.arrived_ranks:
            if waiter not in hang.not_started_ranks:
                edges.setdefault(waiter, set()).update(blockers)
    for wait in analysis.p2p_waits:
        edges.setdefault(wait.rank, set()).add(wait.peer)
    analysis.not_started_ranks = sorted({r for h in analysis.hangs for r in h.not_started_ranks})
    analysis.notes = _timing_notes(analysis.hangs)
    if not edges:
        return analysis
    analysis.skipped_ranks = _skippers(trace, analysis.hangs)
    for rank in analysis.skipped_ranks:
        edges.pop(rank, None)  # its own wait is the consequence of what it skipped
    roots = _root_causes(edges)
    # Only a rank whose data was read can be shown to wait on nobody.
    analysis.root_cause_ranks = [r for r in roots if r in trace.ranks_with_data]
    analysis.hangs.extend(_p2p_hangs(trace, analysis, roots))
    missing = {r for h in analysis.hangs for r in (*h.missing_ranks, *h.not_started_ranks)}
    blamed = missing | {w.peer for w in analysis.p2p_waits}
    analysis.unread_ranks = sorted(r for r in blamed if r not in trace.ranks_with_data)
    analysis.victim_ranks = sorted(
        blamed - set(analysis.root_cause_ranks) - set(analysis.unread_ranks)
    )
    return analysis


def _previous_time(trace: Trace, comm: str, rank: int, seq: int) -> int | None:
    stream = trace.streams.get((comm, rank))
    i = _event_at(stream, seq - 1) if stream is not None and seq > 1 else None
    return int(stream.time_ns[i]) if stream is not None and i is not None else None


def _skippers(trace: Trace, hangs: list[CommHang]) -> list[int]:
    """Ranks missing from one stuck collective while waiting in another that, by their own
    history, comes later in their program: they skipped the first and moved on.

    Pure. Rank m is missing from C#s and waits in D#j. If m issued C#(s-1) before D#(j-1)
    (its previous iteration ran C, then D), it should have issued C#s before D#j, so its wait
    in D is its own doing and it is a cause; if D#(j-1) came first, m is blocked in D before
    ever reaching C#s: a victim. Without both previous entries nothing is concluded.
    """
    waiting_in: dict[int, list[CommHang]] = {}
    for hang in hangs:
        for rank in hang.arrived_ranks:
            waiting_in.setdefault(rank, []).append(hang)
    skipped = set()
    for hang in hangs:
        for rank in hang.missing_ranks:
            for other in waiting_in.get(rank, ()):
                before_c = _previous_time(trace, hang.comm, rank, hang.seq)
                before_d = _previous_time(trace, other.comm, rank, other.seq)
                if before_c is not None and before_d is not None and before_c < before_d:
                    skipped.add(rank)
    return sorted(skipped)


def _p2p_hangs(trace: Trace, analysis: HangAnalysis, leads_to: list[int]) -> list[CommHang]:
    """A p2p communicator whose waits lead to `leads_to` (the ranks waiting on nobody, read
    or not) is a hang naming those ranks.

    Pure. Waiting senders and receivers arrived; the root causes they wait on are missing.
    """
    roots = set(leads_to)
    by_comm: dict[str, list[P2PWait]] = {}
    for wait in analysis.p2p_waits:
        by_comm.setdefault(wait.comm, []).append(wait)
    hangs = []
    for comm_id, waits in sorted(by_comm.items()):
        blamed = [w for w in waits if w.peer in roots]
        if not blamed:
            continue
        comm = trace.communicators.get(comm_id)
        first = min(blamed, key=lambda w: -w.wait_bound_s)
        stream = trace.streams[(comm_id, first.rank)]
        i = _event_at(stream, first.seq)
        hangs.append(
            CommHang(
                comm=comm_id,
                desc=comm.desc if comm is not None else "",
                op=f"{first.op} {first.rank}->{first.peer}"
                if first.op == "send"
                else f"{first.op} {first.rank}<-{first.peer}",
                seq=first.seq,
                arrived_ranks=tuple(sorted({w.rank for w in blamed})),
                missing_ranks=tuple(sorted({w.peer for w in blamed})),
                no_dump_ranks=tuple(
                    sorted(r for r in {w.peer for w in blamed} if r not in trace.ranks_with_data)
                ),
                waited_s=None
                if any(w.waited_s is None for w in blamed)
                else max(w.waited_s or 0.0 for w in blamed),
                first_arrival_ns=int(stream.time_ns[i]) if i is not None else 0,
                waited_at_least_s=max(
                    (w.waited_at_least_s for w in blamed if w.waited_at_least_s is not None),
                    default=None,
                ),
            )
        )
    return hangs


def _timing_notes(hangs: list[CommHang]) -> list[str]:
    """Pure: what a hang every member entered says, with and without start times."""
    notes = []
    for hang in hangs:
        if hang.missing_ranks or hang.timing_recorded is None:
            continue
        if hang.not_started_ranks:
            notes.append(
                f"{hang.comm}: every rank enqueued seq {hang.seq}, but rank(s) "
                f"{list(hang.not_started_ranks)[:8]} never started it while the others did "
                "(a GPU stuck in earlier work, e.g. a compute kernel)"
            )
        elif not hang.timing_recorded:
            notes.append(
                f"{hang.comm}: every rank enqueued seq {hang.seq} and none completed it; the "
                "dumps do not record which rank started it, so the stuck rank cannot be told "
                "(set TORCH_NCCL_ENABLE_TIMING=1 on NCCL jobs to record it)"
            )
    return notes


def membership_note(hang: CommHang) -> str | None:
    """What a hang in a group of not fully known membership cannot say, or None."""
    if hang.membership_known or (hang.missing_ranks and hang.unidentified is None):
        return None
    group = "the world" if hang.desc == "default_pg" else "this group"
    if hang.unidentified is None:
        beyond = (
            f" (any rank from {len(hang.arrived_ranks) + len(hang.missing_ranks)} on)"
            if hang.desc == "default_pg"
            else ""
        )
        return (
            f"{hang.comm}: every rank seen in {group} reached seq {hang.seq}, so the rank(s) "
            f"that never arrived left no dump; the membership is unknown (no usable pg_config, "
            f"no all_gather/reduce_scatter sizes{', no topology' if beyond else ''}), so they "
            f"cannot be named{beyond}"
        )
    return (
        f"{hang.comm}: {hang.unidentified} member(s) of {group} "
        f"({len(hang.arrived_ranks) + len(hang.missing_ranks) + hang.unidentified} ranks, "
        f"from its all_gather/reduce_scatter sizes) left no dump and cannot be named: the "
        f"membership is unknown (no usable pg_config); the rank(s) that never arrived may be "
        f"among them"
    )
