"""NCCL RAS status reports (text, `SET FORMAT json`, or a probe's `/ras` snapshot), plus the
probes' `/status` JSON that maps RAS processes to global ranks.

Parsing is `trainsentry.probe.ras_report` (the probe reads the same reports live); see its
docstring for the formats NCCL 2.24 to 2.30 write and the 2.28.7/2.28.9 JSON defect. Here:

- Snapshots. Reports are ordered by their JSON `timestamp` when every one has it, else as
  given (files in a directory by name). One communicator (its hash) seen in several reports
  is one communicator: the latest report's state counts, and it is `progressed` when its
  slowest rank launched more operations in the last report than in the first, or when the
  latest report no longer flags it (text lists only communicators with a problem; JSON
  lists all, so a communicator absent there is gone).
- Global ranks. RAS ranks are communicator ranks. A process is mapped to its global rank
  only by a probe's status (`pid` + one of `host_ips` equal to RAS's node address). A
  communicator as large as the job is not taken for the world: RAS's job summary counts
  the processes it reached, so a group of the job can be as large as that count, and its
  ranks are no global ranks (group B's rank 2 is not global rank 2).
- Healthy text reports name no communicator; each table row's communicators are kept
  under a placeholder name (`group0-1`) so the report counts and reads as ok.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsentry.diagnostics.model import InputError, RasCommunicator, Trace
from trainsentry.diagnostics.ras_hang import comm_state
from trainsentry.probe.ras_report import (
    RasComm,
    RasReport,
    RasReportError,
    load_json,
    looks_like_text_report,
    report_from_json,
    report_from_text,
)
from trainsentry.probe.ras_verdict import judge_comm


class RasFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ProbeIdentity:
    """What a probe's /status says about its process."""

    rank: int
    pod: str
    node: str


# ------------------------------------------------------------------ one file


def _is_probe_status(doc: Any) -> bool:
    return (
        isinstance(doc, Mapping)
        and "pid" in doc
        and "rank" in doc
        and ("host_ips" in doc or "pod" in doc)
        and "communicators" not in doc
    )


def probe_statuses(doc: Any) -> list[Mapping[str, Any]]:
    """Pure: the probe status objects in a document (one, a list, or rank -> status)."""
    if _is_probe_status(doc):
        return [doc]
    if isinstance(doc, Mapping) and isinstance(doc.get("status"), Mapping):
        doc = doc["status"]
    values: Iterable[Any] = (
        doc.values() if isinstance(doc, Mapping) else doc if isinstance(doc, list) else []
    )
    return [d for d in values if _is_probe_status(d)]


def parse_ras_document(text: str, source: str) -> tuple[RasReport | None, list[Mapping[str, Any]]]:
    """Pure: (the RAS report in a file, probe statuses in it). Raises RasFormatError."""
    if not text.lstrip().startswith(("{", "[")):
        try:
            return report_from_text(text), []
        except RasReportError as exc:
            raise RasFormatError(f"{source}: {exc}") from exc
    try:
        doc, repaired = load_json(text)
    except ValueError as exc:
        raise RasFormatError(f"{source}: corrupt JSON ({exc})") from exc
    probes = probe_statuses(doc)
    if probes:
        return None, probes
    if isinstance(doc, Mapping) and isinstance(doc.get("raw"), str) and "format" in doc:
        # A probe's /ras snapshot: the report as the probe received it.
        raw = doc["raw"]
        if not raw.strip():
            raise RasFormatError(
                f"{source}: probe RAS snapshot without a report ({doc.get('error')})"
            )
        return parse_ras_document(raw, source)
    try:
        return report_from_json(doc, repaired), []
    except (RasReportError, TypeError, ValueError, AttributeError) as exc:
        raise RasFormatError(f"{source}: {exc} (is this `SET FORMAT json` output?)") from exc


def parse_ras_json(doc: Any, source: str) -> list[RasCommunicator]:
    """Pure: the communicators of one parsed JSON report. Raises RasFormatError."""
    try:
        report = report_from_json(doc)
    except (RasReportError, TypeError, ValueError, AttributeError) as exc:
        raise RasFormatError(f"{source}: {exc}") from exc
    return merge_reports([report], [])[0]


def looks_like_ras(head: str) -> bool:
    return (
        ('"communicators"' in head and '"nccl_version"' in head)
        or looks_like_text_report(head)
        or ('"raw"' in head and '"server_protocol"' in head)
    )


def looks_like_probe_status(head: str) -> bool:
    return '"pid"' in head and '"host_ips"' in head and '"communicators"' not in head


# ------------------------------------------------------------------ merge (pure)


def _identity_map(statuses: list[Mapping[str, Any]]) -> dict[tuple[str, int], ProbeIdentity]:
    out: dict[tuple[str, int], ProbeIdentity] = {}
    for status in statuses:
        try:
            pid, rank = int(status["pid"]), int(status["rank"])
        except (KeyError, TypeError, ValueError):
            continue
        who = ProbeIdentity(rank, str(status.get("pod") or ""), str(status.get("node") or ""))
        for ip in status.get("host_ips") or []:
            out[(str(ip), pid)] = who
    return out


def _identities(
    comm: RasComm, probes: dict[tuple[str, int], ProbeIdentity]
) -> dict[int, ProbeIdentity]:
    """Pure: communicator rank -> the probe naming its process (pid and node address)."""
    out = {}
    for rank, process in comm.processes.items():
        who = probes.get((process.host, process.pid)) if process.pid >= 0 else None
        if who is not None:
            out[rank] = who
    return out


def _lowest(comm: RasComm) -> dict[str, int]:
    absent = comm.missing | comm.left
    out = {}
    for op, counts in comm.counts.items():
        present = [c for r, c in counts.items() if r not in absent]
        if present:
            out[op] = min(present)
    return out


def _order(reports: list[RasReport]) -> list[RasReport]:
    if reports and all(r.timestamp for r in reports):
        return sorted(reports, key=lambda r: r.timestamp)
    return reports


def _stuck(comm: RasComm) -> bool:
    return judge_comm(
        comm.size, comm.counts, comm.missing, comm.dead, comm.left, comm.errors, comm.unnamed
    ).stuck


def _progress(
    key: str, history: list[tuple[RasComm, RasReport]], latest: RasReport | None
) -> tuple[bool | None, str]:
    """Pure: (progressed, note) of one communicator over its snapshots. None: one snapshot
    and still in the latest report, so nothing to compare."""
    first, (last, report) = history[0][0], history[-1]
    gone = latest is not None and report is not latest
    if len(history) == 1 and not gone:
        return None, ""
    before, after = _lowest(first), _lowest(last)
    moved = sorted(
        (op, before[op], after[op]) for op in before if op in after and after[op] > before[op]
    )
    was_stuck = _stuck(first) or _stuck(last)
    if moved:
        op, a, b = moved[0]
        note = (
            f"communicator {key}: its slowest rank's {op} count went {a} -> {b} over "
            f"{len(history)} RAS snapshots: progressing, not hung"
        )
        return True, note if was_stuck else ""
    if gone:
        note = f"communicator {key}: no longer flagged in the latest RAS snapshot: not hung"
        return True, note if was_stuck else ""
    note = f"communicator {key}: no progress over {len(history)} RAS snapshots" + (
        f" ({history[0][1].timestamp} to {report.timestamp})" if report.timestamp else ""
    )
    return False, note if was_stuck else ""


def merge_reports(
    reports: list[RasReport], statuses: list[Mapping[str, Any]]
) -> tuple[list[RasCommunicator], list[str]]:
    """Pure: communicators over all snapshots (latest state, progress), and notes."""
    ordered = _order(reports)
    probes = _identity_map(statuses)
    notes = [n for r in ordered for n in r.notes]
    seen: dict[str, list[tuple[RasComm, RasReport]]] = {}
    for report in ordered:
        for comm in report.comms:
            seen.setdefault(comm.hash, []).append((comm, report))
    latest = ordered[-1] if ordered else None
    out: list[RasCommunicator] = []
    for key, history in seen.items():
        comm, report = history[-1]
        progressed, note = _progress(key, history, latest)
        if note:
            notes.append(note)
        out.append(_communicator(comm, _identities(comm, probes), len(history), progressed))
        notes.extend(_comm_notes(comm))
    if latest is not None and latest.format == "text":
        named = {c.label for c in latest.comms}
        for group, (count, size, _status, _errors) in enumerate(latest.table):
            for index in range(count):
                if f"#{group}-{index}" not in named:
                    out.append(RasCommunicator(hash=f"group{group}-{index}", size=size))
    return out, notes


def _communicator(
    comm: RasComm,
    identities: dict[int, ProbeIdentity],
    snapshots: int,
    progressed: bool | None,
) -> RasCommunicator:
    majority = {
        op: Counter(values.values()).most_common(1)[0][0]
        for op, values in comm.counts.items()
        if values
    }
    return RasCommunicator(
        hash=comm.hash,
        size=comm.size,
        counts={op: dict(v) for op, v in comm.counts.items()},
        majority=majority,
        missing_ranks=tuple(sorted(comm.missing)),
        dead_ranks=tuple(sorted(comm.dead)),
        error_ranks=tuple(sorted(comm.errors)),
        processes={r: (p.host, p.pid, p.gpu) for r, p in comm.processes.items()},
        left_ranks=tuple(sorted(comm.left)),
        errors=dict(comm.errors),
        global_ranks={r: who.rank for r, who in identities.items()},
        identities={r: (who.pod, who.node) for r, who in identities.items()},
        unnamed_groups=tuple(comm.unnamed),
        snapshots=snapshots,
        progressed=progressed,
    )


def _comm_notes(comm: RasComm) -> list[str]:
    """Pure: what one communicator's report leaves open (who left, whom it does not name).
    The processes themselves are named by the analysis (`ras_hang`)."""
    notes = []
    if comm.left:
        notes.append(
            f"communicator {comm.hash}: rank(s) {sorted(comm.left)} answered without this "
            "communicator (left it, e.g. during teardown, or not yet joined): not missing"
        )
    if comm.missing_count > len(comm.missing):
        notes.append(
            f"communicator {comm.hash}: {comm.missing_count} rank(s) sent no data, "
            f"{len(comm.missing)} named (the text report lists only outliers; VERBOSE STATUS "
            "lists more)"
        )
    state = judge_comm(
        comm.size, comm.counts, comm.missing, comm.dead, comm.left, comm.errors, comm.unnamed
    )
    if state.unnamed_behind:
        notes.append(
            f"communicator {comm.hash}: {state.unnamed_behind} rank(s) have not launched "
            f"{state.op} {state.seq} but the text report does not name them and their counts "
            "are unknown (plain STATUS lists few outliers; VERBOSE STATUS or JSON names them)"
        )
    return notes


def state_notes(trace: Trace, reports: int) -> list[str]:
    """Pure: what the counts cannot tell (one snapshot; one rank ahead of the rest)."""
    notes = []
    stuck = [c for c in trace.ras if not c.progressed and comm_state(c).stuck]
    if stuck and reports == 1:
        notes.append(
            "one RAS snapshot: a difference in operation counts can also be the skew of a "
            "running job; two snapshots some seconds apart tell a stall from progress"
        )
    for comm in stuck:
        state = comm_state(comm)
        if state.mismatch:
            notes.append(
                f"communicator {comm.hash}: the ranks launched different collectives (each is "
                f"behind the others on some function): a collective mismatch; rank(s) "
                f"{list(state.behind)} launched what the {len(state.arrived)} others never did, "
                f"and have not launched {state.op} {state.seq} they wait in"
            )
        elif state.behind and not state.arrived:
            notes.append(
                f"communicator {comm.hash}: every rank is behind the others on some function: "
                "they disagree on which collective comes next (a collective mismatch), and no "
                "group of ranks with equal counts is larger than the others: every rank is named"
            )
        elif state.ahead_minority:
            notes.append(
                f"communicator {comm.hash}: only rank(s) {list(state.arrived)} are ahead, having "
                f"launched {state.op} {state.seq}; the {len(state.behind)} others have not: they "
                "are held up elsewhere, or the ranks ahead issued a collective the others never "
                "will (RAS cannot tell which)"
            )
    return notes


# ------------------------------------------------------------------ I/O


def read_nccl_ras(paths: list[Path], on_file: Callable[[], None] | None = None) -> Trace:
    """Read RAS reports and probe statuses; merge snapshots; name the culprit processes."""
    trace = Trace(format="ras")
    reports: list[RasReport] = []
    statuses: list[Mapping[str, Any]] = []
    for path in paths:
        trace.inputs.append(str(path))
        try:
            report, found = parse_ras_document(path.read_text(encoding="utf-8"), str(path))
        except UnicodeDecodeError:
            trace.errors.append(
                InputError(
                    str(path),
                    "not an NCCL RAS report (ncclras text or JSON) or probe status: the file "
                    "is not UTF-8 text",
                )
            )
        except (OSError, RasFormatError) as exc:
            trace.errors.append(InputError(str(path), str(exc)))
        else:
            if report is not None:
                reports.append(report)
            statuses.extend(found)
        if on_file is not None:
            on_file()
    if not reports:
        return trace
    trace.ras, notes = merge_reports(reports, statuses)
    trace.notes.extend(notes)
    trace.reports_read = len(reports)
    if not trace.ras:
        trace.notes.append(
            f"NCCL RAS: {len(reports)} report(s) read, none names a communicator (ncclras says "
            "'No communicator data collected!' when no process it reached holds an NCCL "
            "communicator: not created yet, or already destroyed). No collective to diagnose: "
            "verdict ok means RAS saw no collective, not that the job is healthy"
        )
        gone = {p.describe(): "dead" for r in reports for p in r.dead_processes}
        for r in reports:
            for p in r.unresponsive_processes:
                gone.setdefault(p.describe(), "unresponsive")
        if gone:
            listed = "; ".join(f"{who} ({state})" for who, state in list(gone.items())[:8])
            trace.notes.append(
                f"NCCL RAS: {len(gone)} job process(es) unreachable, with no communicator left "
                f"to place them in: {listed}"
            )
    trace.ranks_with_data = {g for c in trace.ras for g in c.global_ranks.values()}
    trace.notes.extend(state_notes(trace, len(reports)))
    return trace
