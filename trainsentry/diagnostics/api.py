"""`analyze(paths)`: read whatever the job left behind and return a `Report`.

This is what `trainsentry analyze` prints and what the gateway calls on a hang alert.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from trainsentry.diagnostics.hang import DEFAULT_MIN_IDLE_S, analyze_hangs, membership_note
from trainsentry.diagnostics.mismatch import analyze_mismatches
from trainsentry.diagnostics.model import InputError, Trace
from trainsentry.diagnostics.ras_hang import analyze_ras
from trainsentry.diagnostics.readers import detect_format, list_inputs, read_trace
from trainsentry.diagnostics.report import Report, decide_verdict
from trainsentry.diagnostics.slow import DEFAULT_ALPHA, DEFAULT_MIN_LAG_MS, analyze_slow
from trainsentry.diagnostics.topology import Topology, load_topology_file

FORMATS = ("auto", "fr", "megatrace", "ras")

Progress = Callable[[int, int], None]


class AnalyzeError(ValueError):
    """Nothing could be analysed (no inputs, or every input failed)."""


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
) -> Report:
    """Analyse trace files or directories of them.

    Waits are measured against when each dump was taken: `captured_at_ns` if given, else a
    sidecar `<dump>.captured_at_ns`, else the file's mtime (Flight Recorder), never the
    clock of this call.

    `workers` bounds the processes used to parse large Flight Recorder inputs (default: one
    per CPU from 64 files / 32 MB on; 1 keeps everything in this process).

    Unreadable files are listed in `Report.errors` and the rest is still analysed; only
    when nothing at all can be read does this raise `AnalyzeError`.
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
    if topology is None:
        for config in config_files:
            topology = load_topology_file(config)
            if topology is not None:
                break
    chosen, rejected = (format, []) if format != "auto" else detect_format(files)
    readable = [f for f in files if f not in {r for r, _ in rejected}]
    trace = read_trace(
        chosen,
        readable,
        topology,
        progress,
        total=len(files),
        workers=workers,
        captured_at_ns=captured_at_ns,
    )
    for path, reason in [*rejected, *((p, "no such file or directory") for p in absent)]:
        trace.inputs.append(str(path))
        trace.errors.append(InputError(str(path), reason))
    if trace.topology is None:
        trace.topology = topology
    if not trace.streams and not trace.ras and not trace.reports_read:
        details = "; ".join(f"{e.path}: {e.message}" for e in trace.errors[:5])
        raise AnalyzeError(
            f"no readable trace data ({details})" if details else "no readable trace data"
        )
    return _report(trace, min_idle_s, alpha, min_lag_ms, started)


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
    hang = analyze_ras(trace) if trace.format == "ras" else analyze_hangs(trace, min_idle_s)
    mismatch = analyze_mismatches(trace)
    slow = analyze_slow(trace, alpha, min_lag_ms)
    notes = list(trace.notes)
    notes.extend(hang.notes)
    without_input = _ranks_without_input(trace)
    if without_input:
        notes.insert(
            0,
            f"rank(s) {_listed(without_input)} left no readable {_WHAT.get(trace.format, 'input')}"
            ": what they did is unknown",
        )
    for stuck in hang.hangs:
        note = membership_note(stuck)
        if note is not None:
            notes.append(note)
    for candidate in hang.too_recent:
        notes.append(
            f"{candidate.comm}: rank(s) {list(candidate.missing_ranks)[:8]} had not reached "
            f"seq {candidate.seq} when the capture ended {candidate.waited_s or 0:.4f} s later "
            f"(< {min_idle_s} s idle): end of log, not a hang"
        )
    ranks = set(trace.ranks_with_data)
    for comm in trace.communicators.values():
        ranks.update(comm.ranks)
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
        captured_from=list(trace.captured_from),
        ranks_without_input=without_input,
    )


_WHAT = {"fr": "Flight Recorder dump", "megatrace": "Megatrace log"}


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
