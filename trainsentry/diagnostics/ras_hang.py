"""Hangs from NCCL RAS: who has not launched the operation the others wait in. Pure.

RAS reports, per communicator and NCCL function, how many operations each rank has
*launched* (not completed). The ranks at the highest count have launched operation
`top` and wait in it; a rank below has not launched it. So:

- the ranks below the top are the missing ranks (whatever their number: when one rank is
  ahead and all others behind, the others are missing and the one ahead waits; RAS cannot
  tell a rank held up elsewhere from a rank that issued a collective the others never will,
  and a note says so);
- ranks whose process does not answer (INCOMPLETE, unresponsive or dead) are missing;
- a rank that reports an NCCL error of its own (System error, Internal error, ...) broke the
  communicator and is a culprit; ranks reporting "Remote process error" saw a peer fail and
  are victims, waiting on the culprits;
- a rank whose process answered without the communicator (left in teardown) is neither;
- a communicator whose slowest rank moved between two snapshots is progressing, not hung.

The culprit is a process: across communicators the waits form a graph between processes
(node address + pid, else node + GPU), so one stalled process that is rank 2 of one
communicator and rank 1 of another is one root cause. Root causes are reported as global
ranks where the reader could map the process (probe status, or the world communicator);
a process nothing maps is named in the notes, never passed off as a global rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsentry.diagnostics.hang import CommHang, HangAnalysis
from trainsentry.diagnostics.model import RasCommunicator, Trace
from trainsentry.probe.ras_verdict import RasCommState, judge_comm

#: A process: ("pid", host, pid) | ("gpu", host, gpu) | ("global", "", global rank) |
#: ("rank", communicator, rank), the first that the report and the mapping allow.
ProcessKey = tuple[str, str, str]


def comm_state(comm: RasCommunicator) -> RasCommState:
    """Pure: the missing, failed and waiting ranks of one communicator."""
    return judge_comm(
        comm.size,
        comm.counts,
        comm.missing_ranks,
        comm.dead_ranks,
        comm.left_ranks,
        comm.errors,
        comm.unnamed_groups,
    )


def process_key(comm: RasCommunicator, rank: int) -> ProcessKey:
    """Pure: the identity of the process behind a communicator rank."""
    host, pid, gpu = comm.processes.get(rank, ("", -1, ""))
    if host and pid >= 0:
        return ("pid", host, str(pid))
    if host and gpu:
        return ("gpu", host, gpu)
    global_rank = comm.global_ranks.get(rank)
    if global_rank is not None:
        return ("global", "", str(global_rank))
    return ("rank", comm.hash, str(rank))


def _roots(edges: dict[ProcessKey, set[ProcessKey]], culprits: set[ProcessKey]) -> list[ProcessKey]:
    """Culprits that wait on nobody; if every culprit waits on another (a cycle), all."""
    roots = sorted(k for k in culprits if not edges.get(k))
    return roots or sorted(culprits)


@dataclass
class _Graph:
    hangs: list[CommHang]
    edges: dict[ProcessKey, set[ProcessKey]]
    places: dict[ProcessKey, list[tuple[str, int]]]  # culprit -> (communicator, rank)
    to_global: dict[ProcessKey, int]


def _graph(trace: Trace) -> _Graph:
    graph = _Graph([], {}, {}, {})
    for comm in trace.ras:
        for rank, global_rank in comm.global_ranks.items():
            graph.to_global[process_key(comm, rank)] = global_rank
        if comm.progressed:
            continue
        state = comm_state(comm)
        if not state.stuck:
            continue
        culprits = set(state.culprits)
        waiting = ({*state.arrived, *state.remote_errors}) - culprits
        for culprit in culprits:
            graph.places.setdefault(process_key(comm, culprit), []).append((comm.hash, culprit))
        for waiter in waiting:
            graph.edges.setdefault(process_key(comm, waiter), set()).update(
                process_key(comm, r) for r in culprits
            )
        mapped = all(r in comm.global_ranks for r in (*waiting, *culprits))
        ranks = comm.global_ranks if mapped else {}
        graph.hangs.append(
            CommHang(
                comm=comm.hash,
                desc=(
                    f"{comm.size}-rank NCCL communicator (RAS, "
                    f"{'global' if mapped else 'communicator'} ranks)"
                ),
                op=state.op,
                seq=state.seq,
                arrived_ranks=tuple(sorted(ranks.get(r, r) for r in waiting)),
                missing_ranks=tuple(sorted(ranks.get(r, r) for r in culprits)),
                no_dump_ranks=tuple(sorted(ranks.get(r, r) for r in comm.dead_ranks)),
                waited_s=None,
                first_arrival_ns=0,
            )
        )
    return graph


def analyze_ras(trace: Trace) -> HangAnalysis:
    """Pure: hangs, root causes (global ranks where mapped) and victims from RAS."""
    graph = _graph(trace)
    culprits = set(graph.places)
    roots = set(_roots(graph.edges, culprits))
    return HangAnalysis(
        hangs=graph.hangs,
        root_cause_ranks=sorted({graph.to_global[k] for k in roots if k in graph.to_global}),
        victim_ranks=sorted({graph.to_global[k] for k in culprits - roots if k in graph.to_global}),
    )


def root_processes(trace: Trace) -> list[tuple[ProcessKey, int | None, list[tuple[str, int]]]]:
    """Pure: each root-cause process, its global rank if mapped, and where it is a culprit
    (communicator, communicator rank)."""
    graph = _graph(trace)
    roots = _roots(graph.edges, set(graph.places))
    return [(k, graph.to_global.get(k), graph.places[k]) for k in roots]
