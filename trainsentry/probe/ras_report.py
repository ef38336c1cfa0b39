"""NCCL RAS status reports as NCCL writes them, text and JSON, into one structure. Pure.

Formats, from NCCL's `src/ras/client_support.cc`:

- Text, every version since 2.24: a communicator table (`Group Comms Nodes ... Status
  Errors`, one row per group of alike communicators), then `Errors` and `Warnings`. Per
  communicator `#G-C (hash) INCOMPLETE | ERROR | MISMATCH` sections; G is the table row, so
  the communicator's size is that row's "Ranks per comm". 2.24/2.25 list unanswered ranks as
  `The missing rank(s): 5,21` and say `different collective operation counts`; 2.26 on
  name each (`Rank 21 -- GPU 5 managed by process 7021 on node 10.0.0.3`) and the function
  (`different AllReduce operation counts`). Only outliers are listed rank by rank (VERBOSE:
  groups under half the communicator; plain STATUS: at most 10 and under a quarter), so the
  ranks of the one unlisted group are the members not named elsewhere.
- JSON (`SET FORMAT json`, 2.28.7 on): `communicators[]` with `ranks[]` (`host`, `pid`,
  `cuda_dev`, `status`, `collective_counts`) and `missing_ranks[]` (`status.unresponsive`,
  `status.considered_dead`). 2.28.7 and 2.28.9 omit the comma after a missing rank's
  `"nvml_dev": N` (fixed in 2.29.2): exactly the reports where a process does not answer
  fail to parse. `repair_json` puts the comma back.

Ranks are communicator ranks. A missing rank whose process answered (`unresponsive: false`,
text status `NOCOMM`) no longer (or not yet) has the communicator: it left, e.g. during
teardown, and is not counted as missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: ncclResult_t names as NCCL's ncclErrorToString prints them (text) / numbers (JSON).
NCCL_RESULTS = {
    1: "Unhandled CUDA error",
    2: "System error",
    3: "Internal error",
    4: "Invalid argument",
    5: "Invalid usage",
    6: "Remote process error",
}
REMOTE_ERROR = "Remote process error"
NOT_ERRORS = frozenset({0, 7})  # ncclResult_t values that are no error: ncclSuccess, ncclInProgress


class RasReportError(ValueError):
    """The text is not a RAS status report."""


@dataclass(frozen=True, slots=True)
class RasProcess:
    """A process as RAS names it: the node's address (as NCCL prints it), pid, GPU."""

    host: str
    pid: int = -1
    gpu: str = ""

    def describe(self) -> str:
        gpu = f"GPU {self.gpu} managed by " if self.gpu else ""
        pid = f"process {self.pid}" if self.pid >= 0 else "a process"
        return f"{gpu}{pid} on node {self.host or '?'}"


@dataclass
class RasComm:
    """One communicator in one report. Ranks are communicator ranks."""

    hash: str  # 16 lower-case hex digits, as the text prints it
    size: int = -1  # -1: unknown
    label: str = ""  # text: "#G-C" (row G of the table, its C-th communicator)
    #: function -> rank -> operations launched; complete for JSON, for text where the one
    #: group printed without its ranks could be filled in (else see `unnamed`).
    counts: dict[str, dict[int, int]] = field(default_factory=dict)
    #: Text: (function, ranks, launched count) of the groups whose ranks the report does
    #: not name, when more than one such group leaves them unplaceable (plain STATUS lists
    #: few outliers).
    unnamed: list[tuple[str, int, int]] = field(default_factory=list)
    processes: dict[int, RasProcess] = field(default_factory=dict)
    missing: set[int] = field(default_factory=set)  # no answer from the process
    #: Ranks without data the report counts (text: "Missing communicator data from N ranks"
    #: also when it lists fewer, or none).
    missing_count: int = 0
    dead: set[int] = field(default_factory=set)  # RAS considers the process dead
    left: set[int] = field(default_factory=set)  # answered, but without this communicator
    errors: dict[int, str] = field(default_factory=dict)  # rank -> NCCL error text
    error_count: int = 0  # ranks with an error, including ones the text does not list
    status: dict[int, str] = field(default_factory=dict)  # RUNNING/INIT/FINALIZE/ABORT/NOCOMM


@dataclass
class RasCounts:
    """A report's numbers as the probe exports them (probe/ras.py `RasStatus`): what a text
    report states (read in `report_from_text`'s one pass), or what a JSON document holds
    (probe/ras.py `counts_from_json`). -1: the report did not say."""

    nccl_version: str = ""
    communicators: int = -1
    missing_ranks: int = 0
    unresponsive_processes: int = 0
    dead_processes: int = 0
    incomplete_communicators: int = 0
    mismatch_communicators: int = 0
    error_communicators: int = 0
    timeouts: int = 0


@dataclass
class RasReport:
    format: str  # "json" | "text"
    nccl_version: str = ""
    timestamp: str = ""  # JSON only ("%F %T", the RAS server's local time)
    comms: list[RasComm] = field(default_factory=list)
    unresponsive_processes: list[RasProcess] = field(default_factory=list)
    dead_processes: list[RasProcess] = field(default_factory=list)
    timeouts: int = 0
    #: Text job summary: processes and GPUs in the job (-1 unknown).
    total_processes: int = -1
    total_gpus: int = -1
    #: Text communicator table: (communicators in the group, ranks per communicator, status,
    #: errors) per row; a healthy report names no communicator anywhere else.
    table: list[tuple[int, int, str, str]] = field(default_factory=list)
    repaired: bool = False  # JSON with 2.28.7/2.28.9's missing comma, repaired
    notes: list[str] = field(default_factory=list)
    #: Text: the numbers it states (JSON: probe/ras.py `counts_from_json` of the document).
    counts: RasCounts = field(default_factory=RasCounts)


def normalise_hash(text: str) -> str:
    """'0x3fbb9922cfecdb6e' and '3fbb9922cfecdb6e' -> '3fbb9922cfecdb6e'."""
    try:
        return f"{int(text, 16):016x}"
    except ValueError:
        return text.strip().lower()


# ------------------------------------------------------------------------------ JSON

# A value that ends a line, then a line that starts a key: valid JSON has a comma between.
_MISSING_COMMA = re.compile(
    r'(-?\d+|true|false|null|"[^"\n]*"|[}\]])([ \t]*\r?\n[ \t]*"[^"\n]*"\s*:)'
)


def repair_json(text: str) -> tuple[str, bool]:
    """(text with NCCL 2.28.7/2.28.9's missing commas restored, whether any was missing)."""
    fixed, count = _MISSING_COMMA.subn(r"\1,\2", text)
    return fixed, count > 0


def load_json(text: str) -> tuple[Any, bool]:
    """Parse, repairing the 2.28 defect if needed. Raises ValueError if it still fails."""
    try:
        return json.loads(text), False
    except ValueError as first:
        fixed, changed = repair_json(text)
        if not changed:
            raise
        try:
            return json.loads(fixed), True
        except ValueError:
            raise first from None


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def report_from_json(doc: Any, repaired: bool = False) -> RasReport:
    """A RasReport from a parsed `SET FORMAT json` document. Raises RasReportError."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("communicators"), list):
        raise RasReportError("no 'communicators' list: not a RAS JSON status report")
    report = RasReport(
        format="json",
        nccl_version=str(doc.get("nccl_version", "")),
        timestamp=str(doc.get("timestamp", "")),
        repaired=repaired,
    )
    ras = doc.get("ras")
    report.timeouts = _int(ras.get("timeouts_count"), 0) if isinstance(ras, Mapping) else 0
    if repaired:
        report.notes.append(
            f"NCCL {report.nccl_version or '2.28'} wrote JSON without the comma after a missing "
            "rank's nvml_dev (an NCCL 2.28.7/2.28.9 defect, fixed in 2.29.2); repaired"
        )
    seen_unresponsive: set[RasProcess] = set()
    seen_dead: set[RasProcess] = set()
    for entry in doc["communicators"]:
        if not isinstance(entry, Mapping):
            raise RasReportError("a communicator entry is not an object")
        comm = RasComm(
            hash=normalise_hash(str(entry.get("hash", "?"))), size=_int(entry.get("size"))
        )
        for rank in entry.get("ranks") or []:
            if not isinstance(rank, Mapping):
                continue
            number = _int(rank.get("rank"))
            comm.processes[number] = _process(rank)
            counts = rank.get("collective_counts")
            if isinstance(counts, Mapping):
                for op, value in counts.items():
                    comm.counts.setdefault(str(op), {})[number] = _int(value, 0)
            status = _mapping(rank.get("status"))
            for key in ("async_error", "init_state"):
                code = _int(status.get(key), 0)
                if code not in NOT_ERRORS:
                    comm.errors[number] = NCCL_RESULTS.get(code, f"NCCL error {code}")
            if status.get("abort_flag"):
                comm.status[number] = "ABORT"
            elif status.get("finalize_called") or status.get("destroy_flag"):
                comm.status[number] = "FINALIZE"
            elif _int(status.get("init_state"), 0) != 0:
                comm.status[number] = "INIT"
            else:
                comm.status[number] = "RUNNING"
        for rank in entry.get("missing_ranks") or []:
            if not isinstance(rank, Mapping):
                continue
            number = _int(rank.get("rank"))
            process = _process(rank)
            comm.processes[number] = process
            status = _mapping(rank.get("status"))
            if status.get("considered_dead"):
                comm.missing.add(number)
                comm.dead.add(number)
                seen_dead.add(process)
            elif status.get("unresponsive", True):
                comm.missing.add(number)
                seen_unresponsive.add(process)
            else:
                comm.left.add(number)
                comm.status[number] = "NOCOMM"
        comm.error_count = len(comm.errors)
        comm.missing_count = len(comm.missing)
        report.comms.append(comm)
    report.unresponsive_processes = sorted(seen_unresponsive - seen_dead, key=_order)
    report.dead_processes = sorted(seen_dead, key=_order)
    return report


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _process(rank: Mapping[str, Any]) -> RasProcess:
    cuda, nvml = _int(rank.get("cuda_dev")), _int(rank.get("nvml_dev"))
    gpu = "" if cuda < 0 else str(cuda) if nvml in (cuda, -1) else f"{cuda} (NVML {nvml})"
    host = str(rank.get("host", ""))
    return RasProcess(host="" if host == "unknown" else host, pid=_int(rank.get("pid")), gpu=gpu)


def _order(process: RasProcess) -> tuple[str, int]:
    return process.host, process.pid


# ------------------------------------------------------------------------------ text

_VERSION = re.compile(r"^NCCL version (\S+)")
_SUMMARY = re.compile(r"^\s*(\d+)\s+(\d+(?:-\d+)?)\s+(\d+(?:-\d+)?)\s+(\d+)\s+(\d+)\s*$")
_TABLE_ROW = re.compile(
    r"^\s*(?P<group>\d+)\s+(?P<comms>\d+)\s+\d+\s+\S+\s+(?P<size>\d+)\s+\d+\s+"
    r"(?P<status>\S+)\s+(?P<errors>\S+)\s*$"
)
_SECTION = re.compile(
    r"^#(?P<group>\d+)-(?P<index>\d+) \((?P<hash>[0-9a-fA-Fx]+)\) (?P<kind>[A-Z]+)\s*$"
)
_PROCESS_TAIL = re.compile(
    r" -- (?:GPU (?P<gpu>.+?) managed by process (?P<pid>\d+) on node (?P<host>\S+)"
    r"|\[process information not found\])\s*$"
)
_RANK = re.compile(r"^\s*Rank (?P<rank>\d+)(?P<what>.*?)(?: -- .*)?$")
_LIST = re.compile(r"^\s*The (?:missing|unknown) ranks?: (?P<ranks>[\d,\s]+)$")
_RANK_LIST_STATUS = re.compile(r"^\s*Rank (?P<ranks>[\d,]+) has status (?P<status>[A-Z]+)\s*$")
_DIFFERENT_COUNTS = re.compile(r"Communicator ranks have different (?P<op>\w+) operation counts")
_GROUP_COUNT = re.compile(
    r"^\s*(?P<n>\d+) ranks have (?:launched up to operation (?P<c>\d+)|not launched any operations)"
)
_ONE_COUNT = re.compile(
    r"^has (?:launched up to operation (?P<c>\d+)|not launched any operations)$"
)
_GROUP_STATUS = re.compile(r"^\s*(?P<n>\d+) ranks have status (?P<status>[A-Z]+)")
_ONE_STATUS = re.compile(r"^has status (?P<status>[A-Z]+)$")
_GROUP_ERROR = re.compile(r"^\s*(?P<n>\d+) ranks reported (?P<error>.+?)\s*$")
_ONE_ERROR = re.compile(r"^reported (?P<error>.+)$")
_MISSING_COUNT = re.compile(r"^\s*Missing communicator data from (?P<n>\d+) ranks?\s*$")
_ERROR_COUNT = re.compile(r"^\s*(?:Initialization|Asynchronous) errors? on (?P<n>\d+) ranks?")
_PEER = re.compile(
    r"^\s*Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>.+?)\s*$"
)
_TIMEOUTS = re.compile(r"Encountered (\d+) communication timeout")
# The numbers a text report states (RasCounts), read in the same pass as its structure.
_COMM_FLAG = re.compile(r"^#\d+-\d+ \([0-9a-fA-F]+\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_STATED_MISSING_RANKS = re.compile(r"Missing communicator data from (\d+) rank")
_STATED_MISSING_PROCESSES = re.compile(r"Missing communicator data from (\d+) job process")
_STATED_DEAD = re.compile(r"(\d+) job process(?:es)? (?:are|is) considered dead")
_FLAGGED = {
    "INCOMPLETE": "incomplete_communicators",
    "ERROR": "error_communicators",
    "MISMATCH": "mismatch_communicators",
}


@dataclass
class _Group:
    """One `N ranks have ...` line and the ranks listed under it."""

    value: Any
    size: int
    ranks: list[int] = field(default_factory=list)


def looks_like_text_report(text: str) -> bool:
    return (
        "Job summary" in text
        or ("Group" in text and "Comms" in text and "Ranks" in text)
        or "No communicator data collected" in text
        or bool(re.search(r"^#\d+-\d+ \([0-9a-fA-F]+\) [A-Z]+\s*$", text, re.M))
    )


def report_from_text(text: str) -> RasReport:
    """A RasReport from the text status report. Raises RasReportError if it is not one."""
    if not looks_like_text_report(text):
        raise RasReportError("not an NCCL RAS status report")
    report = RasReport(format="text")
    sizes: dict[int, int] = {}
    comms: dict[str, RasComm] = {}
    comm: RasComm | None = None
    kind = ""  # section kind, or INCOMPLETE/DEAD for the process lists at the top of Errors
    groups: dict[tuple[str, str], list[_Group]] = {}
    state = _State()
    stated = _Stated()
    in_table = in_summary = False
    for line in text.splitlines():
        stated.read(line)
        stripped = line.strip()
        if (m := _VERSION.match(line)) is not None:
            report.nccl_version = m.group(1)
            continue
        if stripped.startswith("(total)"):
            in_summary = True
            continue
        if in_summary:
            in_summary = False
            if (m := _SUMMARY.match(line)) is not None:
                report.total_processes = int(m.group(4))
                report.total_gpus = int(m.group(5))
                continue
        if stripped.startswith("Group") and "Comms" in stripped:
            in_table = True
            continue
        if in_table:
            if (m := _TABLE_ROW.match(line)) is not None:
                sizes[int(m["group"])] = int(m["size"])
                report.table.append((int(m["comms"]), int(m["size"]), m["status"], m["errors"]))
                continue
            if stripped.startswith("#") and "in group" in stripped:
                continue
            in_table = False
        if stripped in ("Errors", "Warnings", "INCOMPLETE", "DEAD", "TIMEOUT"):
            comm, kind, state = None, stripped, _State()
            continue
        if (m := _TIMEOUTS.search(line)) is not None:
            report.timeouts = int(m.group(1))
            continue
        if (m := _SECTION.match(stripped)) is not None:
            key = normalise_hash(m["hash"])
            comm = comms.get(key)
            if comm is None:
                comm = comms[key] = RasComm(
                    hash=key,
                    size=sizes.get(int(m["group"]), -1),
                    label=f"#{m['group']}-{m['index']}",
                )
            kind, state = m["kind"], _State()
            continue
        if not stripped:
            state.current = None
            continue
        if comm is None:
            peer = _PEER.match(line)
            if peer is not None and kind in ("INCOMPLETE", "DEAD"):
                process = RasProcess(peer["host"], int(peer["pid"]), peer["gpu"])
                target = report.dead_processes if kind == "DEAD" else report.unresponsive_processes
                target.append(process)
            continue
        _section_line(comm, kind, line, groups, state)
    for (key, function), listed in groups.items():
        _fill_unlisted(comms[key], function, listed)
    for comm in comms.values():
        comm.error_count = max(comm.error_count, len(comm.errors))
        comm.missing_count = max(comm.missing_count, len(comm.missing))
    report.comms = list(comms.values())
    report.counts = stated.counts()
    return report


class _Stated:
    """The numbers a text report states, line by line (its communicator table, the flagged
    communicators, the missing and dead counts of its Errors section)."""

    def __init__(self) -> None:
        self.found = RasCounts()
        self.in_table = False
        self.comms = 0

    def read(self, line: str) -> None:
        found = self.found
        if (m := _VERSION.match(line)) is not None:
            found.nccl_version = m.group(1)
        if line.lstrip().startswith("Group") and "Comms" in line:
            self.in_table = True
            return
        if self.in_table:
            if (row := _TABLE_ROW.match(line)) is not None:
                self.comms += int(row["comms"])
                return
            if line.strip().startswith("#") and "in group" in line:
                return  # the table's second header line
            if line.strip():
                self.in_table = False
        if "No communicator data collected" in line:
            self.comms = found.communicators = 0
        if (m := _COMM_FLAG.match(line.strip())) is not None:
            key = _FLAGGED[m.group(1)]
            setattr(found, key, getattr(found, key) + 1)
        elif (m := _STATED_MISSING_RANKS.search(line)) is not None:
            found.missing_ranks += int(m.group(1))
        elif (m := _STATED_MISSING_PROCESSES.search(line)) is not None:
            found.unresponsive_processes = int(m.group(1))
        elif (m := _STATED_DEAD.search(line)) is not None:
            found.dead_processes = int(m.group(1))
        elif (m := _TIMEOUTS.search(line)) is not None:
            found.timeouts = int(m.group(1))

    def counts(self) -> RasCounts:
        if self.comms:
            self.found.communicators = self.comms
        return self.found


@dataclass
class _State:
    """Where in a communicator section the parser is."""

    sub: str = ""  # "counts" | "status" | "errors"
    op: str = ""  # the function whose counts differ
    current: _Group | None = None  # the last `N ranks have ...` line


def _section_line(
    comm: RasComm,
    kind: str,
    line: str,
    groups: dict[tuple[str, str], list[_Group]],
    state: _State,
) -> None:
    if (m := _DIFFERENT_COUNTS.search(line)) is not None:
        state.sub, state.op, state.current = "counts", m["op"], None
        return
    if "Communicator ranks have different status" in line:
        state.sub, state.current = "status", None
        return
    if (m := _ERROR_COUNT.match(line)) is not None:
        state.sub, state.current = "errors", None
        comm.error_count += int(m["n"])
        return
    if (m := _MISSING_COUNT.match(line)) is not None:
        comm.missing_count = max(comm.missing_count, int(m["n"]))
        return
    if (m := _LIST.match(line)) is not None:
        ranks = [int(r) for r in re.split(r"[,\s]+", m["ranks"].strip()) if r]
        comm.missing.update(ranks)  # "unknown" (2.24/2.25 status): no data from them either
        return
    if (m := _RANK_LIST_STATUS.match(line)) is not None:  # 2.24/2.25 single unknown rank
        if m["status"] == "UNKNOWN":
            comm.missing.update(int(r) for r in m["ranks"].split(",") if r)
        return
    if state.sub == "counts" and (m := _GROUP_COUNT.match(line)) is not None:
        state.current = _Group(int(m["c"] or 0), int(m["n"]))
        groups.setdefault((comm.hash, state.op), []).append(state.current)
        return
    if state.sub == "status" and (m := _GROUP_STATUS.match(line)) is not None:
        state.current = _Group(m["status"], int(m["n"]))
        return
    if kind == "ERROR" and (m := _GROUP_ERROR.match(line)) is not None:
        state.current = _Group(m["error"], int(m["n"]))
        return
    rank_line = _RANK.match(line)
    if rank_line is None:
        return
    number = int(rank_line["rank"])
    tail = _PROCESS_TAIL.search(line)
    if tail is not None and tail["pid"] is not None:
        comm.processes[number] = RasProcess(tail["host"], int(tail["pid"]), tail["gpu"])
    what = rank_line["what"].strip()
    if kind == "INCOMPLETE":
        comm.missing.add(number)
    elif kind == "ERROR":
        one = _ONE_ERROR.match(what)
        error = one["error"] if one else state.current.value if state.current else ""
        comm.errors[number] = str(error or "error")
    elif state.sub == "counts":
        one = _ONE_COUNT.match(what)
        if one is not None:
            group = _Group(int(one["c"] or 0), 1, [number])
            groups.setdefault((comm.hash, state.op), []).append(group)
        elif state.current is not None:
            state.current.ranks.append(number)
    elif state.sub == "status":
        one = _ONE_STATUS.match(what)
        status = one["status"] if one else state.current.value if state.current else ""
        if status:
            comm.status[number] = str(status)
            if status == "NOCOMM":
                comm.left.add(number)


def _fill_unlisted(comm: RasComm, function: str, listed: list[_Group]) -> None:
    """Counts per rank from the groups; the one group printed without its ranks gets the
    members not named elsewhere (needs the communicator's size)."""
    counts = comm.counts.setdefault(function, {})
    for group in listed:
        for rank in group.ranks:
            counts[rank] = int(group.value)
    unlisted = [g for g in listed if len(g.ranks) < g.size]
    if not unlisted:
        return
    absent = comm.missing | comm.left
    rest = [r for r in range(comm.size) if r not in counts and r not in absent]
    if (
        len(unlisted) == 1
        and comm.size > 0
        and len(rest) == unlisted[0].size - len(unlisted[0].ranks)
    ):
        for rank in rest:
            counts[rank] = int(unlisted[0].value)
        return
    for group in unlisted:
        comm.unnamed.append((function, group.size - len(group.ranks), int(group.value)))


# ------------------------------------------------------------------------------ both


def parse_report(raw: str, fmt: str | None = None) -> RasReport:
    """A report in either format (`fmt` "json"/"text", or None to decide from the text).

    Raises RasReportError / ValueError when it is neither."""
    if fmt == "json" or (fmt is None and raw.lstrip().startswith("{")):
        doc, repaired = load_json(raw)
        return report_from_json(doc, repaired)
    return report_from_text(raw)
