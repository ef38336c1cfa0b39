"""NCCL RAS snapshots: `ncclras` text output and `ncclras -f json`.

JSON (NCCL >= 2.28): `communicators[]` with `hash`, `size`, `ranks[]` (`rank`, `status`,
`collective_counts` per NCCL function) and `missing_ranks[]` (`rank`, `status.unresponsive`,
`status.considered_dead`).

Text: we read the per-communicator sections of the "Errors" and "Warnings" parts:
`#G-C (hash) INCOMPLETE` followed by `Rank N -- ...` lines, `#G-C (hash) MISMATCH` with
`Communicator ranks have different <Op> operation counts`, `N ranks have launched up to
operation M` and `Rank N has launched up to operation M -- ...` lines, and `ERROR`
sections. Ranks are communicator ranks.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainsentry.diagnostics.model import InputError, RasCommunicator, Trace


class RasFormatError(ValueError):
    pass


def parse_ras_json(doc: Any, source: str) -> list[RasCommunicator]:
    try:
        return _parse_ras_json(doc, source)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        if isinstance(exc, RasFormatError):
            raise
        raise RasFormatError(f"{source}: unexpected structure ({exc!r})") from exc


def _parse_ras_json(doc: Any, source: str) -> list[RasCommunicator]:
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        raise RasFormatError(f"{source}: no 'communicators' list (is this `ncclras -f json`?)")
    out = []
    for comm in doc["communicators"]:
        if not isinstance(comm, dict):
            raise RasFormatError(f"{source}: communicator entry is not an object")
        counts: dict[str, dict[int, int]] = {}
        errors = []
        for rank in comm.get("ranks") or []:
            number = int(rank.get("rank", -1))
            for op, value in (rank.get("collective_counts") or {}).items():
                counts.setdefault(str(op), {})[number] = int(value)
            status = rank.get("status") or {}
            if status.get("async_error") not in (None, 0, 7) or status.get("abort_flag"):
                errors.append(number)  # 7 = ncclInProgress
        missing, dead = [], []
        for rank in comm.get("missing_ranks") or []:
            number = int(rank.get("rank", -1))
            missing.append(number)
            if (rank.get("status") or {}).get("considered_dead"):
                dead.append(number)
        majority = {
            op: Counter(values.values()).most_common(1)[0][0]
            for op, values in counts.items()
            if values
        }
        out.append(
            RasCommunicator(
                hash=str(comm.get("hash", "?")),
                size=int(comm.get("size", len(counts) or 0)),
                counts=counts,
                majority=majority,
                missing_ranks=tuple(sorted(missing)),
                dead_ranks=tuple(sorted(dead)),
                error_ranks=tuple(sorted(errors)),
            )
        )
    return out


_SECTION = re.compile(r"^#(\d+)-(\d+) \((?P<hash>[0-9a-fA-Fx]+)\) (?P<kind>[A-Z]+)\s*$")
_DIFFERENT = re.compile(r"Communicator ranks have different (?P<op>\w+) operation counts")
_GROUP = re.compile(
    r"^\s*(?P<n>\d+) ranks have (?:launched up to operation (?P<c>\d+)|"
    r"not launched any operations)"
)
_ONE = re.compile(
    r"^\s*Rank (?P<r>\d+) has (?:launched up to operation (?P<c>\d+)|"
    r"not launched any operations)"
)
_RANK = re.compile(r"^\s*Rank (?P<r>\d+)\b")
_TABLE = re.compile(r"^\s*\d+\s+\d+\s+\d+\s+\S+\s+(?P<size>\d+)\s+\d+\s+\w+")


def parse_ras_text(text: str, source: str) -> list[RasCommunicator]:
    if "Errors" not in text and "Group" not in text and "#" not in text:
        raise RasFormatError(f"{source}: not ncclras output")
    comms: dict[str, RasCommunicator] = {}
    current: RasCommunicator | None = None
    kind = ""
    op = ""
    group_count: int | None = None
    sizes = [int(m["size"]) for m in map(_TABLE.match, text.splitlines()) if m]
    default_size = max(sizes) if sizes else 0
    missing: dict[str, set[int]] = {}
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            key = section["hash"]
            current = comms.setdefault(key, RasCommunicator(hash=key, size=default_size))
            kind = section["kind"]
            op, group_count = "", None
            continue
        if current is None or not line.strip():
            if not line.strip():
                group_count = None
            continue
        different = _DIFFERENT.search(line)
        if different:
            op, group_count = different["op"], None
            continue
        group = _GROUP.match(line)
        if group and op:
            group_count = int(group["c"] or 0)
            prev = current.majority.get(op)
            if prev is None:
                current.majority[op] = group_count
            continue
        one = _ONE.match(line)
        if one and op:
            current.counts.setdefault(op, {})[int(one["r"])] = int(one["c"] or 0)
            continue
        rank = _RANK.match(line)
        if rank:
            number = int(rank["r"])
            if kind == "INCOMPLETE":
                missing.setdefault(current.hash, set()).add(number)
            elif kind == "MISMATCH" and op and group_count is not None:
                current.counts.setdefault(op, {})[number] = group_count
            elif kind == "ERROR":
                current.error_ranks = tuple(sorted({*current.error_ranks, number}))
    for key, ranks in missing.items():
        comms[key].missing_ranks = tuple(sorted(ranks))
    return list(comms.values())


def looks_like_ras(head: str) -> bool:
    return (
        ('"communicators"' in head and '"nccl_version"' in head)
        or ("Group" in head and "Comms" in head and "Ranks" in head)
        or "Job summary" in head
    )


def read_nccl_ras(paths: list[Path], on_file: Callable[[], None] | None = None) -> Trace:
    trace = Trace(format="ras")
    for path in paths:
        trace.inputs.append(str(path))
        try:
            text = path.read_text(encoding="utf-8")
            if text.lstrip().startswith("{"):
                try:
                    doc = json.loads(text)
                except ValueError as exc:
                    raise RasFormatError(f"{path}: corrupt JSON ({exc})") from exc
                trace.ras.extend(parse_ras_json(doc, str(path)))
            else:
                trace.ras.extend(parse_ras_text(text, str(path)))
        except (OSError, UnicodeDecodeError, RasFormatError, TypeError, ValueError) as exc:
            trace.errors.append(InputError(str(path), str(exc)))
        if on_file is not None:
            on_file()
    return trace
