"""What one communicator's RAS counts say: who waits, who has not launched, who failed. Pure.

RAS counts, per communicator and NCCL function, the operations each rank has *launched*
(not completed). The ranks at the highest count have launched that operation and wait in
it; a rank below has not launched it. Ranks whose process did not answer, and ranks with an
NCCL error of their own, are culprits too; ranks reporting "Remote process error" saw a
peer fail and wait on the culprits; ranks that left the communicator are neither. Used by
the probe (`suspects` in its RAS status) and by `trainsentry analyze` (`ras_hang`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainsentry.probe.ras_report import REMOTE_ERROR, RasReport


@dataclass(frozen=True, slots=True)
class RasCommState:
    """What one communicator's counts say (communicator ranks)."""

    op: str  # the function some rank has not launched up to the top, or the error
    seq: int  # the operation the others wait in (top count), -1 if unknown
    arrived: tuple[int, ...]  # launched it (or reported a remote error): waiting
    behind: tuple[int, ...]  # have not launched it
    unanswered: tuple[int, ...]  # process did not answer (missing, dead)
    failed: tuple[int, ...]  # reported an NCCL error of their own
    remote_errors: tuple[int, ...]  # reported "Remote process error"
    ahead_minority: bool  # fewer ranks launched `seq` than did not
    unnamed_behind: int = 0  # ranks behind that the (text) report does not name
    #: The ranks disagree on which collective comes next (each is behind on some function)
    #: and the culprits are the ranks outside the largest group of equal counts; False when
    #: no group is largest (then every rank is a culprit).
    mismatch: bool = False

    @property
    def culprits(self) -> tuple[int, ...]:
        return tuple(sorted({*self.behind, *self.unanswered, *self.failed}))

    @property
    def stuck(self) -> bool:
        return bool(self.culprits or self.remote_errors or self.unnamed_behind)


@dataclass(slots=True)
class _Launches:
    """What the launch counts say, function by function (absent ranks left out)."""

    #: rank -> (the first operation it has not launched, its function): the lowest over
    #: the functions it is below the top count in.
    behind: dict[int, tuple[int, str]]
    #: (top count, function) of each function some rank, named or not, is below the top in.
    waiting_in: list[tuple[int, str]]
    #: ranks below the top count that the (text) report does not name, over all functions.
    unnamed_behind: int
    #: named ranks at the top count of a function the report also gave unnamed groups for.
    at_top: set[int]


def judge_comm(
    size: int,
    counts_by_op: Mapping[str, Mapping[int, int]],
    missing_ranks: Iterable[int],
    dead_ranks: Iterable[int],
    left_ranks: Iterable[int],
    errors: Mapping[int, str],
    unnamed: Iterable[tuple[str, int, int]] = (),
) -> RasCommState:
    """Pure: the missing, failed and waiting ranks of one communicator (RAS semantics: the
    ranks at the highest launched count wait in that operation; ranks below it, ranks whose
    process did not answer and ranks with an NCCL error of their own are the culprits; ranks
    reporting "Remote process error" wait on them; ranks that left are neither). `unnamed`:
    groups (function, ranks, count) a text report printed without their ranks."""
    missing_set, left = set(missing_ranks), set(left_ranks)
    absent = missing_set | left
    groups: dict[str, list[tuple[int, int]]] = {}
    for op, n, count in unnamed:
        groups.setdefault(op, []).append((n, count))
    launches = _read_launches(counts_by_op, groups, absent)
    behind = launches.behind
    failed = tuple(sorted(r for r, e in errors.items() if e != REMOTE_ERROR))
    remote = tuple(sorted(r for r, e in errors.items() if e == REMOTE_ERROR))
    unanswered = tuple(sorted(missing_set | set(dead_ranks)))
    culprits = set(behind) | set(unanswered) | set(failed)
    members = _members(size, counts_by_op, launches, named_only=bool(groups))
    arrived = tuple(sorted(members - culprits - left))
    mismatch = False
    if behind and not arrived and not groups:
        # Every rank is behind on some function: they launched different collectives. The
        # ranks whose counts differ from the largest group's launched what the others never
        # will (a collective mismatch): they are the culprits, the others wait on them.
        odd = _odd_ranks(counts_by_op, absent, set(behind))
        if odd:
            mismatch = True
            behind = {r: behind[r] for r in odd}
            culprits = set(behind) | set(unanswered) | set(failed)
            arrived = tuple(sorted(members - culprits - left))
    seq, op = _waited_op(behind, launches.waiting_in, failed or remote, errors)
    return RasCommState(
        op=op,
        seq=seq,
        arrived=arrived,
        behind=tuple(sorted(behind)),
        unanswered=unanswered,
        failed=failed,
        remote_errors=remote,
        ahead_minority=bool(behind) and len(arrived) < len(behind) + launches.unnamed_behind,
        unnamed_behind=launches.unnamed_behind,
        mismatch=mismatch,
    )


def _read_launches(
    counts_by_op: Mapping[str, Mapping[int, int]],
    groups: Mapping[str, list[tuple[int, int]]],
    absent: set[int],
) -> _Launches:
    """Pure: per function (named counts and the unnamed `groups` (ranks, count) together),
    the top count and who is below it; functions nobody present counted are skipped."""
    behind: dict[int, tuple[int, str]] = {}
    waiting_in: list[tuple[int, str]] = []
    unnamed_behind = 0
    at_top: set[int] = set()
    for op in sorted(set(counts_by_op) | set(groups)):
        present = {r: c for r, c in counts_by_op.get(op, {}).items() if r not in absent}
        values = [*present.values(), *(c for _, c in groups.get(op, []))]
        if not values:
            continue
        top = max(values)
        for rank, count in present.items():
            if count < top and (rank not in behind or count + 1 < behind[rank][0]):
                behind[rank] = (count + 1, op)
        lagging = sum(n for n, c in groups.get(op, []) if c < top)
        unnamed_behind += lagging
        if lagging or any(c < top for c in present.values()):
            waiting_in.append((top, op))
        if op in groups:
            at_top |= {r for r, c in present.items() if c == top}
    return _Launches(behind, waiting_in, unnamed_behind, at_top)


def _members(
    size: int,
    counts_by_op: Mapping[str, Mapping[int, int]],
    launches: _Launches,
    named_only: bool,
) -> set[int]:
    """Pure: the communicator's ranks as far as known: ranks 0..size-1 and every rank
    counted; when the report left some ranks unnamed (`named_only`), only the named ranks
    at the top or behind."""
    if named_only:
        return launches.at_top | set(launches.behind)
    members = set(range(size)) if size > 0 else set()
    for counts in counts_by_op.values():
        members |= set(counts)
    return members


def _waited_op(
    behind: Mapping[int, tuple[int, str]],
    waiting_in: list[tuple[int, str]],
    erred: tuple[int, ...],
    errors: Mapping[int, str],
) -> tuple[int, str]:
    """Pure: (operation, function) the state names: the lowest one a culprit has not
    launched; else the lowest one some unnamed rank is behind in; else (-1, the error of
    the first rank in `erred`); else (-1, "?")."""
    if behind:
        return min(behind.values())
    if waiting_in:
        return min(waiting_in)
    if erred:
        return -1, errors[erred[0]]
    return -1, "?"


def _odd_ranks(
    counts_by_op: Mapping[str, Mapping[int, int]], absent: set[int], ranks: set[int]
) -> set[int]:
    """Pure: the ranks whose launch counts (over every function) differ from those of the
    largest group of ranks with equal counts; empty when no group is largest."""
    ops = sorted(counts_by_op)
    vectors = {r: tuple(counts_by_op[op].get(r, -1) for op in ops) for r in ranks - absent}
    ranked = Counter(vectors.values()).most_common(2)
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        return set()
    return {r for r, v in vectors.items() if v != ranked[0][0]}


def suspects(report: RasReport, limit: int = 256) -> list[dict[str, Any]]:
    """Pure: the ranks behind, unanswered or failed in each communicator, with the process
    RAS names for them (at most `limit`, the first communicators first)."""
    out: list[dict[str, Any]] = []
    for comm in report.comms:
        state = judge_comm(
            comm.size, comm.counts, comm.missing, comm.dead, comm.left, comm.errors, comm.unnamed
        )
        for rank in state.culprits:
            if rank in state.failed:
                kind = "error"
            elif rank in comm.dead:
                kind = "dead"
            elif rank in state.unanswered:
                kind = "missing"
            else:
                kind = "behind"
            process = comm.processes.get(rank)
            out.append(
                {
                    "communicator": comm.hash,
                    "size": comm.size,
                    "rank": rank,
                    "state": kind,
                    "op": state.op,
                    "waiting_in": state.seq,
                    "error": comm.errors.get(rank, ""),
                    "host": process.host if process else "",
                    "pid": process.pid if process else -1,
                    "gpu": process.gpu if process else "",
                }
            )
            if len(out) >= limit:
                return out
    return out
