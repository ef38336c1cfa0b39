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
import io
import json
import os
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsentry.diagnostics.model import (
    P2P_OPS,
    Communicator,
    InputError,
    OpSignature,
    SignatureTable,
    State,
    StreamBuilder,
    Trace,
    find_gaps,
)

SUPPORTED_MAJOR = 2
MAX_KNOWN_MINOR = 10
_RANK_SUFFIX = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)$")
_EXTENSIONS = (".json", ".pkl", ".pickle", ".bin")
_STATES = {"scheduled": State.SCHEDULED, "started": State.STARTED, "completed": State.COMPLETED}


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
    except (ValueError, pickle.UnpicklingError, EOFError, TypeError, IndexError,
            KeyError, AttributeError, RecursionError, MemoryError) as exc:
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


def _parse_ranks(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value) if value.strip() else []
        except (ValueError, SyntaxError):
            return ()
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
class RankDump:
    """What one rank's file contributes, before ranks are joined."""

    rank: int
    path: str
    version: tuple[int, int]
    #: (pg name) -> list of (seq, time_ns, signature, state, is_p2p, peer_local)
    by_pg: dict[str, list[tuple[int, int, OpSignature, int, bool, int | None]]]
    pg_desc: dict[str, str]
    pg_ranks: dict[str, tuple[int, ...]]
    last_enqueued: dict[str, int]
    latest_ns: int


def parse_dump(dump: dict[str, Any], rank: int, source: str) -> RankDump:
    version = parse_version(dump.get("version", "2.0"))
    if version[0] != SUPPORTED_MAJOR:
        raise FlightRecorderError(f"{source}: unsupported Flight Recorder version {version}")
    by_pg: dict[str, list[tuple[int, int, OpSignature, int, bool, int | None]]] = {}
    pg_desc: dict[str, str] = {}
    pg_id_to_name: dict[str, str] = {}
    latest = 0
    sig_cache: dict[tuple[Any, ...], OpSignature] = {}
    for entry in dump["entries"]:
        if not isinstance(entry, dict):
            raise FlightRecorderError(f"{source}: entry is {type(entry).__name__}, not a dict")
        pg = entry.get("process_group") or ("", "")
        pg_name = str(pg[0]) if len(pg) > 0 else ""
        if len(pg) > 1:
            pg_desc[pg_name] = str(pg[1])
        if "pg_id" in entry:
            pg_id_to_name[str(entry["pg_id"])] = pg_name
        op, meta = _op_and_peer(str(entry.get("profiling_name", "")))
        is_p2p = bool(entry.get("is_p2p", op in P2P_OPS))
        if "collective_seq_id" in entry:
            seq = entry.get("p2p_seq_id") if is_p2p else entry.get("collective_seq_id")
        else:  # version 2.0/2.1 had one counter
            seq = entry.get("seq_id")
        if not isinstance(seq, int):
            raise FlightRecorderError(f"{source}: entry without a sequence number")
        created = int(entry.get("time_created_ns") or 0)
        for key in ("time_discovered_completed_ns", "time_discovered_started_ns"):
            t = entry.get(key)
            if isinstance(t, int) and t > latest:
                latest = t
        latest = max(latest, created)
        state = _STATES.get(str(entry.get("state", "")), State.SCHEDULED)
        if entry.get("retired") is True:
            state = State.COMPLETED
        raw_key = (op, repr(entry.get("input_sizes")), repr(entry.get("output_sizes")),
                   repr(entry.get("input_dtypes")), repr(entry.get("output_dtypes")))
        sig = sig_cache.get(raw_key)
        if sig is None:
            sig = OpSignature(op, _sizes(entry.get("input_sizes")),
                              _sizes(entry.get("output_sizes")),
                              _strings(entry.get("input_dtypes")),
                              _strings(entry.get("output_dtypes")))
            sig_cache[raw_key] = sig
        by_pg.setdefault(pg_name, []).append(
            (seq, created, sig, int(state), is_p2p, _peer_local(op, meta))
        )
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
    return RankDump(rank, source, version, by_pg, pg_desc, pg_ranks, last_enqueued, latest)


def _coalesce(
    events: list[tuple[int, int, OpSignature, int, bool, int | None]],
) -> list[tuple[int, int, OpSignature, int, bool, int | None]]:
    """Merge collectives that share a sequence number (a coalesced group) into one event."""
    out: list[tuple[int, int, OpSignature, int, bool, int | None]] = []
    group: list[tuple[int, int, OpSignature, int, bool, int | None]] = []

    def flush() -> None:
        if len(group) == 1:
            out.append(group[0])
        elif group:
            parts = tuple(g[2] for g in group if g[2].op != "coalesced")
            sig = OpSignature("coalesced", parts=parts)
            out.append((group[0][0], group[0][1], sig, min(g[3] for g in group), False, None))
        group.clear()

    for event in events:
        if event[4]:
            flush()
            out.append(event)
            continue
        if group and group[-1][0] != event[0]:
            flush()
        group.append(event)
    flush()
    return out


def join_dumps(dumps: list[RankDump], trace: Trace) -> Trace:
    """Join per-rank dumps into communicators and streams."""
    members: dict[str, set[int]] = {}
    declared: dict[str, tuple[int, ...]] = {}
    descs: dict[str, str] = {}
    for d in dumps:
        trace.ranks_with_data.add(d.rank)
        trace.capture_end_ns = max(trace.capture_end_ns, d.latest_ns)
        for pg, events in d.by_pg.items():
            members.setdefault(pg, set()).add(d.rank)
            descs.setdefault(pg, d.pg_desc.get(pg, ""))
            del events  # only membership here
        for pg, ranks in d.pg_ranks.items():
            if d.rank in ranks:
                declared.setdefault(pg, ranks)
                members.setdefault(pg, set()).add(d.rank)
    for pg, seen in members.items():
        declared_ranks = declared.get(pg)
        is_declared = declared_ranks is not None and seen <= set(declared_ranks)
        trace.communicators[pg] = Communicator(
            pg, declared_ranks if is_declared and declared_ranks else tuple(sorted(seen)),
            descs.get(pg, ""), is_declared,
        )
    table: SignatureTable = trace.signatures
    for d in dumps:
        for pg, events in d.by_pg.items():
            comm_ranks = trace.communicators[pg].ranks
            collectives = _coalesce([e for e in events if not e[4]])
            p2p = [e for e in events if e[4]]
            for kind, chosen in (("c", collectives), ("p", p2p)):
                if not chosen:
                    continue
                is_p2p = kind == "p"
                comm_id = pg if not is_p2p else f"{pg}/p2p"
                if is_p2p and comm_id not in trace.communicators:
                    base = trace.communicators[pg]
                    trace.communicators[comm_id] = Communicator(
                        comm_id, base.ranks, base.desc, base.declared
                    )
                builder = StreamBuilder(d.rank, comm_id, is_p2p=is_p2p)
                for seq, t_ns, sig, state, _p2p, peer_local in chosen:
                    peer = -1
                    if peer_local is not None and 0 <= peer_local < len(comm_ranks):
                        peer = comm_ranks[peer_local]
                    builder.add(seq, t_ns, table.intern(sig), state, peer)
                stream = builder.build(
                    last_enqueued=-1 if is_p2p else d.last_enqueued.get(pg, -1)
                )
                trace.streams[(comm_id, d.rank)] = stream
                if not is_p2p:
                    trace.gaps.extend(find_gaps(stream))
        for pg, last in d.last_enqueued.items():
            if pg in trace.communicators and (pg, d.rank) not in trace.streams and last > 0:
                empty = StreamBuilder(d.rank, pg).build(last_enqueued=last)
                trace.streams[(pg, d.rank)] = empty
    return trace


def looks_like_flight_recorder(head: bytes) -> bool:
    stripped = head.lstrip()
    if stripped[:1] == b"{":
        return b'"entries"' in head or b'"pg_config"' in head or b'"version"' in head
    return head[:1] == b"\x80" and (b"entries" in head or b"pg_config" in head
                                   or b"version" in head)


def read_flight_recorder(
    paths: list[Path], on_file: Callable[[], None] | None = None
) -> Trace:
    """Read one dump per rank; a bad file becomes an `InputError`, the others are analysed."""
    trace = Trace(format="fr")
    ranks = infer_rank_names(paths)
    dumps: list[RankDump] = []
    seen_ranks: dict[int, str] = {}
    for path in paths:
        trace.inputs.append(str(path))
        try:
            rank = ranks.get(path)
            if rank is None:
                raise FlightRecorderError(f"{path}: cannot tell the rank from the file name")
            if rank in seen_ranks:
                raise FlightRecorderError(f"{path}: rank {rank} already read from "
                                          f"{seen_ranks[rank]}")
            data = path.read_bytes()
            dump = parse_dump(decode_dump(data, str(path)), rank, str(path))
            mtime = os.stat(path).st_mtime_ns
            dump.latest_ns = max(dump.latest_ns, mtime)
            dumps.append(dump)
            seen_ranks[rank] = str(path)
            if dump.version[1] > MAX_KNOWN_MINOR:
                trace.notes.append(f"{path}: version {dump.version[0]}.{dump.version[1]} is "
                                   f"newer than {SUPPORTED_MAJOR}.{MAX_KNOWN_MINOR}; read anyway")
        except (OSError, FlightRecorderError) as exc:
            trace.errors.append(InputError(str(path), str(exc)))
        if on_file is not None:
            on_file()
    return join_dumps(dumps, trace)
