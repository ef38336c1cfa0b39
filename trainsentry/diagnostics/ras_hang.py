"""Hangs from NCCL RAS: who has not launched the operation the others wait in. Pure.

RAS reports, per communicator and NCCL function, how many operations each rank has
*launched* (not completed). The ranks at the highest count have launched operation
`top` and wait in it; a rank below has not launched it. So:

- the ranks below the top are the missing ranks (whatever their number: when one rank is
  ahead and all others behind, the others are missing and the one ahead waits; RAS cannot
  tell a rank held up elsewhere from a rank that issued a collective the others never will,
  and a note says so);
- when every rank is behind on some function, they launched different collectives (a
  collective mismatch): the ranks outside the largest group of equal counts are the culprits
  (`probe.ras_verdict.judge_comm`);
- ranks whose process does not answer (INCOMPLETE, unresponsive or dead) are missing;
- a rank that reports an NCCL error of its own (System error, Internal error, ...) broke the
  communicator and is a culprit; ranks reporting "Remote process error" (ncclRemoteError:
  "remote process exited or there was a network error") saw a peer fail and wait on the
  culprits; where RAS names no culprit, they are the lead: their peers and links;
- a rank whose process answered without the communicator (left in teardown) is neither;
- a communicator whose slowest rank moved between two snapshots is progressing, not hung.

The culprit is a process, not a rank: RAS ranks are communicator ranks, and one stalled
process is rank 2 of one communicator and rank 1 of another. Across communicators the waits
form a graph between processes (node address + pid, else node + GPU), so that process is one
root cause. A process has a global rank only where a probe's status names it (its pid, and
RAS's node address among its host_ips); nothing else is passed off as a global rank (a
communicator as large as the job need not be the world, nor its ranks global ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsentry.diagnostics.hang import CommHang, HangAnalysis
from trainsentry.diagnostics.model import ProcessVerdict, RasCommunicator, RasPlace, Trace
from trainsentry.probe.ras_report import REMOTE_ERROR
from trainsentry.probe.ras_verdict import RasCommState, judge_comm

#: A process: ("pid", host, pid) | ("gpu", host, gpu) | ("global", "", global rank) |
#: ("rank", communicator, rank), the first that the report and the mapping allow.
ProcessKey = tuple[str, str, str]

REMOTE_MEANING = (
    "NCCL reported a Remote process error (ncclRemoteError: a remote process exited or the "
    "network failed): a peer of this rank in that communicator died or the link to it broke; "
    "look at its peers' processes and at the network between them"
)
ERROR_MEANING = (
    "NCCL failed in this process ({error}): the communicator is broken here; its log "
    "(NCCL_DEBUG=WARN) says why"
)
MISSING_MEANING = "RAS got no answer from this process (it died, hangs, or is unreachable)"
BEHIND_MEANING = "it has not launched the collective its peers wait in"
MISMATCH_MEANING = (
    "it launched different collectives than its peers (a collective mismatch): its peers "
    "wait in one it never launched"
)


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


def _what(comm: RasCommunicator, state: RasCommState, rank: int) -> tuple[str, str]:
    """Pure: (what a culprit rank did in its communicator, what that means)."""
    error = comm.errors.get(rank)
    if error is not None and error != REMOTE_ERROR:
        return f"reported {error}", ERROR_MEANING.format(error=error)
    if rank in state.unanswered:
        dead = " (considered dead)" if rank in comm.dead_ranks else ""
        return f"sent no data{dead}", MISSING_MEANING
    if state.mismatch:
        return f"launched different collectives (not {state.op} {state.seq})", MISMATCH_MEANING
    return f"has not launched {state.op} {state.seq}", BEHIND_MEANING


@dataclass
class _Graph:
    hangs: list[CommHang]
    edges: dict[ProcessKey, set[ProcessKey]]
    places: dict[ProcessKey, list[tuple[RasCommunicator, int]]]  # culprit -> where
    remote: dict[ProcessKey, list[tuple[RasCommunicator, int]]]  # remote-error reporters


def _graph(trace: Trace) -> _Graph:
    graph = _Graph([], {}, {}, {})
    for comm in trace.ras:
        if comm.progressed:
            continue
        state = comm_state(comm)
        if not state.stuck:
            continue
        culprits = set(state.culprits)
        waiting = ({*state.arrived, *state.remote_errors}) - culprits
        for culprit in culprits:
            graph.places.setdefault(process_key(comm, culprit), []).append((comm, culprit))
        for rank in state.remote_errors:
            graph.remote.setdefault(process_key(comm, rank), []).append((comm, rank))
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
                rank_space="global" if mapped else "communicator",
            )
        )
    return graph


def _verdict(
    role: str, places: list[tuple[RasCommunicator, int]], meaning: str = ""
) -> ProcessVerdict:
    """Pure: one process, from where it stands in each communicator."""
    first, rank = places[0]
    host, pid, gpu = first.processes.get(rank, ("", -1, ""))
    global_rank = next((c.global_ranks[r] for c, r in places if r in c.global_ranks), None)
    pod, node = next((c.identities[r] for c, r in places if r in c.identities), ("", ""))
    out = []
    meanings = []
    for comm, r in places:
        if role == "remote_error":
            what, why = "reported Remote process error", REMOTE_MEANING
        else:
            what, why = _what(comm, comm_state(comm), r)
        out.append(RasPlace(comm.hash, comm.size, r, what))
        meanings.append(why)
    return ProcessVerdict(
        role=role,
        node_address=host,
        pid=pid,
        gpu=gpu,
        global_rank=global_rank,
        pod=pod,
        node=node,
        places=tuple(out),
        meaning=meaning or "; ".join(dict.fromkeys(meanings)),
    )


def analyze_ras(trace: Trace) -> HangAnalysis:
    """Pure: hangs, the processes they point at (merged across communicators), and root
    causes / victims as global ranks where a probe names the process."""
    graph = _graph(trace)
    culprits = set(graph.places)
    roots = set(_roots(graph.edges, culprits))
    processes = [_verdict("root_cause", graph.places[k]) for k in sorted(roots)]
    processes += [_verdict("victim", graph.places[k]) for k in sorted(culprits - roots)]
    processes += [
        _verdict("remote_error", places)
        for key, places in sorted(graph.remote.items())
        if key not in culprits
    ]
    analysis = HangAnalysis(
        hangs=graph.hangs,
        root_cause_ranks=sorted(
            {
                p.global_rank
                for p in processes
                if p.role == "root_cause" and p.global_rank is not None
            }
        ),
        victim_ranks=sorted(
            {p.global_rank for p in processes if p.role == "victim" and p.global_rank is not None}
        ),
        processes=processes,
    )
    analysis.notes = [_note(p) for p in processes]
    return analysis


def _note(process: ProcessVerdict) -> str:
    """Pure: one line per process: who it is and what it did in each communicator."""
    gpu = f"GPU {process.gpu} managed by " if process.gpu else ""
    pid = f"process {process.pid}" if process.pid >= 0 else "a process"
    who = f"{gpu}{pid} on node {process.node_address or '?'}"
    if process.global_rank is not None:
        who += f" = global rank {process.global_rank}"
        extra = ", ".join(
            x
            for x in (
                f"pod {process.pod}" if process.pod else "",
                f"node {process.node}" if process.node else "",
            )
            if x
        )
        who += f" ({extra})" if extra else ""
    else:
        who += " (global rank unknown: give analyze the probes' /status JSON)"
    where = "; ".join(
        f"rank {p.rank} of communicator {p.communicator} ({p.size} ranks) {p.what}"
        for p in process.places
    )
    count = len(process.places)
    label = {"root_cause": "culprit", "victim": "victim", "remote_error": "remote error"}
    text = f"{label[process.role]}: {who}; in {count} communicator{'s' if count > 1 else ''}: "
    text += where
    if process.role == "remote_error":
        text += f": {process.meaning}"
    return text
