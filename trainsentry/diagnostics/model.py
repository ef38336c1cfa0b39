"""One event model for every trace format the analyzer reads.

Readers turn Flight Recorder dumps, Megatrace logs and NCCL RAS snapshots into a `Trace`.
Per (communicator, rank) the events are kept as numpy columns (`Stream`), because a
1,024-rank job with 2,000 entries per rank is two million events: one Python object per
event would cost gigabytes. `Trace.events()` still yields plain `Event` objects for callers
that want them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from math import prod

import numpy as np
import numpy.typing as npt

from trainsentry.diagnostics.topology import Topology

IntArray = npt.NDArray[np.int64]
SmallIntArray = npt.NDArray[np.int8]


class State(IntEnum):
    """How far an operation got, as far as the trace knows."""

    UNKNOWN = -1  # the format records enqueue only (Megatrace)
    SCHEDULED = 0
    STARTED = 1
    COMPLETED = 2


P2P_OPS = frozenset({"send", "recv"})
GATHER_OPS = frozenset(
    {"all_gather", "_all_gather_base", "all_gather_into_tensor", "all_gather_single"}
)
SCATTER_OPS = frozenset(
    {"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor", "reduce_scatter_single"}
)


#: Sizes differ per rank by design (uneven splits, every MoE layer): compared by op and dtype.
ALL_TO_ALL_OPS = frozenset(
    {"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_to_allv"}
)
#: Rooted collectives: only the root has the gathered / scattered side (the others record
#: it empty), so only the side every rank has is compared.
INPUT_ONLY_OPS = frozenset({"gather", "reduce"})
OUTPUT_ONLY_OPS = frozenset({"scatter"})
#: The entry that closes a coalesced group; its sizes are not the members' (torch matches
#: it by type only).
COALESCED_MARKERS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})


@dataclass(frozen=True, slots=True)
class OpSignature:
    """What a rank said it was doing at one sequence number; equal signatures match.

    A coalesced group is one signature whose `parts` are the member operations.
    """

    op: str
    input_sizes: tuple[tuple[int, ...], ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_dtypes: tuple[str, ...] = ()
    parts: tuple[OpSignature, ...] = ()

    def implied_group_size(self) -> int | None:
        """The group size an all_gather (out = in x n) or reduce_scatter (in = out x n)
        states through its sizes; None for other ops or when the sizes do not say."""
        if self.op not in GATHER_OPS and self.op not in SCATTER_OPS:
            return None
        n_in = sum(prod(s) for s in self.input_sizes)
        n_out = sum(prod(s) for s in self.output_sizes)
        big, small = (n_out, n_in) if self.op in GATHER_OPS else (n_in, n_out)
        if small <= 0 or big % small:
            return None
        return big // small

    def match_key(self) -> OpSignature:
        """What ranks must agree on, as the collective defines it (PyTorch's fr analysis,
        `Op.match`, compares the same way).

        Pure. A coalesced group: member by member, each by its own key; the group's marker
        entry (`coalesced`, `ALLGATHER_coalesced`, ...) by its type only. all_to_all:
        op and dtypes, not sizes. gather / reduce: the input every rank has; scatter: the
        output every rank has. Everything else: the whole signature.
        """
        if self.parts:
            return OpSignature(
                self.op,
                parts=tuple(p.match_key() for p in self.parts if p.op not in COALESCED_MARKERS),
            )
        if self.op in COALESCED_MARKERS:
            return OpSignature(self.op)
        if self.op in ALL_TO_ALL_OPS:
            dtypes = tuple(sorted({*self.input_dtypes, *self.output_dtypes}))
            return OpSignature(self.op, input_dtypes=dtypes)
        if self.op in INPUT_ONLY_OPS:
            return OpSignature(self.op, self.input_sizes, (), self.input_dtypes, ())
        if self.op in OUTPUT_ONLY_OPS:
            return OpSignature(self.op, (), self.output_sizes, (), self.output_dtypes)
        return self

    def describe(self) -> str:
        if self.parts:
            return "coalesced[" + ", ".join(p.describe() for p in self.parts) + "]"
        sizes = ",".join("x".join(map(str, s)) for s in self.input_sizes)
        dtypes = ",".join(self.input_dtypes)
        extra = f" {sizes}" if sizes else ""
        return f"{self.op}{extra}{' ' + dtypes if dtypes else ''}"


class SignatureTable:
    """Interns signatures so streams can store a small integer per event."""

    def __init__(self) -> None:
        self._ids: dict[OpSignature, int] = {}
        self._items: list[OpSignature] = []

    def intern(self, signature: OpSignature) -> int:
        found = self._ids.get(signature)
        if found is not None:
            return found
        new_id = len(self._items)
        self._ids[signature] = new_id
        self._items.append(signature)
        return new_id

    def __getitem__(self, signature_id: int) -> OpSignature:
        return self._items[signature_id]

    def key_ids(self) -> IntArray:
        """Signature id -> id of its `match_key` (equal ids: the ranks agree)."""
        keys: dict[OpSignature, int] = {}
        out = np.empty(max(1, len(self._items)), dtype=np.int64)
        for i, sig in enumerate(self._items):
            key = sig.match_key()
            found = keys.get(key)
            if found is None:
                found = keys[key] = i
            out[i] = found
        return out

    def __len__(self) -> int:
        return len(self._items)


@dataclass(slots=True)
class Stream:
    """All events of one rank on one communicator, sorted by sequence number."""

    rank: int
    comm: str
    seq: IntArray
    time_ns: IntArray
    signature: IntArray
    state: SmallIntArray
    is_p2p: bool = False
    #: Highest sequence number the rank says it enqueued, even if the entry left the ring
    #: buffer (Flight Recorder `pg_status.last_enqueued_collective`); -1 if unknown.
    last_enqueued: int = -1
    #: For p2p streams: the global peer rank of each event (-1 if unknown).
    peer: IntArray | None = None
    #: `pg_status.last_started_collective` (NCCL with TORCH_NCCL_ENABLE_TIMING=1 only);
    #: -1 if not recorded.
    last_started: int = -1

    @property
    def reached(self) -> int:
        """The highest sequence number this rank reached on this communicator."""
        last = int(self.seq[-1]) if len(self.seq) else -1
        return max(last, self.last_enqueued)

    @property
    def records_states(self) -> bool:
        """Whether this stream's format records each entry's state (scheduled, started,
        completed): Flight Recorder dumps do, Megatrace logs do not (State.UNKNOWN)."""
        return bool(len(self.state)) and int(self.state[0]) != State.UNKNOWN


@dataclass(frozen=True, slots=True)
class Communicator:
    id: str
    ranks: tuple[int, ...]  # global ranks, sorted
    desc: str = ""
    #: True when the membership came from the trace itself (pg_config, groupHash, RAS);
    #: False when it was reconstructed from timing or from the ranks that showed up.
    declared: bool = True
    #: Members not in `ranks` because nothing names them (a Flight Recorder group without a
    #: usable pg_config whose members' dumps are missing): 0 when `ranks` is the whole group,
    #: a count when the group's size is known from elsewhere, None when not even that is.
    unidentified: int | None = 0

    @property
    def membership_known(self) -> bool:
        return self.unidentified == 0


@dataclass(frozen=True, slots=True)
class Gap:
    """Sequence numbers missing from one rank's record (a ring buffer that wrapped)."""

    rank: int
    comm: str
    after_seq: int
    before_seq: int

    @property
    def missing(self) -> int:
        return self.before_seq - self.after_seq - 1


@dataclass(frozen=True, slots=True)
class InputError:
    path: str
    message: str


@dataclass(frozen=True, slots=True)
class Event:
    rank: int
    comm: str
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: State
    time_ns: int
    is_p2p: bool


@dataclass
class RasCommunicator:
    """One communicator as NCCL RAS saw it: operation counts per rank, not operations.

    Ranks are communicator ranks (RAS does not know global ranks). `counts` may be partial
    (the text output lists only outliers); `majority` is the count most ranks reported.
    """

    hash: str
    size: int
    counts: dict[str, dict[int, int]] = field(default_factory=dict)
    majority: dict[str, int] = field(default_factory=dict)
    missing_ranks: tuple[int, ...] = ()
    dead_ranks: tuple[int, ...] = ()
    error_ranks: tuple[int, ...] = ()
    #: Communicator rank -> (node address, pid (-1 unknown), GPU) where RAS named the process.
    processes: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    #: Ranks whose process answered without this communicator (left, e.g. in teardown).
    left_ranks: tuple[int, ...] = ()
    #: Communicator rank -> the NCCL error it reported ("Remote process error", ...).
    errors: dict[int, str] = field(default_factory=dict)
    #: Communicator rank -> global rank, where a probe's status names the process (its pid,
    #: and RAS's node address among its host_ips).
    global_ranks: dict[int, int] = field(default_factory=dict)
    #: Communicator rank -> (pod, Kubernetes node) from that probe's status.
    identities: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: (function, ranks, launched count) of groups a text report printed without naming
    #: their ranks, where they could not be placed (see `trainsentry.probe.ras_report`).
    unnamed_groups: tuple[tuple[str, int, int], ...] = ()
    #: How many reports saw this communicator, and whether its slowest rank moved between
    #: the first and the last (None: one report).
    snapshots: int = 1
    progressed: bool | None = None


@dataclass(frozen=True, slots=True)
class RasPlace:
    """Where a process stands in one communicator (NCCL RAS)."""

    communicator: str
    size: int
    rank: int  # its rank in that communicator
    what: str  # "has not launched AllReduce 31", "reported Remote process error", ...


@dataclass(frozen=True, slots=True)
class ProcessVerdict:
    """A process NCCL RAS points at: RAS names processes (`GPU g managed by process PID on
    node ADDR`), and one process is a different rank in each of its communicators.

    `role`: "root_cause" (a culprit that waits on nobody), "victim" (a culprit that waits
    on a root cause elsewhere), "remote_error" (its NCCL reported a Remote process error:
    a peer process died or the network to it failed; not itself the cause).
    """

    role: str
    node_address: str  # the address RAS prints (NCCL's socket interface); "" unknown
    pid: int  # -1 unknown
    gpu: str
    global_rank: int | None  # None unless a probe's status names this process
    pod: str
    node: str  # Kubernetes node, from the probe
    places: tuple[RasPlace, ...]
    meaning: str

    def describe(self) -> str:
        """`process 5005 on 10.0.1.1 (GPU 1; communicator rank 1 of 0000000000000102)`, or
        `global rank 5 (process 5005 on 10.0.1.1, GPU 1, pod p, node n)` when mapped."""
        process = f"process {self.pid}" if self.pid >= 0 else "a process"
        where = f"{process} on {self.node_address or '?'}"
        if self.global_rank is None:
            ranks = ", ".join(
                f"communicator rank {p.rank} of {p.communicator}" for p in self.places
            )
            gpu = f"GPU {self.gpu}; " if self.gpu else ""
            return f"{where} ({gpu}{ranks})"
        extra = [f"GPU {self.gpu}"] if self.gpu else []
        extra += [f"pod {self.pod}"] if self.pod else []
        extra += [f"node {self.node}"] if self.node else []
        return f"global rank {self.global_rank} ({', '.join([where, *extra])})"


@dataclass
class Trace:
    format: str
    signatures: SignatureTable = field(default_factory=SignatureTable)
    streams: dict[tuple[str, int], Stream] = field(default_factory=dict)
    communicators: dict[str, Communicator] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    ranks_with_data: set[int] = field(default_factory=set)
    #: Ranks whose input was read only in part (a large dump's newest entries; see
    #: `readers.fr_newest`): what they did before the part read is unknown.
    partial_ranks: set[int] = field(default_factory=set)
    #: When the capture ended, where that is known: the latest capture time given for a
    #: Flight Recorder dump, the end of the Megatrace logs; 0 when nothing says (copied
    #: dumps with no capture time).
    capture_end_ns: int = 0
    #: Per rank, when its dump was taken (see `readers.flight_recorder.capture_time`);
    #: ranks not listed use `capture_end_ns`.
    captured_ns: dict[int, int] = field(default_factory=dict)
    #: Where those times came from: "option", "sidecar", "mtime" (files written in place),
    #: "entries", "unknown" (sorted, unique).
    captured_from: list[str] = field(default_factory=list)
    #: The latest time any entry of any rank records (its creation, start or completion):
    #: the bound a wait is measured against when no capture time is known.
    last_event_ns: int = 0
    topology: Topology | None = None
    ras: list[RasCommunicator] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: NCCL RAS reports read (one may name no communicator at all).
    reports_read: int = 0
    #: The job's world size where the trace itself states it (a Flight Recorder pg_config
    #: listing the default group, or its all_gather sizes); None if it does not.
    world_size: int | None = None
    #: One more than the highest rank the input names (a world has at least this many).
    world_floor: int = 0

    def captured_at(self, rank: int) -> int | None:
        """When `rank`'s record was captured: its own dump's time, else the capture's end;
        None when nothing says (then only `last_event_ns` bounds its waits from below)."""
        return self.captured_ns.get(rank, self.capture_end_ns) or None

    def streams_of(self, comm: str) -> list[Stream]:
        members = self.communicators[comm].ranks
        return [self.streams[(comm, r)] for r in members if (comm, r) in self.streams]

    def events(self) -> Iterator[Event]:
        for stream in self.streams.values():
            for i in range(len(stream.seq)):
                sig = self.signatures[int(stream.signature[i])]
                yield Event(
                    rank=stream.rank,
                    comm=stream.comm,
                    seq=int(stream.seq[i]),
                    op=sig.op,
                    input_sizes=sig.input_sizes,
                    output_sizes=sig.output_sizes,
                    input_dtypes=sig.input_dtypes,
                    output_dtypes=sig.output_dtypes,
                    state=State(int(stream.state[i])),
                    time_ns=int(stream.time_ns[i]),
                    is_p2p=stream.is_p2p,
                )


def make_stream(
    rank: int,
    comm: str,
    seq: list[int],
    time_ns: list[int],
    signature: list[int],
    state: State,
    is_p2p: bool = False,
    states: list[int] | None = None,
    peers: list[int] | None = None,
) -> Stream:
    """A stream straight from column lists (sorted by seq); `states` overrides `state`."""
    seq_array = np.asarray(seq, dtype=np.int64)
    time_array = np.asarray(time_ns, dtype=np.int64)
    sig_array = np.asarray(signature, dtype=np.int64)
    state_array = (
        np.asarray(states, dtype=np.int8)
        if states is not None
        else np.full(len(seq_array), int(state), dtype=np.int8)
    )
    peer_array = np.asarray(peers, dtype=np.int64) if peers is not None else None
    if len(seq_array) > 1 and np.any(np.diff(seq_array) < 0):
        order = np.argsort(seq_array, kind="stable")
        seq_array, time_array, sig_array = seq_array[order], time_array[order], sig_array[order]
        state_array = state_array[order]
        peer_array = peer_array[order] if peer_array is not None else None
    return Stream(
        rank, comm, seq_array, time_array, sig_array, state_array, is_p2p, peer=peer_array
    )


def find_gaps(stream: Stream) -> list[Gap]:
    """Jumps of more than one in a stream's sequence numbers (repeats are coalesced ops)."""
    if len(stream.seq) < 2:
        return []
    diffs = np.diff(stream.seq)
    where = np.nonzero(diffs > 1)[0]
    return [
        Gap(stream.rank, stream.comm, int(stream.seq[i]), int(stream.seq[i + 1])) for i in where
    ]
