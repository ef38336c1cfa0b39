"""Mismatches: ranks of one communicator that disagree about the same sequence number.

For each collective sequence number every member's signature must be equal as the
collective defines it (`OpSignature.match_key`, the way PyTorch's fr analysis compares):
op, sizes and dtypes in general; a coalesced group by its type; all_to_all (uneven splits)
by op and dtype; gather / reduce by their input and scatter by its output, the side every
rank has (non-root ranks record the other side empty). Where they differ, the ranks outside the
largest agreeing group are the culprits (with two equal-sized groups we cannot tell and
say so). all_gather / reduce_scatter also need output = input x group size (resp. the
reverse) on each rank. A state mismatch is an entry left incomplete on a rank while a later
entry of the same communicator completed there.

Only the first `max_per_comm` mismatching sequence numbers of each communicator are
detailed (after the first one, the ranks are out of step and later ones follow from it);
`total` counts all of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from math import prod

import numpy as np

from trainsentry.diagnostics.model import (
    GATHER_OPS,
    SCATTER_OPS,
    OpSignature,
    State,
    Stream,
    Trace,
)


@dataclass(frozen=True, slots=True)
class Mismatch:
    comm: str
    seq: int
    kind: str  # op | size | dtype | state
    culprit_ranks: tuple[int, ...]
    expected: str
    found: str
    ambiguous: bool = False


@dataclass
class MismatchAnalysis:
    mismatches: list[Mismatch] = field(default_factory=list)
    total: int = 0


def _numel(sizes: tuple[tuple[int, ...], ...]) -> int:
    return sum(prod(s) for s in sizes)


def size_consistent(sig: OpSignature, group_size: int | None) -> bool:
    """all_gather: out = in x n; reduce_scatter: in = out x n (when both sides are known;
    a group of unknown size has nothing to check against)."""
    if group_size is None or not sig.input_sizes or not sig.output_sizes:
        return True
    n_in, n_out = _numel(sig.input_sizes), _numel(sig.output_sizes)
    if sig.op in GATHER_OPS:
        return n_out == n_in * group_size
    if sig.op in SCATTER_OPS:
        return n_in == n_out * group_size
    return True


def _kind(expected: OpSignature, found: OpSignature) -> str:
    if expected.op != found.op or len(expected.parts) != len(found.parts):
        return "op"
    if expected.parts:
        for a, b in zip(expected.parts, found.parts, strict=True):
            if a != b:
                return _kind(a, b)
    if expected.input_dtypes != found.input_dtypes or expected.output_dtypes != found.output_dtypes:
        return "dtype"
    return "size"


def _comm_mismatch_seqs(trace: Trace, comm_id: str, keys: np.ndarray) -> np.ndarray:
    streams = [s for s in trace.streams_of(comm_id) if len(s.seq)]
    if len(streams) < 2:
        return np.empty(0, dtype=np.int64)
    seqs = np.concatenate([s.seq for s in streams])
    sigs = keys[np.concatenate([s.signature for s in streams])]
    order = np.lexsort((sigs, seqs))
    seqs, sigs = seqs[order], sigs[order]
    differs = (seqs[1:] == seqs[:-1]) & (sigs[1:] != sigs[:-1])
    return np.unique(seqs[1:][differs])


@dataclass(frozen=True, slots=True)
class _Group:
    """One communicator under check: its id, its members' streams (each sorted by sequence
    number) and its size (None when not even the number of members is known)."""

    comm: str
    streams: list[Stream]
    size: int | None


def _expected(
    trace: Trace, counts: list[tuple[int, int]], group_size: int | None
) -> tuple[int, bool]:
    """Pure: (the expected signature's key id, whether it is a tie) among `counts` (key id,
    ranks), most common first. A tie between the largest groups is broken in favour of the
    one signature that is internally consistent (`size_consistent`), if exactly one is."""
    majority_id = counts[0][0]
    tie = len(counts) > 1 and counts[0][1] == counts[1][1]
    if tie:
        consistent = [c for c, _ in counts if size_consistent(trace.signatures[c], group_size)]
        if len(consistent) == 1:
            majority_id, tie = consistent[0], False
    return majority_id, tie


def _signature_mismatches(
    trace: Trace, group: _Group, keys: np.ndarray, seqs: np.ndarray
) -> list[Mismatch]:
    """Pure: per sequence number in `seqs`, one mismatch per signature other than the
    expected one, naming the ranks that recorded it (in the order of `seqs`, then the most
    common signature first)."""
    mismatches = []
    for seq in seqs:
        per_rank: dict[int, int] = {}
        for stream in group.streams:
            i = int(np.searchsorted(stream.seq, seq))
            if i < len(stream.seq) and int(stream.seq[i]) == int(seq):
                per_rank[stream.rank] = int(keys[int(stream.signature[i])])
        counts = Counter(per_rank.values()).most_common()
        majority_id, tie = _expected(trace, counts, group.size)
        expected = trace.signatures[majority_id]
        for sig_id, _count in counts:
            if sig_id == majority_id:
                continue
            found = trace.signatures[sig_id]
            culprits = tuple(sorted(r for r, s in per_rank.items() if s == sig_id))
            mismatches.append(
                Mismatch(
                    group.comm,
                    int(seq),
                    _kind(expected, found),
                    culprits,
                    expected.describe(),
                    found.describe(),
                    tie,
                )
            )
    return mismatches


def _size_mismatches(trace: Trace, group: _Group, known: list[Mismatch]) -> list[Mismatch]:
    """Pure: the per-rank size rule (`size_consistent`), even where all ranks agree on a
    broken all_gather: one mismatch per broken signature, at its first sequence number, naming
    every rank that recorded it; none where `known` (or an earlier one of these) already
    names the same communicator, sequence number and ranks."""
    size_ok: dict[int, bool] = {}
    broken: dict[int, tuple[int, list[int]]] = {}  # sig id -> (first seq, ranks)
    for stream in group.streams:
        for sig_id in np.unique(stream.signature):
            key = int(sig_id)
            ok = size_ok.get(key)
            if ok is None:
                ok = size_ok[key] = size_consistent(trace.signatures[key], group.size)
            if ok:
                continue
            first = int(stream.seq[np.nonzero(stream.signature == sig_id)[0][0]])
            seen_first, ranks = broken.setdefault(key, (first, []))
            broken[key] = (min(seen_first, first), ranks)
            ranks.append(stream.rank)
    mismatches: list[Mismatch] = []
    for key, (first, ranks) in broken.items():
        sig = trace.signatures[key]
        culprits = tuple(sorted(ranks))
        if any(
            m.comm == group.comm and m.seq == first and m.culprit_ranks == culprits
            for m in (*known, *mismatches)
        ):
            continue
        mismatches.append(
            Mismatch(
                group.comm,
                first,
                "size",
                culprits,
                f"{sig.op} with output = input x {group.size}",
                sig.describe(),
            )
        )
    return mismatches


def _state_mismatches(group: _Group) -> list[Mismatch]:
    """Pure: per rank whose format records states, the first entry left incomplete before
    that rank's last completed one (at most one per rank)."""
    mismatches = []
    for stream in group.streams:
        if stream.records_states:
            done = np.nonzero(stream.state == State.COMPLETED)[0]
            if len(done):
                stuck = np.nonzero(stream.state[: done[-1]] != State.COMPLETED)[0]
                if len(stuck):
                    mismatches.append(
                        Mismatch(
                            group.comm,
                            int(stream.seq[stuck[0]]),
                            "state",
                            (stream.rank,),
                            "completed",
                            "incomplete before a completed entry",
                        )
                    )
    return mismatches


def analyze_mismatches(trace: Trace, max_per_comm: int = 3) -> MismatchAnalysis:
    """Pure. Per communicator of two or more ranks (p2p ones aside): its signature, size and
    state mismatches in that order, then all sorted with state mismatches last, by
    communicator and sequence number. `total` counts every sequence number whose signatures
    differ (the detailed or not) plus each size and state mismatch."""
    analysis = MismatchAnalysis()
    keys = trace.signatures.key_ids()  # signatures compared as the collective defines them
    for comm_id, comm in trace.communicators.items():
        streams = trace.streams_of(comm_id)
        if len(comm.ranks) < 2 or not streams or any(s.is_p2p for s in streams):
            continue
        # Members nothing names still count (their number comes from the gathers' sizes);
        # when even the group's size is unknown, the size rule has nothing to check against.
        group_size = None if comm.unidentified is None else len(comm.ranks) + comm.unidentified
        group = _Group(comm_id, streams, group_size)
        bad_seqs = _comm_mismatch_seqs(trace, comm_id, keys)
        differing = _signature_mismatches(trace, group, keys, bad_seqs[:max_per_comm])
        sizes = _size_mismatches(trace, group, differing)
        states = _state_mismatches(group)
        analysis.total += len(bad_seqs) + len(sizes) + len(states)
        analysis.mismatches += [*differing, *sizes, *states]
    analysis.mismatches.sort(key=lambda m: (m.kind == "state", m.comm, m.seq))
    return analysis
