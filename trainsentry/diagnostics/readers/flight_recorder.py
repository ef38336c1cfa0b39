"""PyTorch Flight Recorder dumps (pickle or JSON, format versions 2.x up to 2.10).

One file per rank; the rank is the number at the end of the file name after a common
prefix (`nccl_trace_rank_12`, `rank_3.json`). Pickles are read with an unpickler that
refuses every global, so a dump can only ever build dicts, lists, tuples, strings and
numbers. Keys we do not know are ignored; keys older versions lack get defaults.

Notes on the format (checked against torch 2.13):
- `process_group` is `(pg_name, pg_desc)`; gloo dumps may carry a `pg_config` whose names do
  not match any entry (`{"": {"ranks": "[]"}}`, sometimes with a ranks list under the empty
  name), so membership falls back to the ranks that recorded the group. Those can be short of
  the group when a dump is missing, so the group's size is taken from its all_gathers /
  reduce_scatters (gloo records an all_gather's output as `[n, numel]`) or, for the world,
  the topology; where nothing tells, the membership is marked unknown (never guessed).
- p2p names (`send 0->1`, `recv 1<-0`) carry group ranks: the first number is the recording
  rank's own group rank, the second its peer's.
- gloo entries stay `state == "scheduled"`; `retired == True` is what marks completion.
- collectives are numbered by `collective_seq_id`, point-to-point ops by `p2p_seq_id`; ops
  of one coalesced group share a sequence number.
- `batch_isend_irecv` on NCCL (torch's test_c10d_nccl.py `test_batched_send_recv`): every op
  of the batch is recorded with the batch's `p2p_seq_id` and stays `scheduled` forever (those
  works are never enqueued); the batch's state is its closing `nccl:coalesced` entry, which
  ProcessGroupNCCL records with `is_p2p` false (`isP2POp(OpType::COALESCED)`) and the current
  `collective_seq_id`. That entry is read as the close of the p2p batch it follows (same
  `p2p_seq_id`), never as a collective, and gives every op of the batch its state.
- `pg_status` numbers works by their own counter (`isP2P ? seqP2P_ : seqCollective_`): after
  a send/recv or a batch, `last_enqueued_collective` is a p2p number (the real pipeline
  dumps: 36, the last `p2p_seq_id`, in a group with no collective at all). It is applied to a
  group's collectives only when the dump's last entry of that group is a collective.

One piece: the reader of one format. Decoding, the per-rank parse (its fast path and
`_parse_entry_slowly` must agree entry by entry), joining the ranks into one `Trace`, capture
times and the parallel read all apply the notes above, so a change of the format is made in
this one file.
"""

from __future__ import annotations

import ast
import bisect
import functools
import gc
import io
import json
import marshal
import operator
import os
import pickle
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from trainsentry.diagnostics.model import (
    P2P_OPS,
    Communicator,
    InputError,
    OpSignature,
    SignatureTable,
    State,
    Stream,
    Trace,
    find_gaps,
    make_stream,
)
from trainsentry.diagnostics.readers.fr_newest import NEWEST_BYTES, read_newest
from trainsentry.diagnostics.topology import Topology

_V = TypeVar("_V")
#: `<dump>.captured_at_ns`: when the dump beside it was taken (nanoseconds since the epoch).
CAPTURED_AT_SUFFIX = ".captured_at_ns"
#: What entries carry for a group created without `group_desc`.
_NO_DESC = frozenset({"", "undefined"})
SUPPORTED_MAJOR = 2
MAX_KNOWN_MINOR = 10
_RANK_SUFFIX = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_EXTENSIONS = (".json", ".pkl", ".pickle", ".bin")
_STATES: dict[Any, int] = {
    "scheduled": int(State.SCHEDULED),
    "started": int(State.STARTED),
    "completed": int(State.COMPLETED),
}


#: Group-local peer of a row that closes a p2p batch (an `nccl:coalesced` entry): its state
#: is the batch's; it names no peer and is not kept as an event.
_BATCH_CLOSE = -2


class FlightRecorderError(ValueError):
    pass


def _closes_p2p_batch(
    rows: list[tuple[int, int, int, int, bool, int]], op: str, is_p2p: Any, p2p_seq: Any
) -> bool:
    """Pure: whether an entry is the `nccl:coalesced` entry closing the p2p batch recorded
    just before it in its group (same `p2p_seq_id`; recorded with `is_p2p` false)."""
    return (
        op == "coalesced"
        and not is_p2p
        and bool(rows)
        and rows[-1][4]
        and rows[-1][5] != _BATCH_CLOSE
        and rows[-1][0] == p2p_seq
    )


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain containers only: any class, function or persistent id is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing persistent ids")


def load_plain_pickle(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


def decode_dump(data: bytes, source: str) -> dict[str, Any]:
    """Bytes of one dump file to its top-level dict (JSON or restricted pickle)."""
    stripped = data.lstrip()
    try:
        if stripped[:1] == b"{":
            dump = json.loads(data)
        elif data[:1] == b"\x80":
            dump = load_plain_pickle(data)
        else:
            raise FlightRecorderError("neither JSON nor pickle")
    except (
        ValueError,
        pickle.UnpicklingError,
        EOFError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        RecursionError,
        MemoryError,
        OverflowError,
    ) as exc:
        if isinstance(exc, FlightRecorderError):
            raise FlightRecorderError(f"{source}: {exc}") from exc
        raise FlightRecorderError(f"{source}: corrupt or truncated dump ({exc})") from exc
    if not isinstance(dump, dict):
        raise FlightRecorderError(f"{source}: top level is {type(dump).__name__}, not a dict")
    if "entries" not in dump and "version" in dump and "pg_status" in dump:
        dump["entries"] = []  # a recorder with nothing in it (gloo records no send/recv)
    if not isinstance(dump.get("entries"), list):
        raise FlightRecorderError(f"{source}: no 'entries' list (is this a Flight Recorder dump?)")
    return dump


def parse_version(value: Any) -> tuple[int, int]:
    text = str(value or "")
    m = re.match(r"^(\d+)\.(\d+)", text)
    if not m:
        raise FlightRecorderError(f"unknown version {value!r}")
    return int(m.group(1)), int(m.group(2))


def infer_rank_names(paths: list[Path]) -> dict[Path, int]:
    """Rank of each file from its name: the largest group of files sharing a prefix wins."""
    by_prefix: dict[str, dict[Path, int]] = {}
    for path in paths:
        name = path.name
        for ext in _EXTENSIONS:
            if name.endswith(ext):
                name = name[: -len(ext)]
                break
        m = _RANK_SUFFIX.match(name)
        if m:
            by_prefix.setdefault(m["prefix"], {})[path] = int(m["rank"])
    if not by_prefix:
        return {}
    best = max(by_prefix.values(), key=len)
    return best


@functools.lru_cache(maxsize=1024)
def _parse_rank_text(text: str) -> tuple[int, ...]:
    try:
        value = json.loads(text) if text.strip() else []
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return ()
    if isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
        return tuple(sorted(value))
    return ()


def _parse_ranks(value: Any) -> tuple[int, ...]:
    """pg_config ranks: a list, or (every dump since 2.x) its string form, often huge."""
    if isinstance(value, str):
        return _parse_rank_text(value)
    if isinstance(value, list | tuple) and all(isinstance(v, int) for v in value):
        return tuple(sorted(value))
    return ()


def _sizes(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list | tuple):
        return ()
    out = []
    for shape in value:
        if isinstance(shape, list | tuple):
            out.append(tuple(int(d) for d in shape))
    return tuple(out)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        return ()
    return tuple(str(v) for v in value)


def _op_and_peer(profiling_name: str) -> tuple[str, str | None]:
    name = profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name
    parts = name.split(" ", 1)
    return parts[0], (parts[1] if len(parts) == 2 else None)


def _p2p_locals(op: str, meta: str | None) -> tuple[int, int]:
    """(own group rank, peer group rank) from `send A->B` / `recv A<-B`; -1 where unknown."""
    arrow = "->" if op == "send" else "<-" if op == "recv" else None
    if meta is None or arrow is None or arrow not in meta:
        return -1, -1
    own, peer = meta.split(arrow, 1)
    try:
        return int(own), int(peer)
    except ValueError:
        return -1, -1


@dataclass
class PgColumns:
    """One rank's entries of one process group as rows
    (seq, time_ns, signature id, state, is_p2p, group-local peer)."""

    rows: list[tuple[int, int, int, int, bool, int]] = field(default_factory=list)

    def to_arrays(self) -> PgArrays:
        if not self.rows:
            empty = np.empty(0, dtype=np.int64)
            return PgArrays(empty, empty, empty, empty.astype(np.int8), empty.astype(bool), empty)
        seq, time_ns, signature, state, is_p2p, peer = zip(*self.rows, strict=True)
        return PgArrays(
            seq=np.asarray(seq, dtype=np.int64),
            time_ns=np.asarray(time_ns, dtype=np.int64),
            signature=np.asarray(signature, dtype=np.int64),
            state=np.asarray(state, dtype=np.int8),
            is_p2p=np.asarray(is_p2p, dtype=bool),
            peer_local=np.asarray(peer, dtype=np.int64),
        )


@dataclass
class PgArrays:
    """The same columns frozen into numpy arrays (cheap to keep and to send between processes)."""

    seq: np.ndarray
    time_ns: np.ndarray
    signature: np.ndarray
    state: np.ndarray
    is_p2p: np.ndarray
    peer_local: np.ndarray


@dataclass
class RankDump:
    """What one rank's file contributes, before ranks are joined."""

    rank: int
    path: str
    version: tuple[int, int]
    by_pg: dict[str, PgArrays]
    pg_desc: dict[str, str]
    pg_ranks: dict[str, tuple[int, ...]]
    last_enqueued: dict[str, int]
    latest_ns: int
    index: int = -1  # position in the caller's input list
    #: One more than the highest rank any pg_config list names (named group or not): the
    #: world has at least this many ranks. (Not the ranks themselves: every dump lists the
    #: whole world, and N copies of an N-rank list are N^2.)
    listed_floor: int = 0
    #: This rank's own group rank per group, as its p2p entries state it.
    own_local: dict[str, int] = field(default_factory=dict)
    #: `pg_status.last_started_collective` per group (-1: not recorded; only NCCL with
    #: TORCH_NCCL_ENABLE_TIMING=1 records it).
    last_started: dict[str, int] = field(default_factory=dict)
    #: When the dump was taken (the caller's, a sidecar's or the file's time); 0 unknown.
    captured_ns: int = 0
    #: Bytes of older entries not read (only the newest were, see `readers.fr_newest`);
    #: 0 when every entry was read.
    skipped_bytes: int = 0


class SignatureCache:
    """Shared across files: the raw text of an entry's op and shapes -> signature id."""

    def __init__(self, table: SignatureTable) -> None:
        self.table = table
        self.ids: dict[str, int] = {}
        self.names: dict[str, tuple[str, int, int]] = {}
        #: marshal (or repr) of (profiling_name, sizes, dtypes)
        #: -> (signature id, peer's group rank, own group rank)
        self.by_raw: dict[bytes | str, tuple[int, int, int]] = {}

    def name(self, profiling_name: str) -> tuple[str, int, int]:
        """(op, peer's group rank, own group rank); the ranks are -1 unless p2p."""
        found = self.names.get(profiling_name)
        if found is None:
            op, meta = _op_and_peer(profiling_name)
            own, peer = _p2p_locals(op, meta)
            found = self.names[profiling_name] = (op, peer, own)
        return found

    def signature(self, entry: dict[str, Any], op: str) -> int:
        key = repr(
            (
                op,
                entry.get("input_sizes"),
                entry.get("output_sizes"),
                entry.get("input_dtypes"),
                entry.get("output_dtypes"),
            )
        )
        found = self.ids.get(key)
        if found is None:
            sig = OpSignature(
                op,
                _sizes(entry.get("input_sizes")),
                _sizes(entry.get("output_sizes")),
                _strings(entry.get("input_dtypes")),
                _strings(entry.get("output_dtypes")),
            )
            found = self.ids[key] = self.table.intern(sig)
        return found


_FAST_FIELDS = operator.itemgetter(
    "process_group",
    "profiling_name",
    "is_p2p",
    "collective_seq_id",
    "p2p_seq_id",
    "time_created_ns",
    "state",
    "retired",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "output_dtypes",
)


def _parse_entry_slowly(
    entry: Any,
    source: str,
    cache: SignatureCache,
    by_pg: dict[str, PgColumns],
    pg_desc: dict[str, str],
    pg_id_to_name: dict[str, str],
    own_local: dict[str, int],
) -> None:
    """Any entry the fast path cannot take: older versions, missing or odd fields."""
    if not isinstance(entry, dict):
        raise FlightRecorderError(f"{source}: entry is {type(entry).__name__}, not a dict")
    pg = entry.get("process_group") or ("", "")
    pg_name = str(pg[0])
    columns = by_pg.get(pg_name)
    if columns is None:
        columns = by_pg[pg_name] = PgColumns()
        pg_desc[pg_name] = str(pg[1]) if len(pg) > 1 else ""
        if "pg_id" in entry:
            pg_id_to_name[str(entry["pg_id"])] = pg_name
    op, peer, own = cache.name(str(entry.get("profiling_name", "")))
    is_p2p = entry.get("is_p2p")
    if is_p2p is None:
        is_p2p = op in P2P_OPS
    if _closes_p2p_batch(columns.rows, op, is_p2p, entry.get("p2p_seq_id")):
        is_p2p, peer = True, _BATCH_CLOSE
    if is_p2p and own >= 0:
        own_local[pg_name] = own
    seq = entry.get("p2p_seq_id" if is_p2p else "collective_seq_id")
    if seq is None:  # version 2.0/2.1 had one counter
        seq = entry.get("seq_id")
    if not isinstance(seq, int):
        raise FlightRecorderError(f"{source}: entry without a sequence number")
    created = entry.get("time_created_ns")
    state = (
        State.COMPLETED
        if entry.get("retired") is True
        else _STATES.get(str(entry.get("state")), State.SCHEDULED)
    )
    columns.rows.append(
        (
            seq,
            created if isinstance(created, int) else 0,
            cache.signature(entry, op),
            int(state),
            bool(is_p2p),
            peer,
        )
    )


def parse_rank_dump(
    dump: dict[str, Any], rank: int, source: str, cache: SignatureCache | None = None
) -> RankDump:
    """One rank's decoded dump as columns per process group (`RankDump`), its signatures
    interned in `cache`; `join_dumps` joins the ranks' into a `Trace`.

    One piece: the per-entry loop is the reader's hot path (1,024 ranks x 2,000 entries in
    bench/bench_analyze.py); it binds what it reads to locals and calls helpers only on rare
    paths (a new signature, a p2p batch's close, an odd entry), so its steps stay inline.
    `_parse_entry_slowly` is the readable twin it must agree with entry by entry.
    """
    version = parse_version(dump.get("version", "2.0"))
    if version[0] != SUPPORTED_MAJOR:
        raise FlightRecorderError(f"{source}: unsupported Flight Recorder version {version}")
    cache = cache if cache is not None else SignatureCache(SignatureTable())
    by_pg: dict[str, PgColumns] = {}
    pg_desc: dict[str, str] = {}
    pg_id_to_name: dict[str, str] = {}
    own_local: dict[str, int] = {}
    states = _STATES
    completed = int(State.COMPLETED)
    scheduled = int(State.SCHEDULED)
    entries = dump["entries"]
    fast = _FAST_FIELDS
    dumps = marshal.dumps
    known = cache.by_raw
    last_name: Any = None
    rows: list[tuple[int, int, int, int, bool, int]] = []
    for entry in entries:
        try:
            (
                pg,
                profiling_name,
                is_p2p,
                collective_seq,
                p2p_seq,
                created,
                state,
                retired,
                inputs,
                outputs,
                in_dtypes,
                out_dtypes,
            ) = fast(entry)
        except (KeyError, TypeError):
            _parse_entry_slowly(entry, source, cache, by_pg, pg_desc, pg_id_to_name, own_local)
            last_name = None
            continue
        if pg[0] != last_name:
            last_name = pg[0]
            columns = by_pg.get(str(last_name))
            if columns is None:
                pg_name = str(last_name)
                columns = by_pg[pg_name] = PgColumns()
                pg_desc[pg_name] = str(pg[1]) if len(pg) > 1 else ""
                pg_id_to_name[str(entry.get("pg_id"))] = pg_name
            rows = columns.rows
        seq = p2p_seq if is_p2p else collective_seq
        if seq.__class__ is not int:
            _parse_entry_slowly(entry, source, cache, by_pg, pg_desc, pg_id_to_name, own_local)
            last_name = None
            continue
        try:  # marshal is an exact, 3x cheaper key than repr for these plain values
            raw: bytes | str = dumps((profiling_name, inputs, outputs, in_dtypes, out_dtypes))
        except ValueError:
            raw = repr((profiling_name, inputs, outputs, in_dtypes, out_dtypes))
        found = known.get(raw)
        if found is None:
            op, peer, own = cache.name(str(profiling_name))
            found = known[raw] = (cache.signature(entry, op), peer, own)
        peer = found[1]
        if (
            not is_p2p
            and rows
            and rows[-1][4]
            and _closes_p2p_batch(rows, cache.name(str(profiling_name))[0], is_p2p, p2p_seq)
        ):
            seq, is_p2p, peer = p2p_seq, True, _BATCH_CLOSE
        if is_p2p and found[2] >= 0:
            own_local[str(last_name)] = found[2]
        rows.append(
            (
                seq,
                created or 0,
                found[0],
                completed if retired is True else states.get(state, scheduled),
                bool(is_p2p),
                peer,
            )
        )
    latest = _latest_ns(by_pg, entries)
    pg_ranks, listed = _read_pg_config(dump.get("pg_config"), pg_desc)
    last_enqueued, last_started = _pg_status(dump.get("pg_status"), by_pg, pg_id_to_name)
    for name, columns in by_pg.items():
        if columns.rows and columns.rows[-1][4]:  # pg_status counts p2p works then
            last_enqueued.pop(name, None)
            last_started.pop(name, None)
    arrays = {name: columns.to_arrays() for name, columns in by_pg.items()}
    return RankDump(
        rank,
        source,
        version,
        arrays,
        pg_desc,
        pg_ranks,
        last_enqueued,
        latest,
        listed_floor=listed,
        own_local=own_local,
        last_started=last_started,
    )


def _status_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _pg_status(
    status: Any, by_pg: dict[str, PgColumns], pg_id_to_name: dict[str, str]
) -> tuple[dict[str, int], dict[str, int]]:
    """(last enqueued, last started) per group name from `pg_status`.

    Pure. torch keys `pg_status` by the rank's local `pg_id` (the order this process created
    its groups), while entries name the group by its global name: with `new_group` groups
    (TP pairs, DP groups) id "2" is often another group than the one named "2". The id is
    mapped through the entries' own `pg_id`; a key no entry maps (that group's entries left
    the ring buffer) is dropped rather than guessed. Only dumps whose entries carry no
    `pg_id` at all (before 2.2) are matched by name.
    """
    enqueued: dict[str, int] = {}
    started: dict[str, int] = {}
    if not isinstance(status, dict):
        return enqueued, started
    ids_known = any(key != "None" for key in pg_id_to_name)
    for key, value in status.items():
        if not isinstance(value, dict):
            continue
        name = pg_id_to_name.get(str(key)) if ids_known else str(key)
        if name is None or (not ids_known and name not in by_pg):
            continue
        enqueued[name] = _status_int(value.get("last_enqueued_collective", -1))
        started[name] = _status_int(value.get("last_started_collective", -1))
    return enqueued, started


def _coalesced_signature(table: SignatureTable, ids: list[int]) -> int:
    parts = tuple(table[i] for i in ids if table[i].op != "coalesced")
    return table.intern(OpSignature("coalesced", parts=parts))


def _build_stream(
    rank: int,
    comm_id: str,
    columns: PgArrays,
    picks: np.ndarray,
    is_p2p: bool,
    peer_lookup: np.ndarray | None,
    table: SignatureTable,
    last_enqueued: int,
) -> Stream:
    """`peer_lookup[group rank]` is the global rank (-1: unknown); None: they are equal."""
    seq = columns.seq[picks]
    sigs = columns.signature[picks]
    states = columns.state[picks]
    times = columns.time_ns[picks]
    if not is_p2p and len(np.unique(seq)) != len(seq):
        # A coalesced group: entries sharing one sequence number become one event.
        merged: dict[int, list[int]] = {}
        for i, value in enumerate(seq.tolist()):
            merged.setdefault(value, []).append(i)
        firsts = [group[0] for group in merged.values()]
        sigs = np.asarray(
            [
                int(sigs[g[0]])
                if len(g) == 1
                else _coalesced_signature(table, [int(sigs[i]) for i in g])
                for g in merged.values()
            ],
            dtype=np.int64,
        )
        states = np.asarray(
            [min(int(states[i]) for i in g) for g in merged.values()], dtype=np.int8
        )
        times = times[firsts]
        seq = np.asarray(list(merged), dtype=np.int64)
    peers = None
    if is_p2p:
        local = columns.peer_local[picks]
        closes = local == _BATCH_CLOSE
        if closes.any():
            # A batch's ops stay `scheduled`: each takes the state of the entry closing it.
            state_of = dict(zip(seq[closes].tolist(), states[closes].tolist(), strict=True))
            states = np.asarray(
                [state_of.get(s, st) for s, st in zip(seq.tolist(), states.tolist(), strict=True)],
                dtype=np.int8,
            )
            keep = ~closes
            seq, sigs, states, times, local = (
                seq[keep],
                sigs[keep],
                states[keep],
                times[keep],
                local[keep],
            )
        if peer_lookup is None:
            peers = np.where(local >= 0, local, -1).tolist()
        elif len(peer_lookup):
            valid = (local >= 0) & (local < len(peer_lookup))
            found = peer_lookup[np.clip(local, 0, len(peer_lookup) - 1)]
            peers = np.where(valid, found, -1).tolist()
        else:
            peers = [-1] * len(local)
    stream = make_stream(
        rank,
        comm_id,
        seq.tolist(),
        times.tolist(),
        sigs.tolist(),
        State.SCHEDULED,
        is_p2p,
        states=states.tolist(),
        peers=peers,
    )
    stream.last_enqueued = last_enqueued
    return stream


def _size_hints(dumps: list[RankDump], table: SignatureTable) -> dict[str, int]:
    """Per group, the size its all_gathers / reduce_scatters state, by majority of ranks
    (a tie says nothing: a size mismatch on half the ranks must not pick the size)."""
    implied: dict[int, int | None] = {}
    votes: dict[str, Counter[int]] = {}
    for d in dumps:
        for pg, columns in d.by_pg.items():
            sizes = set()
            for sig_id in np.unique(columns.signature[~columns.is_p2p]).tolist():
                if sig_id not in implied:
                    implied[sig_id] = table[sig_id].implied_group_size()
                size = implied[sig_id]
                if size is not None:
                    sizes.add(size)
            if len(sizes) == 1:  # one rank stating two sizes is no witness
                votes.setdefault(pg, Counter())[sizes.pop()] += 1
    hints = {}
    for pg, counter in votes.items():
        ranked = counter.most_common(2)
        if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
            hints[pg] = ranked[0][0]
    return hints


def _membership(
    pg: str,
    seen: set[int],
    declared_ranks: tuple[int, ...] | None,
    desc: str,
    hint: int | None,
    world_floor: int,
    topology: Topology | None,
) -> Communicator:
    """Who is in a group: pg_config if it lists the group, else what can be proven."""
    if declared_ranks is not None and seen <= set(declared_ranks):
        return Communicator(pg, declared_ranks, desc, True)
    if desc == "default_pg":
        # The world: every rank a file is named after or a pg_config list mentions is in it;
        # its size comes from the world's gathers or the topology, else it is unknown.
        floor = max(world_floor, max(seen) + 1)
        size = hint if hint is not None else topology.world_size if topology else None
        if size is not None and size >= floor:
            return Communicator(pg, tuple(range(size)), desc, True)
        return Communicator(pg, tuple(range(floor)), desc, False, unidentified=None)
    ranks = tuple(sorted(seen))
    unidentified = None if hint is None else max(0, hint - len(ranks))
    return Communicator(pg, ranks, desc, False, unidentified)


def _peer_lookup(comm: Communicator, own: dict[int, int]) -> np.ndarray | None:
    """Group rank -> global rank for p2p peers (None: the same, as in the world group).

    Without a known membership only what ranks say of themselves (`own`: group rank ->
    global rank, from their own p2p entries) is used: position in the ranks that happen to
    have dumps would shift past a missing one and name the wrong rank.
    """
    if comm.desc == "default_pg":
        return None
    if comm.membership_known:
        return np.asarray(comm.ranks, dtype=np.int64)
    lookup = np.full(max(own, default=-1) + 1, -1, dtype=np.int64)
    for local, global_rank in own.items():
        lookup[local] = global_rank
    return lookup


def _span(ranks: tuple[int, ...]) -> str:
    """Pure: 0,1,2,3,8 -> "0-3,8"."""
    parts: list[str] = []
    for rank in ranks:
        if parts and rank == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-', 1)[0]}-{rank}"
        else:
            parts.append(str(rank))
    return ",".join(parts)


def _holds(ranks: tuple[int, ...], rank: int) -> bool:
    """Pure: whether a sorted rank tuple holds `rank` (a world list is 16,384 long)."""
    i = bisect.bisect_left(ranks, rank)
    return i < len(ranks) and ranks[i] == rank


def _share_rank_lists(dumps: list[RankDump]) -> None:
    """Make equal pg_config rank tuples one object across dumps (each worker process sends
    its own copy back): one world list in memory, not one per dump."""
    by_object: dict[int, tuple[int, ...]] = {}
    canonical: dict[tuple[int, int, int], list[tuple[int, ...]]] = {}
    for d in dumps:
        for name, ranks in d.pg_ranks.items():
            shared = by_object.get(id(ranks))
            if shared is None:
                key = (len(ranks), ranks[0] if ranks else -1, ranks[-1] if ranks else -1)
                bucket = canonical.setdefault(key, [])
                shared = next((r for r in bucket if r == ranks), None)
                if shared is None:
                    bucket.append(ranks)
                    shared = ranks
                by_object[id(ranks)] = shared
            d.pg_ranks[name] = shared


def _renamed(table: dict[str, _V], renames: dict[str, str]) -> dict[str, _V]:
    return {renames.get(key, key): value for key, value in table.items()}


def _split_groups_apart(dumps: list[RankDump]) -> list[str]:
    """Give groups that share a name but not their members (`split_group` names every
    split by one counter: {0,1} and {2,3} are both "1") an id of their own,
    `name{members}`, in every per-group table of the dumps; returns notes.

    A group is (name, membership): the membership is the one the rank's own pg_config
    declares for that name. A rank that declares none joins the one declared membership
    that contains it; if none does, it stays under the bare name, and a note says the
    groups could not all be told apart.
    """
    _share_rank_lists(dumps)
    # Keyed by object: equal lists are one object now, and hashing a world list per dump
    # would cost N^2.
    memberships: dict[str, dict[int, tuple[int, ...]]] = {}
    for d in dumps:
        for name, ranks in d.pg_ranks.items():
            if _holds(ranks, d.rank):
                memberships.setdefault(name, {})[id(ranks)] = ranks
    split = {name: set(sets.values()) for name, sets in memberships.items() if len(sets) > 1}
    if not split:
        return []
    notes = []
    for d in dumps:
        renames: dict[str, str] = {}
        for name, sets in split.items():
            own = d.pg_ranks.get(name)
            if own is None or not _holds(own, d.rank):
                holding = [m for m in sets if d.rank in m]
                own = holding[0] if len(holding) == 1 else None
            if own is not None:
                renames[name] = f"{name}{{{_span(own)}}}"
            elif name in d.by_pg:
                notes.append(
                    f"rank {d.rank}: group {name!r} has several memberships and this rank's "
                    "dump declares none of them; its entries stay under the bare name"
                )
        d.by_pg = _renamed(d.by_pg, renames)
        d.pg_desc = _renamed(d.pg_desc, renames)
        d.pg_ranks = _renamed(d.pg_ranks, renames)
        d.last_enqueued = _renamed(d.last_enqueued, renames)
        d.last_started = _renamed(d.last_started, renames)
        d.own_local = _renamed(d.own_local, renames)
    return notes


def _latest_ns(by_pg: dict[str, PgColumns], entries: list[Any]) -> int:
    """Pure: the dump's latest event time: the newest entry created, or an entry discovered
    completed or started later (only the last 32 entries can be)."""
    latest = 0
    for columns in by_pg.values():
        if columns.rows:
            latest = max(latest, max(row[1] for row in columns.rows))
    for entry in entries[-32:]:
        for key in ("time_discovered_completed_ns", "time_discovered_started_ns"):
            t = entry.get(key)
            if isinstance(t, int) and t > latest:
                latest = t
    return latest


def _read_pg_config(config: Any, pg_desc: dict[str, str]) -> tuple[dict[str, tuple[int, ...]], int]:
    """The ranks `pg_config` declares per group, and one more than the highest rank it
    lists (0: none); a group whose entries carry no description takes pg_config's into
    `pg_desc`. The rank tuples are shared between dumps with the same list (see
    `_parse_rank_text`)."""
    pg_ranks: dict[str, tuple[int, ...]] = {}
    listed = 0
    if not isinstance(config, dict):
        return pg_ranks, listed
    for key, value in config.items():
        if not isinstance(value, dict):
            continue
        name = str(value.get("name") or key)
        ranks = _parse_ranks(value.get("ranks"))
        if ranks and ranks[-1] >= 0:  # sorted
            listed = max(listed, ranks[-1] + 1)
        if name and ranks:
            pg_ranks[name] = ranks
        desc = value.get("desc")
        if name and isinstance(desc, str) and desc and pg_desc.get(name) in _NO_DESC:
            pg_desc[name] = desc  # entries without a description: pg_config's
    return pg_ranks, listed


@dataclass
class _Membership:
    """What the dumps say of each process group (`join_dumps`' first step): the ranks that
    recorded it, the ranks its `pg_config` declares (from a member's own dump), its
    description, each member's own group rank (local -> global), and every rank named."""

    members: dict[str, set[int]] = field(default_factory=dict)
    declared: dict[str, tuple[int, ...]] = field(default_factory=dict)
    descs: dict[str, str] = field(default_factory=dict)
    own_ranks: dict[str, dict[int, int]] = field(default_factory=dict)
    #: One more than the highest rank anything names (file names, dumps, pg_config lists).
    known_floor: int = 0


def join_dumps(dumps: list[RankDump], trace: Trace, named_ranks: set[int] | None = None) -> Trace:
    """Join per-rank dumps into communicators and streams.

    `named_ranks` are ranks known from file names whose dumps could not be read: the world
    has them even though they contribute no data. `trace.topology`, if set, gives the world
    size when the dumps do not.
    """
    trace.notes.extend(_split_groups_apart(dumps))
    membership = _read_membership(dumps, trace, named_ranks or set())
    _add_communicators(dumps, trace, membership)
    lookups = {
        pg: _peer_lookup(comm, membership.own_ranks.get(pg, {}))
        for pg, comm in trace.communicators.items()
    }
    unmapped: dict[str, set[int]] = {}
    for d in dumps:
        _add_streams(d, trace, lookups, unmapped)
    for comm_id, locals_ in sorted(unmapped.items()):
        trace.notes.append(
            f"{comm_id}: p2p peer group rank(s) {sorted(locals_)[:8]} not mapped to global ranks: "
            "the group's membership is unknown (no usable pg_config, and those ranks' own "
            "entries are missing), so those waits name no peer"
        )
    return trace


def _read_membership(dumps: list[RankDump], trace: Trace, named_ranks: set[int]) -> _Membership:
    """Each group's members as the dumps tell them; the trace learns which ranks have data and
    when each dump was captured."""
    found = _Membership(known_floor=max(named_ranks, default=-1) + 1)
    for d in dumps:
        trace.ranks_with_data.add(d.rank)
        if d.skipped_bytes:
            trace.partial_ranks.add(d.rank)
        trace.last_event_ns = max(trace.last_event_ns, d.latest_ns)
        if d.captured_ns:
            trace.captured_ns[d.rank] = d.captured_ns
            trace.capture_end_ns = max(trace.capture_end_ns, d.captured_ns)
        found.known_floor = max(found.known_floor, d.rank + 1, d.listed_floor)
        for pg in d.by_pg:
            found.members.setdefault(pg, set()).add(d.rank)
            found.descs.setdefault(pg, d.pg_desc.get(pg, ""))
        for pg, ranks in d.pg_ranks.items():
            if _holds(ranks, d.rank):
                found.declared.setdefault(pg, ranks)
                found.members.setdefault(pg, set()).add(d.rank)
        for pg, local in d.own_local.items():
            found.own_ranks.setdefault(pg, {}).setdefault(local, d.rank)
    return found


def _add_communicators(dumps: list[RankDump], trace: Trace, membership: _Membership) -> None:
    """One `Communicator` per group, and the world's size when the default group tells it."""
    world_floor = membership.known_floor
    hints = _size_hints(dumps, trace.signatures)
    trace.world_floor = world_floor
    declared, descs = membership.declared, membership.descs
    for pg in membership.members:
        if descs.get(pg) == "default_pg":
            trace.world_size = len(declared[pg]) if pg in declared else hints.get(pg)
    for pg, seen in membership.members.items():
        trace.communicators[pg] = _membership(
            pg,
            seen,
            declared.get(pg),
            descs.get(pg, ""),
            hints.get(pg),
            world_floor,
            trace.topology,
        )


def _add_streams(
    d: RankDump,
    trace: Trace,
    lookups: dict[str, np.ndarray | None],
    unmapped: dict[str, set[int]],
) -> None:
    """One rank's streams: per group its collectives, its point-to-point ops (a `{pg}/p2p`
    communicator of the group's ranks) and, for a group with work enqueued but nothing
    recorded, an empty stream that keeps its last enqueued number. Peers a p2p op names that
    no global rank is known for are added to `unmapped`."""
    table: SignatureTable = trace.signatures
    for pg, columns in d.by_pg.items():
        collective_picks = np.nonzero(~columns.is_p2p)[0]
        p2p_picks = np.nonzero(columns.is_p2p)[0]
        if len(collective_picks):
            stream = _build_stream(
                d.rank,
                pg,
                columns,
                collective_picks,
                False,
                None,
                table,
                d.last_enqueued.get(pg, -1),
            )
            stream.last_started = d.last_started.get(pg, -1)
            trace.streams[(pg, d.rank)] = stream
            trace.gaps.extend(find_gaps(stream))
        if len(p2p_picks):
            comm_id = f"{pg}/p2p"
            if comm_id not in trace.communicators:
                base = trace.communicators[pg]
                trace.communicators[comm_id] = Communicator(
                    comm_id, base.ranks, base.desc, base.declared, base.unidentified
                )
            lookup = lookups[pg]
            stream = _build_stream(d.rank, comm_id, columns, p2p_picks, True, lookup, table, -1)
            trace.streams[(comm_id, d.rank)] = stream
            if lookup is not None and not trace.communicators[pg].membership_known:
                lost = {
                    local
                    for local in np.unique(columns.peer_local[p2p_picks]).tolist()
                    if local >= 0 and (local >= len(lookup) or lookup[local] < 0)
                }
                if lost:
                    unmapped.setdefault(comm_id, set()).update(lost)
    for pg, last in d.last_enqueued.items():
        if pg in trace.communicators and (pg, d.rank) not in trace.streams and last > 0:
            empty = make_stream(d.rank, pg, [], [], [], State.SCHEDULED)
            empty.last_enqueued = last
            trace.streams[(pg, d.rank)] = empty


def looks_like_flight_recorder(head: bytes) -> bool:
    stripped = head.lstrip()
    if stripped[:1] == b"{":
        return b'"entries"' in head or b'"pg_config"' in head or b'"version"' in head
    return head[:1] == b"\x80" and (
        b"entries" in head or b"pg_config" in head or b"version" in head
    )


#: Up to this much input in all, every entry of every dump is read (see
#: `read_flight_recorder`'s `newest_bytes`).
FULL_READ_MAX_BYTES = 512 * 2**20
PARALLEL_MIN_FILES = 64
PARALLEL_MIN_BYTES = 32 * 2**20
_CHUNKS_PER_WORKER = 4


@dataclass
class _ChunkResult:
    dumps: list[RankDump]
    signatures: list[OpSignature]
    errors: list[tuple[int, str]]  # (index in the input list, message)
    notes: list[str]
    done: int
    sources: set[str] = field(default_factory=set)


def capture_time(
    path: Path, given_ns: int | None = None, in_place: bool = False
) -> tuple[int, str]:
    """(when the dump at `path` was taken, where that came from); (0, "unknown") if nothing
    says.

    The caller's time (`--captured-at`, "option") wins; then a sidecar file
    `<dump>.captured_at_ns` holding nanoseconds since the epoch ("sidecar", written by
    whatever fetched the dump); then, only when the caller says the files are where the job
    (or the probe's collector) wrote them, the file's mtime ("mtime"). A copied file's mtime
    is the time of the copy (`kubectl cp`, `scp`, an archive), and torch's dumps carry no time
    of their own. Never the clock of the analysis: a dump analysed an hour later must not
    have waited an hour longer.
    """
    if given_ns is not None:
        return given_ns, "option"
    sidecar = path.with_name(path.name + CAPTURED_AT_SUFFIX)
    try:
        text = sidecar.read_text(encoding="ascii").strip()
        if text.isdigit():
            return int(text), "sidecar"
    except (OSError, UnicodeDecodeError):
        pass
    if in_place:
        return os.stat(path).st_mtime_ns, "mtime"
    return 0, "unknown"


def _read_one(
    path: Path,
    rank: int,
    cache: SignatureCache,
    captured_at_ns: int | None = None,
    in_place: bool = False,
    newest_bytes: int = 0,
) -> tuple[RankDump, str]:
    newest = read_newest(str(path), newest_bytes) if newest_bytes > 0 else None
    if newest is not None:
        decoded, skipped = newest
    else:
        decoded, skipped = decode_dump(path.read_bytes(), str(path)), 0
    try:
        dump = parse_rank_dump(decoded, rank, str(path), cache)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        # OverflowError: a number past int64 (an entry's time, say) meets numpy.
        if isinstance(exc, FlightRecorderError):
            raise
        raise FlightRecorderError(f"{path}: unexpected entry structure ({exc!r})") from exc
    dump.skipped_bytes = skipped
    dump.captured_ns, source = capture_time(path, captured_at_ns, in_place)
    # An entry later than the stated capture time (a clock ahead) still bounds it.
    if dump.captured_ns and dump.latest_ns > dump.captured_ns:
        dump.captured_ns, source = dump.latest_ns, "entries"
    return dump, source


def _read_chunk(
    items: list[tuple[int, str, int]],
    on_file: Callable[[], None] | None = None,
    captured_at_ns: int | None = None,
    in_place: bool = False,
    newest_bytes: int = 0,
) -> _ChunkResult:
    """Read (index, path, rank) items with a private signature table (runs in workers too)."""
    # Dumps are millions of small containers that die by refcount right after parsing;
    # letting the cyclic GC rescan them every few thousand allocations costs ~40 %.
    was_enabled = gc.isenabled()
    gc.disable()
    table = SignatureTable()
    cache = SignatureCache(table)
    result = _ChunkResult([], [], [], [], 0)
    try:
        for index, name, rank in items:
            path = Path(name)
            try:
                dump, source = _read_one(path, rank, cache, captured_at_ns, in_place, newest_bytes)
                dump.index = index
                result.dumps.append(dump)
                result.sources.add(source)
                if dump.version[1] > MAX_KNOWN_MINOR:
                    result.notes.append(
                        f"{path}: version {dump.version[0]}.{dump.version[1]} is newer than "
                        f"{SUPPORTED_MAJOR}.{MAX_KNOWN_MINOR}; read anyway"
                    )
            except (OSError, FlightRecorderError) as exc:
                result.errors.append((index, str(exc)))
            result.done += 1
            if on_file is not None:
                on_file()
    finally:
        if was_enabled:
            gc.enable()
    result.signatures = [table[i] for i in range(len(table))]
    return result


def _total_bytes(paths: list[Path]) -> int | None:
    try:
        return sum(p.stat().st_size for p in paths)
    except OSError:
        return None


def _worker_count(files: int, total: int | None, requested: int | None) -> int:
    """Pure but for the CPU count: processes for `files` dumps of `total` bytes."""
    if requested is not None:
        return max(1, requested)
    if files < PARALLEL_MIN_FILES or total is None or total < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def _read_in_workers(
    items: list[tuple[int, str, int]],
    count: int,
    on_file: Callable[[], None] | None,
    captured_at_ns: int | None = None,
    in_place: bool = False,
    newest_bytes: int = 0,
) -> list[_ChunkResult]:
    """Fork workers (only from a single-threaded caller: forking a threaded server is unsafe,
    and spawn would re-import the caller's __main__)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    size = max(1, -(-len(items) // (count * _CHUNKS_PER_WORKER)))
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    results: list[_ChunkResult] = []
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
            for future in as_completed(
                [
                    pool.submit(_read_chunk, chunk, None, captured_at_ns, in_place, newest_bytes)
                    for chunk in chunks
                ]
            ):
                result = future.result()
                results.append(result)
                if on_file is not None:
                    for _ in range(result.done):
                        on_file()
    except (BrokenProcessPool, OSError):
        done = {index for result in results for index in _indices(result)}
        rest = [item for item in items if item[0] not in done]
        results.append(_read_chunk(rest, on_file, captured_at_ns, in_place, newest_bytes))
    return results


def _indices(result: _ChunkResult) -> set[int]:
    return {index for index, _ in result.errors} | {d.index for d in result.dumps}


def read_flight_recorder(
    paths: list[Path],
    on_file: Callable[[], None] | None = None,
    workers: int | None = None,
    topology: Topology | None = None,
    captured_at_ns: int | None = None,
    in_place: bool = False,
    newest_bytes: int | None = None,
) -> Trace:
    """Read one dump per rank; a bad file becomes an `InputError`, the others are analysed.

    Capture times: see `capture_time` (`in_place`: the files' mtimes are when they were
    taken).

    `newest_bytes`: read only about that many bytes of each JSON dump's newest entries
    (`readers.fr_newest`); 0 reads every entry; None (default) reads every entry while the
    input is at most `FULL_READ_MAX_BYTES` in all, and the newest `NEWEST_BYTES` of each
    dump above that. Ranks read in part are `Trace.partial_ranks`, and a note says so.

    Large inputs are parsed in `workers` processes (default: one per CPU, up to 8, from 64
    files and 32 MB on); each returns numpy columns and its own signature table, which we
    merge here.
    """
    trace = Trace(format="fr", topology=topology)
    ranks = infer_rank_names(paths)
    seen_ranks: dict[int, str] = {}
    items: list[tuple[int, str, int]] = []
    messages: dict[int, str] = {}
    for index, path in enumerate(paths):
        trace.inputs.append(str(path))
        rank = ranks.get(path)
        if rank is None:
            messages[index] = (
                f"{path}: cannot tell the rank from the file name (a Flight Recorder dump is "
                "one file per rank with the rank at the end of its name, e.g. "
                "nccl_trace_rank_3)"
            )
        elif rank in seen_ranks:
            messages[index] = f"{path}: rank {rank} already read from {seen_ranks[rank]}"
        else:
            seen_ranks[rank] = str(path)
            items.append((index, str(path), rank))
            continue
        if on_file is not None:
            on_file()
    sizes = _total_bytes([Path(p) for _, p, _ in items])
    count = _worker_count(len(items), sizes, workers)
    window = newest_bytes
    if window is None:
        window = NEWEST_BYTES if sizes is not None and sizes > FULL_READ_MAX_BYTES else 0
    results: list[_ChunkResult] = []
    if count > 1 and threading.active_count() == 1:
        results = _read_in_workers(items, count, on_file, captured_at_ns, in_place, window)
    else:
        results.append(_read_chunk(items, on_file, captured_at_ns, in_place, window))
    dumps: list[RankDump] = []
    sources: set[str] = set()
    for chunk_result in results:
        remap = np.asarray(
            [trace.signatures.intern(sig) for sig in chunk_result.signatures] or [0], dtype=np.int64
        )
        for dump in chunk_result.dumps:
            for columns in dump.by_pg.values():
                columns.signature = remap[columns.signature]
            dumps.append(dump)
        messages.update(dict(chunk_result.errors))
        sources.update(chunk_result.sources)
        trace.notes.extend(chunk_result.notes)
    for index in sorted(messages):
        trace.errors.append(InputError(str(paths[index]), messages[index]))
    dumps.sort(key=lambda d: d.rank)
    trace.captured_from = sorted(sources)
    join_dumps(dumps, trace, set(seen_ranks))
    if trace.partial_ranks:
        trace.notes.append(_partial_note(dumps, len(trace.partial_ranks), window))
    return trace


def _partial_note(dumps: list[RankDump], partial: int, window: int) -> str:
    """Pure: what reading only the newest entries left out."""
    skipped = sum(d.skipped_bytes for d in dumps)
    return (
        f"{partial} of {len(dumps)} dumps read in part: only the newest "
        f"~{window // 1024} KiB of entries of each ({skipped / 2**20:.0f} MB of older "
        "entries not read; by default every entry is read up to "
        f"{FULL_READ_MAX_BYTES // 2**20} MB of input); a hang is decided by the newest "
        "entries, but older mismatches, gaps and timings are not seen (--all-entries "
        "reads them)"
    )
