"""Slow ranks: who arrives last at collectives, more often than chance, by how much.

Per communicator we take the sequence numbers every member recorded and, for each, the
rank that enqueued last and its lag behind the next-latest rank. Under "nobody is slow"
each of n peers is last with probability 1/n; a one-sided binomial test per (communicator,
rank), Holm-corrected over all tests, gives the p-value. A rank is slow when that p-value is
below `alpha` and its median lag is at least `min_lag_ms` (tiny systematic offsets, such as
one rank always logging first, are significant but harmless).

Pipeline parallelism: ranks of different pipeline stages reach a shared collective at
different times by design, so in a communicator that spans stages each stage's arrivals are
first shifted by that stage's median offset from the group. Stages come from the topology,
else from the p2p peers (p2p on the world group included: it is the peers, not the group,
that tell the pipelines apart). Slowness also propagates
along the pipeline (a stage waiting for activations from a slow stage is late too); with
a topology, a slow rank in the same pipeline group as a stronger slow rank, flagged in
fewer communicators, is reported as its victim, not as a cause.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import special, stats

from trainsentry.diagnostics.model import Trace
from trainsentry.diagnostics.topology import Topology

DEFAULT_ALPHA = 1e-3
DEFAULT_MIN_LAG_MS = 1.0
MIN_OPS = 10


@dataclass(frozen=True, slots=True)
class SlowTest:
    comm: str
    peers: tuple[int, ...]
    rank: int
    last_count: int
    ops: int
    p_value: float
    p_adjusted: float
    median_lag_ms: float
    mean_lag_ms: float
    #: log10 of the Bonferroni bound m * p, which does not underflow to 0 like p itself.
    log10_p_bound: float = 0.0

    @property
    def expected(self) -> float:
        return self.ops / len(self.peers)


@dataclass(frozen=True, slots=True)
class SlowRank:
    rank: int
    p_value: float
    lag_ms: float
    mean_lag_ms: float
    communicators: tuple[str, ...]
    last_count: int
    ops: int
    victim_of: int | None = None
    log10_p_bound: float = 0.0
    #: The communicators' descriptions (torch's group_desc, e.g. "default_pg"), in the same
    #: order; "" where a group has none.
    descriptions: tuple[str, ...] = ()


@dataclass
class SlowAnalysis:
    slow_ranks: list[SlowRank] = field(default_factory=list)
    victims: list[SlowRank] = field(default_factory=list)
    tests: list[SlowTest] = field(default_factory=list)


def stage_map(trace: Trace) -> dict[int, int]:
    """Pipeline stage per rank: from the topology, else from who talks to whom over p2p.

    Ranks joined by p2p (sender and receiver) form one pipeline; its ranks in ascending order
    are its stages (Megatron and torch's pipelining number stages that way). This holds
    whichever group the p2p runs on: on the world group the group's ranks are every rank,
    so only the peers tell the pipelines apart. A format without peers (Megatrace) falls
    back to the order of ranks in each p2p group.
    """
    ranks = set(trace.ranks_with_data)
    for comm in trace.communicators.values():
        ranks.update(comm.ranks)
    topology: Topology | None = trace.topology
    if topology is not None:
        return {r: topology.stage_of(r) for r in ranks}
    stages = dict.fromkeys(ranks, 0)
    parent: dict[int, int] = {}

    def root(rank: int) -> int:
        parent.setdefault(rank, rank)
        while parent[rank] != rank:
            parent[rank] = parent[parent[rank]]
            rank = parent[rank]
        return rank

    for (comm_id, rank), stream in trace.streams.items():
        if not stream.is_p2p:
            continue
        if stream.peer is None:
            members = trace.communicators[comm_id].ranks
            for index, member in enumerate(members):
                stages[member] = index
            continue
        for peer in np.unique(stream.peer).tolist():
            if peer >= 0 and peer != rank:
                parent[root(peer)] = root(rank)
    pipelines: dict[int, list[int]] = {}
    for rank in parent:
        pipelines.setdefault(root(rank), []).append(rank)
    for pipeline in pipelines.values():
        for index, member in enumerate(sorted(pipeline)):
            stages[member] = index
    return stages


def _arrival_matrix(
    trace: Trace, comm_id: str, stop_at: int | None = None
) -> tuple[list[int], np.ndarray] | None:
    streams = [s for s in trace.streams_of(comm_id) if len(s.seq)]
    if len(streams) < 2:
        return None
    firsts = []
    for stream in streams:
        uniq, idx = np.unique(stream.seq, return_index=True)
        firsts.append((uniq, stream.time_ns[idx]))
    common = firsts[0][0]
    for uniq, _ in firsts[1:]:
        common = np.intersect1d(common, uniq, assume_unique=True)
    if stop_at is not None:
        common = common[common < stop_at]
    if len(common) < MIN_OPS:
        return None
    columns = []
    for uniq, times in firsts:
        columns.append(times[np.searchsorted(uniq, common)])
    return [s.rank for s in streams], np.stack(columns, axis=1)


def _holm(p_values: list[float]) -> list[float]:
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for position, index in enumerate(order):
        value = min(1.0, (m - position) * p_values[index])
        running = max(running, value)
        adjusted[index] = running
    return adjusted


def _log10_binom_tail(k: int, n: int, p: float) -> float:
    """log10 P(X >= k) for X ~ Binomial(n, p), finite even where the tail underflows."""
    value = float(stats.binom.logsf(k - 1, n, p))
    if math.isfinite(value):
        return value / math.log(10)
    terms = stats.binom.logpmf(np.arange(k, n + 1), n, p)
    return float(special.logsumexp(terms)) / math.log(10)


def _remove_stage_offsets(times: np.ndarray, stages: list[int]) -> np.ndarray:
    """Shift each pipeline stage by its typical (median) distance from the whole group.

    A robust per-stage offset removes the schedule's built-in skew between stages while an
    individual rank that is late on many operations still stands out from its own stage.
    """
    distinct = sorted(set(stages))
    if len(distinct) < 2:
        return times
    stage_array = np.asarray(stages)
    overall = np.median(times, axis=1)
    adjusted = times.astype(np.float64)
    for stage in distinct:
        columns = np.nonzero(stage_array == stage)[0]
        stage_median = np.median(times[:, columns], axis=1)
        offset = float(np.median(stage_median - overall))
        adjusted[:, columns] -= offset
    return adjusted


#: One binomial test before Holm's correction: communicator, its peers, rank, times last,
#: operations, p-value, median and mean lag (ms) when last, log10 of the p-value.
_RawTest = tuple[str, tuple[int, ...], int, int, int, float, float, float, float]


def _last_arrival_tests(comm_id: str, ranks: list[int], times: np.ndarray) -> list[_RawTest]:
    """Pure: per rank of one communicator (`times`: one row per operation, one column per
    rank, stage offsets removed), how often it arrived last (ties count for nobody), the
    one-sided binomial p-value of that against 1/n, and its lag behind the next-latest rank
    on those operations."""
    ops = times.shape[0]
    ordered = np.sort(times, axis=1)
    lag_ms = (ordered[:, -1] - ordered[:, -2]) / 1e6
    last = np.argmax(times, axis=1)
    tied = ordered[:, -1] == ordered[:, -2]
    peers = tuple(ranks)
    raw: list[_RawTest] = []
    for position, rank in enumerate(peers):
        mine = (last == position) & ~tied
        k = int(mine.sum())
        p = float(stats.binom.sf(k - 1, ops, 1.0 / len(peers))) if k else 1.0
        log10_p = _log10_binom_tail(k, ops, 1.0 / len(peers)) if k else 0.0
        lags = lag_ms[mine]
        median = float(np.median(lags)) if k else 0.0
        mean = float(lags.mean()) if k else 0.0
        raw.append((comm_id, peers, rank, k, ops, p, median, mean, log10_p))
    return raw


def _causes_and_victims(
    trace: Trace, flagged: dict[int, list[SlowTest]], tests: list[SlowTest]
) -> SlowAnalysis:
    """Pure: one SlowRank per flagged rank, strongest first (flagged in more communicators,
    then the larger sum of times last x median lag); with a topology, a rank in the pipeline
    group of an earlier cause flagged in more communicators is that cause's victim, otherwise
    it is a cause."""

    def score(item: tuple[int, list[SlowTest]]) -> tuple[int, float]:
        return len(item[1]), sum(t.last_count * t.median_lag_ms for t in item[1])

    analysis = SlowAnalysis(tests=tests)
    for rank, rank_tests in sorted(flagged.items(), key=score, reverse=True):
        strongest = max(rank_tests, key=lambda t: t.last_count * t.median_lag_ms)
        victim_of = None
        if trace.topology is not None:
            group = set(trace.topology.pipeline_group_of(rank))
            for cause in analysis.slow_ranks:
                if cause.rank in group and len(cause.communicators) > len(rank_tests):
                    victim_of = cause.rank
                    break
        comms = tuple(sorted(t.comm for t in rank_tests))
        result = SlowRank(
            rank=rank,
            p_value=min(t.p_adjusted for t in rank_tests),
            lag_ms=strongest.median_lag_ms,
            mean_lag_ms=strongest.mean_lag_ms,
            communicators=comms,
            descriptions=tuple(trace.communicators[c].desc for c in comms),
            last_count=sum(t.last_count for t in rank_tests),
            ops=sum(t.ops for t in rank_tests),
            victim_of=victim_of,
            log10_p_bound=min(t.log10_p_bound for t in rank_tests),
        )
        (analysis.victims if victim_of is not None else analysis.slow_ranks).append(result)
    return analysis


def analyze_slow(
    trace: Trace,
    alpha: float = DEFAULT_ALPHA,
    min_lag_ms: float = DEFAULT_MIN_LAG_MS,
    stop_at: Mapping[str, int] | None = None,
) -> SlowAnalysis:
    """Pure. `stop_at`: per communicator, the first sequence number with a blocking
    mismatch; only arrivals before it count (after it the ranks' equal numbers name
    different operations: a rank whose larger all_reduce consumed its peers' next one is a
    whole collective "late" on every later number without being slow)."""
    stages = stage_map(trace)
    raw: list[_RawTest] = []
    for comm_id, comm in trace.communicators.items():
        if len(comm.ranks) < 2:
            continue
        if any(s.is_p2p for s in trace.streams_of(comm_id)):
            continue
        matrix = _arrival_matrix(trace, comm_id, (stop_at or {}).get(comm_id))
        if matrix is None:
            continue
        ranks, times = matrix
        member_stages = [stages.get(r, 0) for r in ranks]
        if len(set(member_stages)) == len(ranks):
            continue  # one rank per stage: its lateness cannot be told from pipeline skew
        times = _remove_stage_offsets(times, member_stages)
        raw.extend(_last_arrival_tests(comm_id, ranks, times))
    adjusted = _holm([r[5] for r in raw])
    log10_tests = math.log10(max(1, len(raw)))
    tests = [
        SlowTest(c, peers, rank, k, ops, p, adj, median, mean, min(0.0, lp + log10_tests))
        for (c, peers, rank, k, ops, p, median, mean, lp), adj in zip(raw, adjusted, strict=True)
    ]
    flagged: dict[int, list[SlowTest]] = {}
    for test in tests:
        if test.p_adjusted < alpha and test.median_lag_ms >= min_lag_ms:
            flagged.setdefault(test.rank, []).append(test)
    return _causes_and_victims(trace, flagged, tests)
