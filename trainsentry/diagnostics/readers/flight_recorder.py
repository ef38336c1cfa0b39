"""PyTorch Flight Recorder dumps (pickle or JSON, format versions 2.x up to 2.10).

One file per rank; the rank is the number at the end of the file name after a common
prefix (`nccl_trace_rank_12`, `rank_3.json`). Pickles are read with an unpickler that
refuses every global, so a dump can only ever build dicts, lists, tuples, strings and
numbers. Keys we do not know are ignored; keys older versions lack get defaults.

Notes on the format (checked against torch 2.13):
- `process_group` is `(pg_name, pg_desc)`; gloo dumps may carry a `pg_config` whose names do
  not match any entry (`{"": {"ranks": "[]"}}`), so membership falls back to the ranks that
  recorded the group.
- gloo entries stay `state == "scheduled"`; `retired == True` is what marks completion.
- collectives are numbered by `collective_seq_id`, point-to-point ops by `p2p_seq_id`; ops
  of one coalesced group share a sequence number.
"""

from __future__ import annotations

import ast
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

SUPPORTED_MAJOR = 2
MAX_KNOWN_MINOR = 10
_RANK_SUFFIX = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_EXTENSIONS = (".json", ".pkl", ".pickle", ".bin")
_STATES: dict[Any, int] = {
    "scheduled": int(State.SCHEDULED),
    "started": int(State.STARTED),
    "completed": int(State.COMPLETED),
}


class FlightRecorderError(ValueError):
    pass


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


def _peer_local(op: str, meta: str | None) -> int | None:
    if meta is None:
        return None
    try:
        if op == "send" and "->" in meta:
            return int(meta.split("->")[1])
        if op == "recv" and "<-" in meta:
            return int(meta.split("<-")[1])
    except ValueError:
        return None
    return None


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


class SignatureCache:
    """Shared across files: the raw text of an entry's op and shapes -> signature id."""

    def __init__(self, table: SignatureTable) -> None:
        self.table = table
        self.ids: dict[str, int] = {}
        self.names: dict[str, tuple[str, int]] = {}
        #: marshal (or repr) of (profiling_name, sizes, dtypes) -> (signature id, local peer)
        self.by_raw: dict[bytes | str, tuple[int, int]] = {}

    def name(self, profiling_name: str) -> tuple[str, int]:
        found = self.names.get(profiling_name)
        if found is None:
            op, meta = _op_and_peer(profiling_name)
            peer = _peer_local(op, meta)
            found = self.names[profiling_name] = (op, -1 if peer is None else peer)
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
    op, peer = cache.name(str(entry.get("profiling_name", "")))
    is_p2p = entry.get("is_p2p")
    if is_p2p is None:
        is_p2p = op in P2P_OPS
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


def parse_dump(
    dump: dict[str, Any], rank: int, source: str, cache: SignatureCache | None = None
) -> RankDump:
    version = parse_version(dump.get("version", "2.0"))
    if version[0] != SUPPORTED_MAJOR:
        raise FlightRecorderError(f"{source}: unsupported Flight Recorder version {version}")
    cache = cache if cache is not None else SignatureCache(SignatureTable())
    by_pg: dict[str, PgColumns] = {}
    pg_desc: dict[str, str] = {}
    pg_id_to_name: dict[str, str] = {}
    states = _STATES
    completed = int(State.COMPLETED)
    scheduled = int(State.SCHEDULED)
    latest = 0
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
            _parse_entry_slowly(entry, source, cache, by_pg, pg_desc, pg_id_to_name)
            last_name = None
            continue
        seq = p2p_seq if is_p2p else collective_seq
        if seq.__class__ is not int:
            _parse_entry_slowly(entry, source, cache, by_pg, pg_desc, pg_id_to_name)
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
        try:  # marshal is an exact, 3x cheaper key than repr for these plain values
            raw: bytes | str = dumps((profiling_name, inputs, outputs, in_dtypes, out_dtypes))
        except ValueError:
            raw = repr((profiling_name, inputs, outputs, in_dtypes, out_dtypes))
        found = known.get(raw)
        if found is None:
            op, peer = cache.name(str(profiling_name))
            found = known[raw] = (cache.signature(entry, op), peer)
        rows.append(
            (
                seq,
                created or 0,
                found[0],
                completed if retired is True else states.get(state, scheduled),
                bool(is_p2p),
                found[1],
            )
        )
    for columns in by_pg.values():
        if columns.rows:
            latest = max(latest, max(row[1] for row in columns.rows))
    for entry in entries[-32:]:
        for key in ("time_discovered_completed_ns", "time_discovered_started_ns"):
            t = entry.get(key)
            if isinstance(t, int) and t > latest:
                latest = t
    pg_ranks: dict[str, tuple[int, ...]] = {}
    config = dump.get("pg_config")
    if isinstance(config, dict):
        for key, value in config.items():
            if not isinstance(value, dict):
                continue
            name = str(value.get("name") or key)
            ranks = _parse_ranks(value.get("ranks"))
            if name and ranks:
                pg_ranks[name] = ranks
    last_enqueued: dict[str, int] = {}
    status = dump.get("pg_status")
    if isinstance(status, dict):
        for key, value in status.items():
            if not isinstance(value, dict):
                continue
            name = str(key) if str(key) in by_pg else pg_id_to_name.get(str(key), str(key))
            try:
                last_enqueued[name] = int(value.get("last_enqueued_collective", -1))
            except (TypeError, ValueError):
                continue
    arrays = {name: columns.to_arrays() for name, columns in by_pg.items()}
    return RankDump(rank, source, version, arrays, pg_desc, pg_ranks, last_enqueued, latest)


def _coalesced_signature(table: SignatureTable, ids: list[int]) -> int:
    parts = tuple(table[i] for i in ids if table[i].op != "coalesced")
    return table.intern(OpSignature("coalesced", parts=parts))


def _build_stream(
    rank: int,
    comm_id: str,
    columns: PgArrays,
    picks: np.ndarray,
    is_p2p: bool,
    comm_ranks: tuple[int, ...],
    table: SignatureTable,
    last_enqueued: int,
) -> Stream:
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
        lookup = np.asarray(comm_ranks, dtype=np.int64)
        local = columns.peer_local[picks]
        valid = (local >= 0) & (local < len(lookup))
        peers = np.where(
            valid, lookup[np.clip(local, 0, max(len(lookup) - 1, 0))] if len(lookup) else -1, -1
        ).tolist()
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


def join_dumps(dumps: list[RankDump], trace: Trace) -> Trace:
    """Join per-rank dumps into communicators and streams."""
    members: dict[str, set[int]] = {}
    declared: dict[str, tuple[int, ...]] = {}
    descs: dict[str, str] = {}
    for d in dumps:
        trace.ranks_with_data.add(d.rank)
        trace.capture_end_ns = max(trace.capture_end_ns, d.latest_ns)
        for pg in d.by_pg:
            members.setdefault(pg, set()).add(d.rank)
            descs.setdefault(pg, d.pg_desc.get(pg, ""))
        for pg, ranks in d.pg_ranks.items():
            if d.rank in ranks:
                declared.setdefault(pg, ranks)
                members.setdefault(pg, set()).add(d.rank)
    world = tuple(range(max(trace.ranks_with_data) + 1)) if trace.ranks_with_data else ()
    for pg, seen in members.items():
        declared_ranks = declared.get(pg)
        if declared_ranks is None and descs.get(pg) == "default_pg":
            # gloo dumps may lack a usable pg_config; the default group is the whole world,
            # which is at least every rank a file was named after.
            declared_ranks = world
        is_declared = declared_ranks is not None and seen <= set(declared_ranks)
        trace.communicators[pg] = Communicator(
            pg,
            declared_ranks if is_declared and declared_ranks else tuple(sorted(seen)),
            descs.get(pg, ""),
            is_declared,
        )
    table: SignatureTable = trace.signatures
    for d in dumps:
        for pg, columns in d.by_pg.items():
            comm_ranks = trace.communicators[pg].ranks
            collective_picks = np.nonzero(~columns.is_p2p)[0]
            p2p_picks = np.nonzero(columns.is_p2p)[0]
            if len(collective_picks):
                stream = _build_stream(
                    d.rank,
                    pg,
                    columns,
                    collective_picks,
                    False,
                    comm_ranks,
                    table,
                    d.last_enqueued.get(pg, -1),
                )
                trace.streams[(pg, d.rank)] = stream
                trace.gaps.extend(find_gaps(stream))
            if len(p2p_picks):
                comm_id = f"{pg}/p2p"
                if comm_id not in trace.communicators:
                    base = trace.communicators[pg]
                    trace.communicators[comm_id] = Communicator(
                        comm_id, base.ranks, base.desc, base.declared
                    )
                trace.streams[(comm_id, d.rank)] = _build_stream(
                    d.rank, comm_id, columns, p2p_picks, True, comm_ranks, table, -1
                )
        for pg, last in d.last_enqueued.items():
            if pg in trace.communicators and (pg, d.rank) not in trace.streams and last > 0:
                empty = make_stream(d.rank, pg, [], [], [], State.SCHEDULED)
                empty.last_enqueued = last
                trace.streams[(pg, d.rank)] = empty
    return trace


def looks_like_flight_recorder(head: bytes) -> bool:
    stripped = head.lstrip()
    if stripped[:1] == b"{":
        return b'"entries"' in head or b'"pg_config"' in head or b'"version"' in head
    return head[:1] == b"\x80" and (
        b"entries" in head or b"pg_config" in head or b"version" in head
    )


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


def _read_one(path: Path, rank: int, cache: SignatureCache) -> RankDump:
    data = path.read_bytes()
    decoded = decode_dump(data, str(path))
    try:
        dump = parse_dump(decoded, rank, str(path), cache)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        if isinstance(exc, FlightRecorderError):
            raise
        raise FlightRecorderError(f"{path}: unexpected entry structure ({exc!r})") from exc
    dump.latest_ns = max(dump.latest_ns, os.stat(path).st_mtime_ns)
    return dump


def _read_chunk(
    items: list[tuple[int, str, int]], on_file: Callable[[], None] | None = None
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
                dump = _read_one(path, rank, cache)
                dump.index = index
                result.dumps.append(dump)
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


def _worker_count(paths: list[Path], requested: int | None) -> int:
    if requested is not None:
        return max(1, requested)
    if len(paths) < PARALLEL_MIN_FILES:
        return 1
    try:
        total = sum(p.stat().st_size for p in paths)
    except OSError:
        return 1
    if total < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, 8))


def _read_in_workers(
    items: list[tuple[int, str, int]], count: int, on_file: Callable[[], None] | None
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
            for future in as_completed([pool.submit(_read_chunk, chunk) for chunk in chunks]):
                result = future.result()
                results.append(result)
                if on_file is not None:
                    for _ in range(result.done):
                        on_file()
    except (BrokenProcessPool, OSError):
        done = {index for result in results for index in _indices(result)}
        rest = [item for item in items if item[0] not in done]
        results.append(_read_chunk(rest, on_file))
    return results


def _indices(result: _ChunkResult) -> set[int]:
    return {index for index, _ in result.errors} | {d.index for d in result.dumps}


def read_flight_recorder(
    paths: list[Path], on_file: Callable[[], None] | None = None, workers: int | None = None
) -> Trace:
    """Read one dump per rank; a bad file becomes an `InputError`, the others are analysed.

    Large inputs are parsed in `workers` processes (default: one per CPU, up to 8, from 64
    files and 32 MB on); each returns numpy columns and its own signature table, which we
    merge here.
    """
    trace = Trace(format="fr")
    ranks = infer_rank_names(paths)
    seen_ranks: dict[int, str] = {}
    items: list[tuple[int, str, int]] = []
    messages: dict[int, str] = {}
    for index, path in enumerate(paths):
        trace.inputs.append(str(path))
        rank = ranks.get(path)
        if rank is None:
            messages[index] = f"{path}: cannot tell the rank from the file name"
        elif rank in seen_ranks:
            messages[index] = f"{path}: rank {rank} already read from {seen_ranks[rank]}"
        else:
            seen_ranks[rank] = str(path)
            items.append((index, str(path), rank))
            continue
        if on_file is not None:
            on_file()
    count = _worker_count([Path(p) for _, p, _ in items], workers)
    results: list[_ChunkResult] = []
    if count > 1 and threading.active_count() == 1:
        results = _read_in_workers(items, count, on_file)
    else:
        results.append(_read_chunk(items, on_file))
    dumps: list[RankDump] = []
    for chunk_result in results:
        remap = np.asarray(
            [trace.signatures.intern(sig) for sig in chunk_result.signatures] or [0], dtype=np.int64
        )
        for dump in chunk_result.dumps:
            for columns in dump.by_pg.values():
                columns.signature = remap[columns.signature]
            dumps.append(dump)
        messages.update(dict(chunk_result.errors))
        trace.notes.extend(chunk_result.notes)
    for index in sorted(messages):
        trace.errors.append(InputError(str(paths[index]), messages[index]))
    dumps.sort(key=lambda d: d.rank)
    return join_dumps(dumps, trace)
