"""`trainsentry analyze`: name the hung collective, the missing rank and the slow ranks."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainsentry.diagnostics.hang import CommHang
    from trainsentry.diagnostics.report import Report

HELP = "diagnose a hang, mismatch or slow rank from Flight Recorder / Megatrace / NCCL RAS"

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_USAGE = 2
EXIT_HANG = 3
EXIT_MISMATCH = 4
EXIT_SLOW = 5
_VERDICT_EXIT = {"ok": EXIT_OK, "hang": EXIT_HANG, "mismatch": EXIT_MISMATCH, "slow": EXIT_SLOW}

DESCRIPTION = f"""\
Read what a training job left behind and say which collective hung, which rank(s) never
arrived (root cause vs. victims), which ranks disagree about a collective, and which
ranks are slow, with a p-value.

PATH is one or more files or directories:
  - PyTorch Flight Recorder dumps (one file per rank, pickle or JSON, rank = trailing
    number of the file name),
  - Megatrace NCCL logs (rank_N.log; a config.yaml beside them gives TP/PP/DP),
  - NCCL RAS output (`ncclras` text or `ncclras -f json`, or a probe's /ras answer),
    with, optionally, the probes' /status JSON to name global ranks and pods.
Files that cannot be read are reported by name; the others are still analysed.

Exit codes:
  {EXIT_OK}  analysed, nothing wrong found (verdict ok)
  {EXIT_UNREADABLE}  nothing could be analysed (no readable input)
  {EXIT_USAGE}  usage error (also: a --captured-at before the dumps' own last event)
  {EXIT_HANG}  verdict hang
  {EXIT_MISMATCH}  verdict mismatch
  {EXIT_SLOW}  verdict slow
"""

PROGRESS_MIN_FILES = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories")
    parser.add_argument(
        "--format",
        choices=("auto", "fr", "megatrace", "ras"),
        default="auto",
        help="input format (default: detect from the files)",
    )
    parser.add_argument(
        "--topology",
        metavar="TP,PP,DP",
        help="parallel layout, e.g. 2,4,1 (default: config.yaml if present)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--captured-at",
        default=None,
        metavar="TIME",
        help="when the dumps were taken: ISO 8601 with a time zone (2026-11-24T21:30:00Z) or "
        "seconds since the epoch; waits are measured against it (default: a "
        "<dump>.captured_at_ns file beside each dump, else --in-place's file times, else "
        "unknown: copied dumps say only how long the ranks waited before the last event)",
    )
    when.add_argument(
        "--captured-at-ns",
        type=int,
        default=None,
        metavar="NS",
        help="the same in nanoseconds since the epoch",
    )
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="the dumps are the files the job itself wrote (not copies): each file's "
        "modification time is when it was taken",
    )
    parser.add_argument(
        "--all-entries",
        action="store_true",
        help="read every entry of every Flight Recorder dump (default: all of them up to "
        "512 MB of input, above that the newest 128 KiB of each dump)",
    )
    parser.add_argument(
        "--min-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long ranks must have waited before a hang is called (default: 2)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="significance level for slow ranks after Holm correction (default: 1e-3)",
    )
    parser.add_argument(
        "--min-lag-ms",
        type=float,
        default=None,
        help="smallest median lag that counts as slow (default: 1 ms)",
    )


def run(args: argparse.Namespace) -> int:
    from trainsentry.diagnostics.api import AnalyzeError, CaptureTimeError, analyze, iso_utc
    from trainsentry.diagnostics.hang import DEFAULT_MIN_IDLE_S
    from trainsentry.diagnostics.slow import DEFAULT_ALPHA, DEFAULT_MIN_LAG_MS
    from trainsentry.diagnostics.topology import (
        TopologyError,
        TopologyMismatchError,
        parse_topology,
    )

    try:
        topology = parse_topology(args.topology) if args.topology else None
        captured_at_ns = args.captured_at_ns
        if args.captured_at is not None:
            captured_at_ns = parse_time_ns(args.captured_at)
        if captured_at_ns is not None and captured_at_ns <= 0:
            raise ValueError("--captured-at must be after the epoch")
    except ValueError as exc:
        print(f"trainsentry analyze: {exc}", file=sys.stderr)
        return EXIT_USAGE
    options = {
        "format": args.format,
        "topology": topology,
        "min_idle_s": DEFAULT_MIN_IDLE_S if args.min_idle is None else args.min_idle,
        "alpha": DEFAULT_ALPHA if args.alpha is None else args.alpha,
        "min_lag_ms": DEFAULT_MIN_LAG_MS if args.min_lag_ms is None else args.min_lag_ms,
        "captured_at_ns": captured_at_ns,
        "in_place": args.in_place,
        "newest_bytes": 0 if args.all_entries else None,
    }
    try:
        report = _analyze_with_progress(analyze, args.paths, options)
    except CaptureTimeError as exc:
        given = args.captured_at if args.captured_at is not None else args.captured_at_ns
        flag = "--captured-at" if args.captured_at is not None else "--captured-at-ns"
        message = (
            f"{flag} {given} is before the dumps' last recorded event "
            f"({iso_utc(exc.last_event_ns)}): a dump is taken after what it records; give "
            f"the time they were taken, or leave {flag} out"
        )
        if args.json:
            print(json.dumps({"verdict": None, "error": message}))
        print(f"trainsentry analyze: {message}", file=sys.stderr)
        return EXIT_USAGE
    except TopologyMismatchError as exc:
        if args.json:
            print(json.dumps({"verdict": None, "error": str(exc)}))
        print(f"trainsentry analyze: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (AnalyzeError, TopologyError) as exc:
        if args.json:
            print(json.dumps({"verdict": None, "error": str(exc)}))
        print(f"trainsentry analyze: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_summary(report)
    return _VERDICT_EXIT[report.verdict]


def parse_time_ns(text: str) -> int:
    """Pure: `2026-11-24T21:30:00Z` / `...+08:00` (ISO 8601 with a zone) or seconds since
    the epoch, to nanoseconds since the epoch. Raises ValueError (a time without a zone is
    ambiguous: the dumps' clock and this machine's zone need not agree)."""
    from datetime import datetime

    value = text.strip()
    try:
        return round(float(value) * 1e9)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(
            f"--captured-at {text!r}: expected ISO 8601 (2026-11-24T21:30:00Z) or seconds "
            "since the epoch"
        ) from exc
    if moment.tzinfo is None:
        raise ValueError(
            f"--captured-at {text!r} has no time zone: add Z (UTC) or an offset such as +08:00"
        )
    return round(moment.timestamp() * 1e9)


def _analyze_with_progress(analyze: object, paths: list[str], options: dict[str, object]) -> Report:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from trainsentry.diagnostics.api import analyze as analyze_fn

    count = sum(
        sum(1 for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else 1
        for path in paths
    )
    if count < PROGRESS_MIN_FILES:
        return analyze_fn(paths, **options)  # type: ignore[arg-type]
    console = Console(stderr=True)
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("reading traces", total=count)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return analyze_fn(paths, progress=advance, **options)  # type: ignore[arg-type]


def _ranks(ranks: list[int] | tuple[int, ...], limit: int = 16) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:limit])
    more = len(ranks) - limit
    return shown + (f", ... (+{more})" if more > 0 else "") if ranks else "none"


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:,.1f} s"


def _waiting(report: Report, hang: CommHang) -> str:
    """Pure: who waits in the hang and for how long, saying what the time is measured to."""
    waiting = [r for r in hang.arrived_ranks if r not in hang.not_started_ranks]
    count = len(waiting)
    space = "" if hang.rank_space == "global" else f"{hang.rank_space} "
    who = (
        f"{space}rank{'s' if count != 1 else ''} {_ranks(waiting)} wait{'s' if count == 1 else ''}"
    )
    if hang.waited_s is not None:
        source = ", ".join(report.captured_from) or "the end of the logs"
        return f"{who}: waited {_seconds(hang.waited_s)} until the capture ({source})"
    if hang.waited_at_least_s is not None:
        return (
            f"{who}: waited at least {_seconds(hang.waited_at_least_s)} before the last recorded "
            "event; how much longer is unknown (no capture time: see notes)"
        )
    return f"{who}: for how long is unknown ({report.format} records no times)"


_ROLES = {
    "root_cause": "root cause",
    "victim": "victim",
    "remote_error": "reported a remote error",
}


def _print_processes(console: Any, report: Report) -> None:
    """NCCL RAS: the processes the verdict is about, each with its place per communicator."""
    for process in report.hang.processes[:10]:
        colour = "bold red" if process.role == "root_cause" else "bold"
        console.print(f"  {_ROLES[process.role]}: [{colour}]{process.describe()}[/]")
        for place in process.places[:8]:
            console.print(
                f"    rank {place.rank} of communicator {place.communicator} "
                f"({place.size} ranks): {place.what}"
            )
        if process.role != "victim":
            console.print(f"    {process.meaning}")


def _missing(hang: CommHang) -> str:
    """Pure: the hang's missing ranks in words, with the members nothing names (a count, or
    "unknown" when not even the group's size is known)."""
    missing = _ranks(hang.missing_ranks)
    if hang.unidentified is None and not hang.missing_ranks:
        return "unknown (group membership unknown, see notes)"
    if hang.unidentified:
        return (
            f"{missing if hang.missing_ranks else ''}"
            f"{' + ' if hang.missing_ranks else ''}"
            f"{hang.unidentified} unnamed (group membership unknown, see notes)"
        )
    return missing


def _print_hang(console: Any, report: Report, primary: CommHang) -> None:
    """The primary hang: the collective, who is missing and who waits, root causes and
    victims, then what else the hang analysis found (skipped collectives, ranks without a
    dump, other communicators stuck behind it)."""
    console.print(
        f"[bold]hang[/] on {primary.comm} ({primary.desc or 'no description'}) at seq "
        f"{primary.seq}: {primary.op}"
    )
    if primary.not_started_ranks:
        console.print(
            f"  every rank enqueued it; never started on rank(s): "
            f"[bold red]{_ranks(primary.not_started_ranks)}[/]"
        )
    space = "" if primary.rank_space == "global" else f"{primary.rank_space} "
    console.print(f"  missing {space}ranks: {_missing(primary)}")
    console.print(f"  {_waiting(report, primary)}")
    roots = report.hang.root_cause_ranks
    victims = report.hang.victim_ranks
    if roots or report.format != "ras":
        console.print(
            f"  root cause rank(s): [bold red]{_ranks(roots)}[/]"
            + (f"; victims: {_ranks(victims)}" if victims else "")
        )
    _print_processes(console, report)
    if report.hang.skipped_ranks:
        console.print(
            f"  rank(s) {_ranks(report.hang.skipped_ranks)} skipped a collective and moved "
            "on; the ranks waiting for them are victims"
        )
    if primary.no_dump_ranks:
        console.print(f"  no dump from rank(s): {_ranks(primary.no_dump_ranks)}")
    others = [h for h in report.hang.hangs if h is not primary]
    if others:
        console.print(f"  {len(others)} other communicator(s) stuck as a consequence")


def _print_mismatches(console: Any, report: Report) -> None:
    """The first 10 mismatches as a table; its title counts all of them."""
    from rich.table import Table

    table = Table(title=f"mismatches ({report.mismatch.total} sequence numbers)")
    for column in ("communicator", "seq", "kind", "culprit ranks", "expected", "found"):
        table.add_column(column)
    for m in report.mismatch.mismatches[:10]:
        culprits = _ranks(m.culprit_ranks) + (" (ambiguous)" if m.ambiguous else "")
        table.add_row(m.comm, str(m.seq), m.kind, culprits, m.expected, m.found)
    console.print(table)


def _print_slow_ranks(console: Any, report: Report) -> None:
    """The first 10 slow ranks as a table (communicators by their description where they
    have one), then the first 10 late ranks that are victims of a slow rank's pipeline."""
    from rich.table import Table

    table = Table(title="slow ranks (last to arrive more often than chance)")
    for column in ("rank", "p-value (Holm)", "median lag ms", "last / ops", "communicators"):
        table.add_column(column)
    for s in report.slow.slow_ranks[:10]:
        p_text = f"{s.p_value:.2g}" if s.p_value > 0 else f"<= 1e{s.log10_p_bound:.0f}"
        named = [
            desc or comm
            for comm, desc in zip(s.communicators, s.descriptions or s.communicators, strict=False)
        ]
        table.add_row(
            str(s.rank),
            p_text,
            f"{s.lag_ms:.2f}",
            f"{s.last_count}/{s.ops}",
            ", ".join(named),
        )
    console.print(table)
    for v in report.slow.victims[:10]:
        console.print(
            f"  rank {v.rank} is late too ({v.lag_ms:.2f} ms) but sits in slow "
            f"rank {v.victim_of}'s pipeline: a victim, not a cause"
        )


def print_summary(report: Report) -> None:
    """Print the report for a person: the verdict line, then each part only when it has
    something to say, always in this order: the hang, the mismatches, the slow ranks, the
    ring-buffer gaps, the notes and the files that could not be read."""
    from rich.console import Console

    console = Console()
    colour = {"ok": "green", "hang": "red", "mismatch": "red", "slow": "yellow"}[report.verdict]
    topo = f", {report.topology.describe()}" if report.topology else ""
    console.print(
        f"[bold {colour}]verdict: {report.verdict}[/]  "
        f"({report.format}, {report.ranks} ranks, {report.communicators} "
        f"communicators{topo}, {report.elapsed_s:.2f} s)"
    )
    primary = report.primary_hang
    if primary is not None:
        _print_hang(console, report, primary)
    if report.mismatch.mismatches:
        _print_mismatches(console, report)
    if report.slow.slow_ranks:
        _print_slow_ranks(console, report)
    if report.gaps:
        ranks = sorted({g.rank for g in report.gaps})
        console.print(
            f"ring-buffer gaps: {len(report.gaps)} on rank(s) {_ranks(ranks)} "
            "(history lost, not a hang)"
        )
    for note in report.notes[:10]:
        console.print(f"note: {note}")
    for error in report.errors:
        console.print(f"[red]error[/]: {error.path}: {error.message}")
