"""Which Flight Recorder holds this process's collectives, and how the probe reads them.

torch keeps two recorders (FlightRecorder.hpp / ProcessGroupNCCL.hpp):

- ProcessGroupNCCL's own, read by `_dump_nccl_trace_json()`; it exists only in CUDA builds
  (`USE_C10D_NCCL`), so a CPU build cannot even show it is there. Every NCCL collective goes
  here. Measured on an H100 (torch 2.11, NCCL 2.28.9): 20 entries here, 0 in the other.
- the generic one, read by `_dump_fr_trace_json()`, which gloo (and other CPU backends)
  write to.

Both take `(includeCollectives, onlyActive)` and return the same JSON format. A job may use
both (NCCL for GPU tensors, a gloo group for CPU-side object collectives; or one group with
`cuda:nccl,cpu:gloo`, whose name then appears in both), so the probe reads every recorder
that exists and keeps each one's groups apart. Where a torch build serves one recorder under
both names (newer builds alias the legacy NCCL call), identical status blocks are read once.

Invariants:
- Group keys are global group names (the same on every rank), never local pg_ids. A name
  that two recorders share keeps its name in the first recorder (NCCL) and becomes
  `<name>:<recorder>` (e.g. `0:generic`) in the other; `/dump` uses the same keys, so
  metrics, status and dumps agree, and the key never depends on what a poll happened to see.
- A recorder's pg_id -> name map is learnt from its full dumps' entries and, for NCCL, from
  each group's backend `uid`; one full dump is taken when a pg_id nobody names appears for
  the first time (an id still unnamed after it is tried again at most every
  `LEARN_INTERVAL_S`), never on every poll.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trainsentry.probe.progress import FrSnapshot, PgProgress, group_ids, parse_progress

LEARN_INTERVAL_S = 30.0
NCCL, GENERIC = "nccl", "generic"
#: (name, torch attribute, the backend its groups use when entries do not say)
_SOURCES = ((NCCL, "_dump_nccl_trace_json", "nccl"), (GENERIC, "_dump_fr_trace_json", ""))


@dataclass(frozen=True)
class Recorder:
    """One of torch's recorders: `read(include_collectives, only_active)` -> JSON bytes."""

    name: str
    read: Callable[[bool, bool], bytes]
    backend: str = ""


@dataclass(frozen=True)
class PyGroup:
    """A process group as torch.distributed's Python side knows it (this rank is a member).

    `nccl_uid` is the ProcessGroupNCCL backend's uid, which is its pg_id in the NCCL
    recorder; `seq` the group's collective sequence number (0: no collective issued yet).
    """

    name: str
    desc: str
    ranks: tuple[int, ...] = ()
    nccl_uid: int | None = None
    seq: int = 0


def find_recorders(c10d: Any) -> list[Recorder]:
    """The recorders this torch build offers, NCCL's first."""
    found = []
    for name, attribute, backend in _SOURCES:
        function = getattr(c10d, attribute, None)
        if callable(function):
            found.append(Recorder(name, _reader(function), backend))
    return found


def _reader(function: Callable[..., Any]) -> Callable[[bool, bool], bytes]:
    def read(include_collectives: bool, only_active: bool) -> bytes:
        data = function(includeCollectives=include_collectives, onlyActive=only_active)
        return data if isinstance(data, bytes) else str(data).encode()

    return read


def _key(name: str, taken: set[str], recorder: str) -> str:
    return name if name not in taken else f"{name}:{recorder}"


def combine(parts: Sequence[tuple[str, FrSnapshot]]) -> tuple[FrSnapshot, dict[str, str]]:
    """Pure: one snapshot from several recorders', and group key -> recorder name.

    Later recorders' groups whose name is taken get `<name>:<recorder>` (see module doc).
    """
    groups: dict[str, PgProgress] = {}
    owner: dict[str, str] = {}
    entries, version = -1, ""
    unmapped: list[str] = []
    for recorder, snap in parts:
        version = version or snap.version
        if snap.entries >= 0:
            entries = max(entries, 0) + snap.entries
        unmapped.extend(f"{recorder}:{key}" for key in snap.unmapped)
        for name, progress in snap.groups.items():
            key = _key(name, set(groups), recorder)
            groups[key] = progress if key == name else replace(progress, pg=key)
            owner[key] = recorder
    return FrSnapshot(version, entries, groups, tuple(unmapped)), owner


def merge_dumps(docs: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Pure: several recorders' full dumps as one valid Flight Recorder document.

    Each later document's pg_ids are shifted past the earlier ones (so `pg_status` keys
    cannot collide) and its group names that are taken are renamed as `combine` does, in its
    entries, `pg_status` mapping and `pg_config`. Everything else is kept as torch wrote it.
    """
    out: dict[str, Any] = {"version": "", "comm_lib_version": "", "pg_config": {}}
    out["pg_status"], out["entries"] = {}, []
    taken: set[str] = set()
    offset = 0
    for recorder, doc in docs:
        out["version"] = out["version"] or doc.get("version", "")
        out["comm_lib_version"] = out["comm_lib_version"] or doc.get("comm_lib_version", "")
        if "nccl_comm_state" in doc and "nccl_comm_state" not in out:
            out["nccl_comm_state"] = doc["nccl_comm_state"]
        entries = [e for e in doc.get("entries") or [] if isinstance(e, Mapping)]
        names: dict[str, str] = {}
        for entry in entries:
            group = entry.get("process_group")
            if isinstance(group, list | tuple) and group:
                names.setdefault(str(group[0]), _key(str(group[0]), taken, recorder))
        config = doc.get("pg_config")
        if isinstance(config, Mapping):
            for key, value in config.items():
                if isinstance(value, Mapping) and (value.get("name") or key):
                    name = str(value.get("name") or key)
                    names.setdefault(name, _key(name, taken, recorder))
        ids = [int(k) for k in (doc.get("pg_status") or {}) if str(k).lstrip("-").isdigit()]
        ids += [int(e["pg_id"]) for e in entries if isinstance(e.get("pg_id"), int)]
        for key, value in (doc.get("pg_status") or {}).items():
            shifted = str(int(key) + offset) if str(key).lstrip("-").isdigit() else str(key)
            out["pg_status"][shifted] = value
        for entry in entries:
            copy = dict(entry)
            if isinstance(copy.get("pg_id"), int):
                copy["pg_id"] += offset
            group = copy.get("process_group")
            if isinstance(group, list | tuple) and group:
                copy["process_group"] = [names.get(str(group[0]), str(group[0])), *group[1:]]
            out["entries"].append(copy)
        if isinstance(config, Mapping):
            for key, value in config.items():
                if isinstance(value, Mapping):
                    name = names.get(str(value.get("name") or key), str(key))
                    out["pg_config"][name] = {**value, "name": name}
        taken.update(names.values())
        offset += max(ids, default=-1) + 1
    return out


@dataclass
class Recorders:
    """Reads every recorder of this process; remembers each one's pg_id -> name map.

    `python_groups` lists the groups torch.distributed knows (names, descriptions, NCCL
    uids, sequence numbers); it is asked only when something is not known yet.
    """

    sources: list[Recorder]
    python_groups: Callable[[], list[PyGroup]] = lambda: []
    clock: Callable[[], float] = time.monotonic
    _ids: dict[str, dict[str, str]] = field(default_factory=dict)
    _descs: dict[str, str] = field(default_factory=dict)
    _learnt_at: dict[str, float] = field(default_factory=dict)
    _owner: dict[str, str] = field(default_factory=dict)
    _known_names: set[str] = field(default_factory=set)
    _members: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [source.name for source in self.sources]

    def snapshot(self, now_ns: int) -> FrSnapshot:
        """Status-only reads of every recorder (microseconds each), combined."""
        parts: list[tuple[str, FrSnapshot]] = []
        seen_status: list[Any] = []
        for source in self.sources:
            doc = json.loads(source.read(False, False))
            signature = (doc.get("pg_status"), doc.get("pg_config"))
            if signature[0] and signature in seen_status:
                continue  # the same recorder under a second name
            seen_status.append(signature)
            snap = self._parse(source, doc, now_ns)
            if snap.unmapped and self._may_learn(source.name, snap.unmapped):
                self._refresh_python()  # NCCL: each group's backend uid is its pg_id
                snap = self._parse(source, doc, now_ns)
                if snap.unmapped:  # else one full dump: its entries name their pg_ids
                    self._learn(source, json.loads(source.read(True, False)))
                    snap = self._parse(source, doc, now_ns)
            parts.append((source.name, snap))
        combined, self._owner = combine(parts)
        return combined

    def detail(self, keys: Sequence[str], now_ns: int, only_active: bool) -> FrSnapshot:
        """Full dumps of the recorders that own `keys` (ops and ages of what is in flight)."""
        wanted = {self._owner.get(key) for key in keys}
        parts = []
        for source in self.sources:
            if source.name in wanted:
                doc = json.loads(source.read(True, only_active))
                self._learn(source, doc)
                parts.append((source.name, self._parse(source, doc, now_ns)))
        return combine(parts)[0]

    def dump(self) -> tuple[bytes, list[str]]:
        """The full dump served by `/dump`: torch's bytes unchanged when one recorder holds
        groups, else the recorders merged into one document (`merge_dumps`)."""
        docs: list[tuple[str, bytes, dict[str, Any]]] = []
        for source in self.sources:
            data = source.read(True, False)
            doc = json.loads(data)
            if doc.get("pg_status") and any(doc["pg_status"] == d["pg_status"] for *_, d in docs):
                continue
            docs.append((source.name, data, doc))
        used = [item for item in docs if item[2].get("pg_status") or item[2].get("entries")]
        if len(used) == 1:
            return used[0][1], [used[0][0]]
        if not used:
            return (docs[0][1], [docs[0][0]]) if docs else (b"{}", [])
        merged = merge_dumps([(name, doc) for name, _, doc in used])
        return json.dumps(merged).encode(), [name for name, *_ in used]

    def members(self, name: str) -> tuple[int, ...]:
        """The global ranks of group `name` (its key here), as torch.distributed knows them;
        () when unknown. Asks torch only for a group not seen yet."""
        base = name.rsplit(":", 1)[0] if name not in self._members else name
        if base not in self._members:
            self._refresh_python()
        return self._members.get(base, ())

    def issued_collectives(self) -> int:
        """Collectives torch.distributed says this rank issued, over all its groups."""
        return sum(max(0, group.seq) for group in self.python_groups())

    # ------------------------------------------------------------------ internals

    def _parse(self, source: Recorder, doc: Mapping[str, Any], now_ns: int) -> FrSnapshot:
        ids = self._ids.setdefault(source.name, {})
        snap = parse_progress(doc, now_ns, self._descs, ids, source.backend)
        fresh = set(snap.groups) - self._known_names
        if fresh:
            self._known_names |= fresh
            self._refresh_python()
            snap = parse_progress(doc, now_ns, self._descs, ids, source.backend)
        return snap

    def _learn(self, source: Recorder, full: Mapping[str, Any]) -> None:
        """What a full dump's entries say: pg_id -> name, and each group's description."""
        self._ids.setdefault(source.name, {}).update(group_ids(full))
        for name, group in parse_progress(full, 0).groups.items():
            if group.desc:
                self._descs.setdefault(name, group.desc)

    def _may_learn(self, recorder: str, ids: Sequence[str]) -> bool:
        """True for an id never tried before, or one last tried `LEARN_INTERVAL_S` ago."""
        now = self.clock()
        keys = [f"{recorder}/{pg_id}" for pg_id in ids]
        due = [
            k for k in keys if now - self._learnt_at.get(k, -LEARN_INTERVAL_S) >= LEARN_INTERVAL_S
        ]
        for key in keys:
            self._learnt_at[key] = now
        return bool(due)

    def _refresh_python(self) -> None:
        try:
            groups = self.python_groups()
        except Exception:
            return
        for group in groups:
            if group.ranks:
                self._members[group.name] = tuple(group.ranks)
            if group.desc:
                self._descs.setdefault(group.name, group.desc)
            if group.nccl_uid is not None:
                self._ids.setdefault(NCCL, {}).setdefault(str(group.nccl_uid), group.name)
