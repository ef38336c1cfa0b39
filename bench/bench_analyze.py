"""Benchmark: `trainsentry analyze` vs PyTorch's `fr_trace` on the same Flight Recorder dumps.

Synthetic NCCL-style dumps (default 1,024 ranks x 2,000 entries, pickle, torch 2.13's
format) in which one rank never issued the last collective. Each tool runs as its own
process, in alternating pairs (trainsentry, then fr_trace, --pairs times) so both see the
same machine load; we report both verdicts, wall time, CPU time and peak RSS (medians over
the pairs), the ratios of the medians and each pair's wall-time ratio. Then the real
Megatrace sample (target < 2 s).

    .venv/bin/python -m bench.bench_analyze [--ranks 1024] [--entries 2000] [--pairs 3]

`--scale 1024,4096,16384` instead measures `trainsentry analyze --json` on a hung
Megatron-style job (`trainsentry.diagnostics.synthetic_megatron`: TP 8, PP 16,
DP = N / 128, 2,000 entries per rank, torch's JSON dump as the probe serves it, ~1.3 MB a
rank; one rank never issues its DP gradient all_reduce, the rest block behind it) at each
size: wall time, CPU time and peak memory of the whole process tree (the command and its
worker processes, sampled every 0.1 s), and whether the verdict names the culprit. The
baseline in the same run is the same command with `--all-entries` (every entry of every
dump read, as before newest-entries reading) at the sizes in `--baseline` (default 1024).
Dumps are written under `--data` (default /tmp/trainsentry-bench-analyze) and kept for the
next run unless `--clean`.

Not run by the test suite. Needs torch (for fr_trace).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.megatrace_sample import unpack as unpack_megatrace

OURS = """
import json, sys
from trainsentry.diagnostics import analyze
report = analyze([sys.argv[1]])
hang = report.to_dict()["hang"]
print(json.dumps({"verdict": report.verdict,
                  "missing_ranks": hang["missing_ranks"] if hang else []}))
"""


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    stdout: str


def run_measured(argv: list[str]) -> Run:
    """Run a child process; wall time, its own CPU time and peak RSS from wait4."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}):\n{out[-2000:]}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out)


def fr_trace_missing(output: str) -> list[int]:
    found = re.search(r"missing ranks: \{([\d, ]+)\}", output)
    return sorted(int(x) for x in found.group(1).split(",")) if found else []


@dataclass
class TreeRun:
    wall_s: float
    cpu_s: float
    peak_tree_mb: float
    report: dict[str, object]


def run_tree(argv: list[str]) -> TreeRun:
    """Run a command; wall time, CPU time of it and its children, and the peak of the summed
    RSS of its process tree (sampled every 0.1 s: the analyzer forks its workers)."""
    import threading

    import psutil

    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        parent = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                total = parent.memory_info().rss
                for child in parent.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        total += child.memory_info().rss
                peak = max(peak, total)
            except psutil.Error:
                pass
            done.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, _status, usage = os.wait4(proc.pid, 0)
    done.set()
    thread.join()
    wall = time.perf_counter() - started
    cpu = usage.ru_utime + usage.ru_stime
    return TreeRun(wall, cpu, peak / 2**20, json.loads(out))


def scale(args: argparse.Namespace) -> int:
    from trainsentry.diagnostics import synthetic_megatron

    sizes = [int(x) for x in args.scale.split(",")]
    baseline = {int(x) for x in args.baseline.split(",") if x}
    data = Path(args.data)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    rows = []
    for world in sizes:
        culprit = synthetic_megatron.default_culprit(world)
        folder = data / f"megatron_{world}_{args.entries}"
        marker = folder / ".complete"
        if not marker.exists():
            shutil.rmtree(folder, ignore_errors=True)
            t0 = time.perf_counter()
            written = synthetic_megatron.write_dumps(
                str(folder), world, args.entries, culprit, workers=os.cpu_count() or 1
            )
            marker.write_text("")
            print(
                f"{world} ranks: wrote {written / 2**30:.1f} GB "
                f"in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
        runs = [("newest entries", [])]
        if world in baseline:
            runs.append(("--all-entries (baseline)", ["--all-entries"]))
        for label, extra in runs:
            cmd = [sys.executable, "-m", "trainsentry", "analyze", "--json", *extra, str(folder)]
            load = os.getloadavg()[0]
            run = run_tree(cmd)
            named = run.report.get("culprit_ranks") == [culprit]
            rows.append((world, label, run, named, load))
            print(
                f"{world:>6} ranks, {label}: {run.wall_s:.1f} s wall, {run.cpu_s:.1f} s CPU, "
                f"peak {run.peak_tree_mb:.0f} MB (tree), verdict {run.report.get('verdict')}, "
                f"culprit {run.report.get('culprit_ranks')} (expected [{culprit}]: "
                f"{'named' if named else 'NOT named'}), load average {load:.1f}",
                flush=True,
            )
        if args.clean:
            shutil.rmtree(folder, ignore_errors=True)
    print()
    print("| ranks | read | wall | CPU | peak RSS (tree) | names the culprit |")
    print("|---|---|---|---|---|---|")
    for world, label, run, named, _ in rows:
        print(
            f"| {world:,} | {label} | {run.wall_s:.1f} s | {run.cpu_s:.1f} s | "
            f"{run.peak_tree_mb / 1024:.2f} GB | {'yes' if named else 'no'} |"
        )
    return 0 if all(named for *_, named, _ in rows) else 1


def median(runs: list[Run], attr: str) -> float:
    return float(statistics.median(getattr(r, attr) for r in runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--missing-rank", type=int, default=517, help="taken modulo --ranks")
    parser.add_argument("--repeats", type=int, default=3, help="Megatrace sample runs")
    parser.add_argument(
        "--pairs", type=int, default=3, help="alternating (trainsentry, fr_trace) pairs"
    )
    parser.add_argument("--scale", default="", help="e.g. 1024,4096,16384 (see the doc)")
    parser.add_argument("--baseline", default="1024", help="--scale sizes also run whole")
    parser.add_argument("--data", default="/tmp/trainsentry-bench-analyze")
    parser.add_argument("--clean", action="store_true", help="delete --scale dumps after")
    args = parser.parse_args()
    if args.scale:
        return scale(args)
    args.missing_rank %= args.ranks

    from trainsentry.diagnostics.synthetic import write_dumps

    workdir = Path(tempfile.mkdtemp(prefix="bench_analyze_"))
    try:
        t0 = time.perf_counter()
        write_dumps(workdir, args.ranks, args.entries, "hang", args.missing_rank)
        size_mb = sum(p.stat().st_size for p in workdir.iterdir()) / 2**20
        print(
            f"dumps: {args.ranks} ranks x {args.entries} entries, rank {args.missing_rank} "
            f"skips the last collective ({size_mb:.0f} MB pickle, written in "
            f"{time.perf_counter() - t0:.1f} s)"
        )
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

        ours: list[Run] = []
        theirs: list[Run] = []
        for pair in range(args.pairs):
            ours.append(run_measured([sys.executable, "-c", OURS, str(workdir)]))
            theirs.append(
                run_measured(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.flight_recorder.fr_trace",
                        str(workdir),
                    ]
                )
            )
            a, b = ours[-1], theirs[-1]
            print(
                f"pair {pair + 1}: trainsentry {a.wall_s:.2f} s wall, {a.cpu_s:.2f} s CPU; "
                f"fr_trace {b.wall_s:.2f} s wall, {b.cpu_s:.2f} s CPU; "
                f"ratio {b.wall_s / a.wall_s:.1f}x",
                flush=True,
            )
        our_result = json.loads(ours[-1].stdout.strip().splitlines()[-1])
        their_missing = fr_trace_missing(theirs[-1].stdout)
        print()
        print(f"{'':24}{'trainsentry':>14}{'fr_trace':>14}{'ratio':>10}")
        print(f"{'verdict':24}{our_result['verdict']:>14}{'missing ranks':>14}")
        print(f"{'missing ranks':24}{our_result['missing_ranks']!s:>14}{their_missing!s:>14}")
        for label, attr in (
            ("wall time (s, median)", "wall_s"),
            ("CPU time (s, median)", "cpu_s"),
            ("peak RSS (MB, median)", "peak_rss_mb"),
        ):
            a, b = median(ours, attr), median(theirs, attr)
            print(f"{label:24}{a:>14.2f}{b:>14.2f}{b / a:>9.1f}x")
        same = our_result["missing_ranks"] == their_missing == [args.missing_rank]
        speedup = median(theirs, "wall_s") / median(ours, "wall_s")
        cpu_speedup = median(theirs, "cpu_s") / median(ours, "cpu_s")
        rss_ok = median(ours, "peak_rss_mb") < 2048
        print(
            f"\nsame missing rank: {same}; >= 10x faster: wall {speedup:.1f}x, "
            f"CPU {cpu_speedup:.1f}x; < 2 GB: {rss_ok}"
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    with tempfile.TemporaryDirectory() as sample_dir:
        from trainsentry.diagnostics import analyze

        megatrace = unpack_megatrace(Path(sample_dir))

        walls, cpus = [], []
        for _ in range(args.repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            report = analyze([megatrace])
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        top = report.slow.slow_ranks[0] if report.slow.slow_ranks else None
        print(
            f"\nMegatrace sample: verdict {report.verdict}, top slow rank "
            f"{top.rank if top else None} (p={top.p_value if top else None}), "
            f"wall median {statistics.median(walls):.2f} s, CPU median "
            f"{statistics.median(cpus):.2f} s (target < 2 s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
