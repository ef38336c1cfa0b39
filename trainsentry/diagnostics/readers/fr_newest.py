"""Read only the newest entries of a large JSON Flight Recorder dump.

A hang is decided by the end of each rank's record: which collective each group waits in,
what came just before it. torch's JSON dump (`_dump_nccl_trace_json`, what the probe serves)
lists the ring buffer's entries oldest first, so the end of the file holds the newest
entries and, in torch's key order (sorted: `entries` before `nccl_comm_state`, `pg_config`,
`pg_status`, `version`), everything else. Reading the last `window` bytes of a 1.3 MB dump
instead of all of it is what makes 16,384 ranks fit in a minute.

Invariants:
- Nothing is guessed. The tail is accepted only when it parses as a whole: the top-level
  keys after the `entries` array parse as the rest of one JSON object, and the entries
  from the first whole one in the window to the array's end parse as a list of entry
  objects; the keys before `entries` (if any) parse as the start of that object. Anything
  else (a pickle, another key order, a file cut short) returns None and the caller reads
  the whole file.
- A group whose `pg_status` says it has work not yet completed (`last_enqueued_collective`
  above `last_completed_collective`) must have an entry in what was read, since that is
  the group a hang is about; if not, the window grows (x4) until it does or covers the file.
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson

#: Default window: the newest 128 KiB of each dump (~200 entries of torch's JSON).
NEWEST_BYTES = 128 * 1024
#: Where the keys before `entries` are searched for (a dump whose keys before the entries
#: are larger than this is read whole).
_HEAD_MAX = 4 * 2**20
_ENTRY_START = re.compile(rb"[\[,]\s*\{")
_MAX_TRIES = 256


def read_newest(path: str, window: int = NEWEST_BYTES) -> tuple[dict[str, Any], int] | None:
    """(the dump with only its newest entries, bytes of entries not read), or None when
    the whole file must be read instead (too small to gain, not JSON in torch's layout).

    Reads at most the file's head (up to the `entries` key) and its last `window` bytes,
    growing the window as the module doc says."""
    size = os.stat(path).st_size
    if size <= 2 * window:
        return None
    with open(path, "rb") as handle:
        head = handle.read(min(size, 64 * 1024))
        if head.lstrip()[:1] != b"{":
            return None
        before = _keys_before_entries(handle, head, size)
        if before is None:
            return None
        top, entries_at = before
        while True:
            start = max(entries_at, size - window)
            handle.seek(start)
            tail = handle.read(size - start)
            parsed = _parse_tail(tail)
            if parsed is None:
                return None
            entries, rest, first_at = parsed
            if start + first_at <= entries_at + 1 or _unseen_busy_groups(rest, entries) == 0:
                break
            if size - start >= size - entries_at:
                break
            window *= 4
    dump = {**top, **rest, "entries": entries}
    return dump, max(0, start + first_at - entries_at - 1)


def _keys_before_entries(handle: Any, head: bytes, size: int) -> tuple[dict[str, Any], int] | None:
    """(top-level keys before `entries`, offset of the entries array's `[`), or None."""
    while True:
        for match in re.finditer(rb'"entries"\s*:\s*\[', head):
            prefix = head[: match.start()].rstrip()
            try:
                if prefix == b"{":
                    return {}, match.end() - 1
                if prefix.endswith(b","):
                    found = orjson.loads(prefix[:-1] + b"}")
                    if isinstance(found, dict):
                        return found, match.end() - 1
            except orjson.JSONDecodeError:
                continue
        if len(head) >= min(size, _HEAD_MAX):
            return None
        head += handle.read(min(size, _HEAD_MAX) - len(head))


def _parse_tail(tail: bytes) -> tuple[list[Any], dict[str, Any], int] | None:
    """(entries wholly in `tail`, top-level keys after them, offset of the first entry)."""
    end = len(tail)
    rest: dict[str, Any] | None = None
    for _ in range(_MAX_TRIES):
        end = tail.rfind(b"]", 0, end)
        if end < 0:
            return None
        after = tail[end + 1 :].strip()
        try:
            if after == b"}":
                rest = {}
            elif after[:1] == b",":
                found = orjson.loads(b"{" + after[1:])
                rest = found if isinstance(found, dict) else None
        except orjson.JSONDecodeError:
            rest = None
        if rest is not None:
            break
    if rest is None:
        return None
    for tries, match in enumerate(_ENTRY_START.finditer(tail, 0, end)):
        if tries >= _MAX_TRIES:
            return None
        first = match.end() - 1
        try:
            entries = orjson.loads(b"[" + tail[first:end] + b"]")
        except orjson.JSONDecodeError:
            continue
        if all(isinstance(e, dict) and "profiling_name" in e for e in entries):
            return entries, rest, first
        return None
    return None


def _unseen_busy_groups(rest: dict[str, Any], entries: list[Any]) -> int:
    """Pure: groups `pg_status` says have unfinished work but no entry read names."""
    status = rest.get("pg_status")
    if not isinstance(status, dict):
        return 0
    seen = {str(e.get("pg_id")) for e in entries}
    if seen == {"None"}:
        return 0  # entries without pg_id (before 2.2): nothing to match status keys to
    unseen = 0
    for key, value in status.items():
        if not isinstance(value, dict) or str(key) in seen:
            continue
        try:
            enqueued = int(value.get("last_enqueued_collective", -1))
            completed = int(value.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            continue
        if completed >= 0 and enqueued > completed:
            unseen += 1
    return unseen
