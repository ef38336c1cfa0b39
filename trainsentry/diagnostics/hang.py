"""Hangs: the first collective not completed everywhere, who never arrived, and why.

Per communicator, a rank "reached" sequence number s if it recorded s (or its
`last_enqueued` says so: ring buffers forget old entries, they do not un-enqueue them).
The stuck collective is the lowest s that some member did not reach, or that some member
reached but never completed. Members that reached it waited; the others are missing.

A verdict needs idle time and agreement, so the end of a log is not mistaken for a hang:
the ranks that arrived must have waited at least `min_idle_s` before the capture ended, and
when the format records completion, the stuck entry must be incomplete on them.

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

from dataclasses import dataclass, field

import numpy as np

from trainsentry.diagnostics.model import RasCommunicator, State, Stream, Trace

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
    waited_s: float | None  # None: the format has no timing (NCCL RAS)
    first_arrival_ns: int
    #: Members of the group nothing names (see `Communicator.unidentified`).
    unidentified: int | None = 0

    @property
    def membership_known(self) -> bool:
        return self.unidentified == 0


@dataclass(frozen=True, slots=True)
class P2PWait:
    rank: int
    peer: int
    comm: str
    op: str
    seq: int
    waited_s: float


@dataclass
class HangAnalysis:
    hangs: list[CommHang] = field(default_factory=list)
    p2p_waits: list[P2PWait] = field(default_factory=list)
    root_cause_ranks: list[int] = field(default_factory=list)
    victim_ranks: list[int] = field(default_factory=list)
    #: Communicators that look stuck at the end of the capture but not for long enough.
    too_recent: list[CommHang] = field(default_factory=list)

    @property
    def primary(self) -> CommHang | None:
        """The hang that involves a root cause and has waited the longest."""
        roots = set(self.root_cause_ranks)
        involved = [h for h in self.hangs if roots & set(h.missing_ranks)] or self.hangs
        if not involved:
            return None
        return max(involved, key=lambda h: (h.waited_s or 0.0, -h.seq))


def _first_incomplete(stream: Stream) -> int | None:
    if not len(stream.state) or int(stream.state[0]) == State.UNKNOWN:
        return None
    pending = np.nonzero(stream.state != State.COMPLETED)[0]
    return int(stream.seq[pending[0]]) if len(pending) else None


def _event_at(stream: Stream, seq: int) -> int | None:
    i = int(np.searchsorted(stream.seq, seq))
    if i < len(stream.seq) and int(stream.seq[i]) == seq:
        return i
    return None


def _comm_hang(trace: Trace, comm_id: str, min_idle_s: float) -> tuple[CommHang | None, bool]:
    """(candidate, accepted): the communicator's stuck collective, and whether it is a verdict."""
    comm = trace.communicators[comm_id]
    streams = {s.rank: s for s in trace.streams_of(comm_id)}
    no_dump = tuple(r for r in comm.ranks if r not in trace.ranks_with_data)
    if not streams:
        return None, False
    reached = {r: s.reached for r, s in streams.items()}
    for rank in comm.ranks:
        if rank in trace.ranks_with_data and rank not in reached:
            reached[rank] = 0  # has a dump, never used this communicator
    top = max(reached.values())
    candidates = [reached[r] + 1 for r in reached if reached[r] < top]
    states_known = False
    for stream in streams.values():
        pending = _first_incomplete(stream)
        if len(stream.state) and int(stream.state[0]) != State.UNKNOWN:
            states_known = True
        if pending is not None:
            candidates.append(pending)
    if not candidates:
        return None, False
    seq = min(candidates)
    arrived = tuple(sorted(r for r in reached if reached[r] >= seq))
    missing = tuple(sorted({r for r in reached if reached[r] < seq} | set(no_dump)))
    arrival_times: list[int] = []
    op = "?"
    incomplete_on_arrived = True
    for rank in arrived:
        mine = streams.get(rank)
        i = _event_at(mine, seq) if mine is not None else None
        if mine is None or i is None:
            continue  # reached it per pg_status, but the entry left the ring buffer
        arrival_times.append(int(mine.time_ns[i]))
        op = trace.signatures[int(mine.signature[i])].describe()
        if states_known and int(mine.state[i]) == State.COMPLETED:
            incomplete_on_arrived = False
    if not arrival_times:
        return None, False
    first = min(arrival_times)
    waited = max(0.0, (trace.capture_end_ns - first) / 1e9)
    hang = CommHang(
        comm_id, comm.desc, op, seq, arrived, missing, no_dump, waited, first, comm.unidentified
    )
    agreed = incomplete_on_arrived if states_known else bool(missing)
    if not agreed:
        return None, False
    return hang, waited >= min_idle_s


def _p2p_waits(trace: Trace, min_idle_s: float) -> list[P2PWait]:
    waits = []
    for stream in trace.streams.values():
        if not stream.is_p2p or stream.peer is None:
            continue
        pending = _first_incomplete(stream)
        if pending is None:
            continue
        i = _event_at(stream, pending)
        if i is None or int(stream.peer[i]) < 0:
            continue
        waited = (trace.capture_end_ns - int(stream.time_ns[i])) / 1e9
        if waited >= min_idle_s:
            op = trace.signatures[int(stream.signature[i])].op
            waits.append(
                P2PWait(stream.rank, int(stream.peer[i]), stream.comm, op, pending, waited)
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


def analyze_hangs(trace: Trace, min_idle_s: float = DEFAULT_MIN_IDLE_S) -> HangAnalysis:
    analysis = HangAnalysis()
    for comm_id, comm in trace.communicators.items():
        if len(comm.ranks) < 2 and comm.membership_known:
            continue
        streams = trace.streams_of(comm_id)
        if not streams or any(s.is_p2p for s in streams):
            continue
        candidate, accepted = _comm_hang(trace, comm_id, min_idle_s)
        if candidate is not None:
            (analysis.hangs if accepted else analysis.too_recent).append(candidate)
    analysis.p2p_waits = _p2p_waits(trace, min_idle_s)
    edges: dict[int, set[int]] = {}
    for hang in analysis.hangs:
        for waiter in hang.arrived_ranks:
            edges.setdefault(waiter, set()).update(hang.missing_ranks)
    for wait in analysis.p2p_waits:
        edges.setdefault(wait.rank, set()).add(wait.peer)
    if not edges:
        return analysis
    analysis.root_cause_ranks = _root_causes(edges)
    missing = {r for h in analysis.hangs for r in h.missing_ranks}
    analysis.victim_ranks = sorted(
        (missing | {w.peer for w in analysis.p2p_waits}) - set(analysis.root_cause_ranks)
    )
    return analysis


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


def _ras_hang(comm: RasCommunicator) -> CommHang | None:
    behind: dict[int, tuple[str, int]] = {}
    arrived: set[int] = set()
    for op, counts in comm.counts.items():
        values = list(counts.values()) + ([comm.majority[op]] if op in comm.majority else [])
        if not values:
            continue
        top = max(values)
        for rank, count in counts.items():
            if count < top:
                if rank not in behind or count < behind[rank][1]:
                    behind[rank] = (op, count)
            else:
                arrived.add(rank)
    missing = set(behind) | set(comm.missing_ranks)
    if not missing:
        return None
    if behind:
        op, count = min(behind.values(), key=lambda v: v[1])
        seq = count + 1
    else:
        op, seq = "?", -1
    return CommHang(
        comm=comm.hash,
        desc=f"{comm.size}-rank communicator (RAS, communicator ranks)",
        op=op,
        seq=seq,
        arrived_ranks=tuple(sorted(arrived - missing)),
        missing_ranks=tuple(sorted(missing)),
        no_dump_ranks=tuple(sorted(comm.dead_ranks)),
        waited_s=None,
        first_arrival_ns=0,
    )


def analyze_ras(trace: Trace) -> HangAnalysis:
    """RAS has counts, not timelines: ranks behind the others (or unreachable) are missing.

    A RAS snapshot is taken while the job is live, so a rank behind on a count is only a
    suspect if the job is in fact stuck; the caller's idle evidence is the RAS query itself.
    """
    analysis = HangAnalysis()
    for comm in trace.ras:
        hang = _ras_hang(comm)
        if hang is not None:
            analysis.hangs.append(hang)
    roots = {r for h in analysis.hangs for r in h.missing_ranks}
    analysis.root_cause_ranks = sorted(roots)
    return analysis
