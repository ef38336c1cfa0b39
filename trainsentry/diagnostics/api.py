"""`analyze(paths)`: read whatever the job left behind and return a `Report`.

This is what `trainsentry analyze` prints and what the gateway calls on a hang alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from trainsentry.diagnostics.hang import (
    DEFAULT_MIN_IDLE_S,
    HangAnalysis,
    analyze_hangs,
    membership_note,
)
from trainsentry.diagnostics.mismatch import analyze_mismatches
from trainsentry.diagnostics.model import InputError, Trace
from trainsentry.diagnostics.ras_hang import analyze_ras
from trainsentry.diagnostics.readers import detect_format, list_inputs, misfits, read_trace
from trainsentry.diagnostics.report import Report, decide_verdict
from trainsentry.diagnostics.slow import DEFAULT_ALPHA, DEFAULT_MIN_LAG_MS, analyze_slow
from trainsentry.diagnostics.topology import Topology, TopologyMismatchError, load_topology_file

FORMATS = ("auto", "fr", "megatrace", "ras")

Progress = Callable[[int, int], None]


class AnalyzeError(ValueError):
    """Nothing could be analysed (no inputs, or every input failed)."""


class CaptureTimeError(ValueError):
    """The capture time the caller gave is before the dumps' own last event: impossible (a
    dump is taken after what it records), so it is refused rather than silently replaced
    (which measured every wait as zero and called a real hang "ok")."""

    def __init__(self, given_ns: int, last_event_ns: int) -> None:
        self.given_ns = given_ns
        self.last_event_ns = last_event_ns
        super().__init__(
            f"the capture time {iso_utc(given_ns)} is before the dumps' last recorded event "
            f"({iso_utc(last_event_ns)})"
        )


def iso_utc(ns: int) -> str:
    """Pure: nanoseconds since the epoch as `2026-11-24T21:30:00.123Z`."""
    from datetime import UTC, datetime

    moment = datetime.fromtimestamp(ns / 1e9, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def analyze(
    paths: Iterable[str | Path],
    *,
    format: str = "auto",
    topology: Topology | None = None,
    min_idle_s: float = DEFAULT_MIN_IDLE_S,
    alpha: float = DEFAULT_ALPHA,
    min_lag_ms: float = DEFAULT_MIN_LAG_MS,
    progress: Progress | None = None,
    workers: int | None = None,
    captured_at_ns: int | None = None,
    in_place: bool = False,
    newest_bytes: int | None = None,
) -> Report:
    """Analyse trace files or directories of them.

    Waits are measured against when each dump was taken: `captured_at_ns` if given, else a
    sidecar `<dump>.captured_at_ns`, else, with `in_place=True` (the files are where the job
    or the probe's collector wrote them, not copies), the file's mtime; never the clock of
    this call. Without any of these (copied Flight Recorder dumps: torch's dumps carry no
    capture time) a wait is unknown and the report gives what the entries show instead.

    `workers` bounds the processes used to parse large Flight Recorder inputs (default: one
    per CPU from 64 files / 32 MB on; 1 keeps everything in this process).

    `newest_bytes`: how much of each large JSON Flight Recorder dump is read, from its
    newest entry back (see `readers.fr_newest`): None (default) reads every entry while the
    input is at most 512 MB in all and the newest 128 KiB of each dump above that; 0 reads
    every entry whatever the size. Ranks read in part are `Report.partial_ranks`.

    Unreadable files are listed in `Report.errors` and the rest is still analysed; only
    when nothing at all can be read does this raise `AnalyzeError`. A `captured_at_ns`
    before the latest event the inputs record raises `CaptureTimeError`.
    """
    if format not in FORMATS:
        raise AnalyzeError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    started = time.perf_counter()
    given = [Path(p) for p in paths]
    absent = [p for p in given if not p.exists()]
    files, config_files = list_inputs([p for p in given if p.exists()])
    if not files:
        why = f": {', '.join(map(str, absent))} does not exist" if absent else ""
        raise AnalyzeError(f"no input files found{why}")
    topology_source = "--topology"
    if topology is None:
        for config in config_files:
            topology = load_topology_file(config)
            if topology is not None:
                topology_source = str(config)
                break
    chosen, rejected = (
        detect_format(files) if format == "auto" else (format, misfits(format, files))
    )
    readable = [f for f in files if f not in {r for r, _ in rejected}]
    trace = read_trace(
        chosen,
        readable,
        topology,
        progress,
        total=len(files),
        workers=workers,
        captured_at_ns=captured_at_ns,
        in_place=in_place,
        newest_bytes=newest_bytes,
    )
    if captured_at_ns is not None and trace.last_event_ns > captured_at_ns:
        raise CaptureTimeError(captured_at_ns, trace.last_event_ns)
    for path, reason in [*rejected, *((p, "no such file or directory") for p in absent)]:
        trace.inputs.append(str(path))
        trace.errors.append(InputError(str(path), reason))
    if trace.topology is None:
        trace.topology = topology
    if topology is not None and trace.format != "ras":
        _check_topology(trace, topology, topology_source)
    if not trace.streams and not trace.ras and not trace.reports_read:
        details = "; ".join(f"{e.path}: {e.message}" for e in trace.errors[:5])
        raise AnalyzeError(
            f"no readable trace data ({details})" if details else "no readable trace data"
        )
    return _report(trace, min_idle_s, alpha, min_lag_ms, started)


def _check_topology(trace: Trace, topology: Topology, source: str) -> None:
    """Pure: raise TopologyMismatchError when the layout cannot be this job's (its world
    size differs from the one the trace states, or a rank lies beyond it)."""
    stated = trace.world_size
    if stated is not None and stated != topology.world_size:
        why = f"the job has {stated} ranks (its dumps say so)"
    elif trace.world_floor > topology.world_size:
        why = f"the input names rank {trace.world_floor - 1}"
    else:
        return
    given = f"--topology {topology.tp},{topology.pp},{topology.dp}"
    where = given if source == "--topology" else f"the topology in {source}"
    raise TopologyMismatchError(
        f"{where} ({topology.describe()}) is {topology.world_size} ranks, but {why}"
    )


def analyze_trace(
    trace: Trace,
    *,
    min_idle_s: float = DEFAULT_MIN_IDLE_S,
    alpha: float = DEFAULT_ALPHA,
    min_lag_ms: float = DEFAULT_MIN_LAG_MS,
) -> Report:
    """The pure half of `analyze`: a Trace already in memory to a Report."""
    return _report(trace, min_idle_s, alpha, min_lag_ms, time.perf_counter())


def _report(
    trace: Trace, min_idle_s: float, alpha: float, min_lag_ms: float, started: float
) -> Report:
    mismatch = analyze_mismatches(trace)
    mismatch_at: dict[str, int] = {}
    for m in mismatch.mismatches:
        if m.kind != "state":
            mismatch_at[m.comm] = min(m.seq, mismatch_at.get(m.comm, m.seq))
    hang = (
        analyze_ras(trace)
        if trace.format == "ras"
        else analyze_hangs(trace, min_idle_s, mismatch_at)
    )
    slow = analyze_slow(trace, alpha, min_lag_ms, mismatch_at)
    notes = list(trace.notes)
    notes.extend(hang.notes)
    notes.extend(_wait_notes(trace, hang))
    without_input = _ranks_without_input(trace)
    if without_input:
        notes.insert(
            0,
            f"rank(s) {_listed(without_input)} left no readable {_WHAT.get(trace.format, 'input')}"
            ": what they did is unknown",
        )
    if hang.unread_ranks:
        notes.insert(
            0,
            f"the waits lead to rank(s) {_listed(hang.unread_ranks)}, whose own data was not "
            "read: whether they are stuck or waiting on someone else is unknown, so the "
            "verdict does not name them",
        )
    for stuck in hang.hangs:
        note = membership_note(stuck)
        if note is not None:
            notes.append(note)
    for after in hang.after_mismatch:
        notes.append(
            f"{after.comm}: rank(s) {list(after.missing_ranks)[:8]} had not reached seq "
            f"{after.seq}, {after.seq - mismatch_at[after.comm]} collective(s) after the "
            f"mismatch at seq {mismatch_at[after.comm]} that the job ran past: from the "
            "mismatch on, equal sequence numbers name different operations; not a hang of "
            "its own"
        )
    for candidate in hang.too_recent:
        notes.append(
            f"{candidate.comm}: rank(s) {list(candidate.missing_ranks)[:8]} had not reached "
            f"seq {candidate.seq} when the capture ended {candidate.waited_s or 0:.4f} s later "
            f"(< {min_idle_s} s idle): end of log, not a hang"
        )
    ranks = set(trace.ranks_with_data)
    for comm in trace.communicators.values():
        ranks.update(comm.ranks)
    # RAS: ranks of the largest communicator where no probe maps processes to global ranks.
    ranks.update(range(max((c.size for c in trace.ras), default=0)))
    return Report(
        verdict=decide_verdict(hang, mismatch, slow),
        format=trace.format,
        hang=hang,
        mismatch=mismatch,
        slow=slow,
        gaps=trace.gaps,
        inputs=trace.inputs,
        errors=trace.errors,
        topology=trace.topology,
        communicators=len(trace.communicators) or len(trace.ras),
        ranks=len(ranks),
        notes=notes,
        elapsed_s=time.perf_counter() - started,
        captured_at_ns=trace.capture_end_ns if trace.format == "fr" else 0,
        last_event_ns=trace.last_event_ns if trace.format == "fr" else 0,
        captured_from=list(trace.captured_from),
        ranks_without_input=without_input,
        partial_ranks=sorted(trace.partial_ranks),
    )


_WHAT = {"fr": "Flight Recorder dump", "megatrace": "Megatrace log"}


def _wait_notes(trace: Trace, hang: HangAnalysis) -> list[str]:
    """Pure: what a wait without a capture time means, when a hang or p2p wait needs one."""
    unknown = [h for h in hang.hangs if h.waited_s is None and h.waited_at_least_s is not None]
    unknown_p2p = [w for w in hang.p2p_waits if w.waited_s is None]
    if trace.format != "fr" or not (unknown or unknown_p2p):
        return []
    bound = max([h.waited_at_least_s or 0.0 for h in unknown] or [0.0])
    return [
        "no capture time for these dumps (copied files have the copy's time, and torch's "
        "dumps carry none): the waiting ranks waited at least "
        f"{bound:.2f} s before the last event any rank recorded, how much longer is unknown, "
        "and a snapshot of a running job would look the same. Give the time the dumps were "
        "taken (--captured-at, or a <dump>.captured_at_ns file beside each dump), or "
        "--in-place if these are the files the job itself wrote"
    ]


def _listed(ranks: list[int], limit: int = 16) -> str:
    shown = ", ".join(map(str, ranks[:limit]))
    return shown + (f", ... (+{len(ranks) - limit})" if len(ranks) > limit else "")


def _ranks_without_input(trace: Trace) -> list[int]:
    """Pure: ranks of the job (per the communicators' known membership) with no data."""
    if trace.format == "ras":
        return []
    known: set[int] = set()
    for comm in trace.communicators.values():
        # The world's ranks are 0..n-1: every rank below one seen is certainly in the job.
        if comm.membership_known or comm.desc == "default_pg":
            known.update(comm.ranks)
    return sorted(known - trace.ranks_with_data)
