"""Readers: trace files on disk to a `Trace`. Format detection sniffs each file's head."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from trainsentry.diagnostics.model import Trace
from trainsentry.diagnostics.topology import Topology

_CONFIG_NAMES = frozenset({"config.yaml", "config.yml"})
_HEAD_BYTES = 4096
#: A probe's /status JSON: not a trace, but maps NCCL RAS processes to global ranks.
PROBE_STATUS = "probe-status"


def list_inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(trace files, topology config files) under the given files and directories."""
    from trainsentry.diagnostics.readers.flight_recorder import CAPTURED_AT_SUFFIX

    files: list[Path] = []
    configs: list[Path] = []
    for path in paths:
        candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for candidate in candidates:
            if any(
                part.startswith(".")
                for part in candidate.relative_to(path if path.is_dir() else candidate.parent).parts
            ):
                continue
            if candidate.name.endswith(CAPTURED_AT_SUFFIX):
                continue  # a dump's capture time, read beside the dump
            if candidate.name in _CONFIG_NAMES:
                configs.append(candidate)
            else:
                files.append(candidate)
    return files, configs


def sniff(path: Path) -> str | None:
    """The format of one file from its first bytes, or None."""
    from trainsentry.diagnostics.readers.flight_recorder import looks_like_flight_recorder
    from trainsentry.diagnostics.readers.megatrace import looks_like_megatrace
    from trainsentry.diagnostics.readers.nccl_ras import looks_like_probe_status, looks_like_ras

    try:
        with path.open("rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError:
        return None
    if looks_like_flight_recorder(head):
        return "fr"
    text = head.decode("utf-8", errors="replace")
    if looks_like_megatrace(text):
        return "megatrace"
    if looks_like_ras(text):
        return "ras"
    if looks_like_probe_status(text):
        return PROBE_STATUS
    return None


#: What each format is, for error messages.
FORMAT_NAMES = {
    "fr": "a PyTorch Flight Recorder dump (pickle or JSON, one file per rank)",
    "megatrace": "a Megatrace NCCL log (one rank_N.log per rank)",
    "ras": "an NCCL RAS report (ncclras text or JSON, or a probe's /ras answer)",
    PROBE_STATUS: "a probe's /status JSON",
}


def misfits(format: str, files: list[Path]) -> list[tuple[Path, str]]:
    """Files that plainly are another format than the one the caller named, with the reason
    (naming what was expected and what the file looks like). Files the sniffer does not
    recognise are left to the reader, whose errors say what it expected."""
    out = []
    for f in files:
        kind = sniff(f)
        if kind is None or kind == format or (format == "ras" and kind == PROBE_STATUS):
            continue
        out.append(
            (
                f,
                f"--format {format} expects {FORMAT_NAMES[format]}, but this file looks like "
                f"{FORMAT_NAMES[kind]}",
            )
        )
    return out


def detect_format(files: list[Path]) -> tuple[str, list[tuple[Path, str]]]:
    """(format most files are in, files that are not in it with the reason)."""
    kinds = {f: sniff(f) for f in files}
    counts = Counter(k for k in kinds.values() if k is not None and k != PROBE_STATUS)
    if not counts:
        return "fr", [
            (f, "not a recognised trace (Flight Recorder, Megatrace or NCCL RAS)") for f in files
        ]
    chosen = counts.most_common(1)[0][0]
    rejected = []
    for f, kind in kinds.items():
        if kind is None:
            rejected.append((f, "not a recognised trace (Flight Recorder, Megatrace or NCCL RAS)"))
        elif kind == PROBE_STATUS:
            if chosen != "ras":
                rejected.append((f, "a probe's status: used only with NCCL RAS input; skipped"))
        elif kind != chosen:
            rejected.append((f, f"looks like {kind}, but this input is {chosen}; skipped"))
    return chosen, rejected


def read_trace(
    format: str,
    files: list[Path],
    topology: Topology | None = None,
    progress: Callable[[int, int], None] | None = None,
    total: int | None = None,
    workers: int | None = None,
    captured_at_ns: int | None = None,
    in_place: bool = False,
    newest_bytes: int | None = None,
) -> Trace:
    done = 0
    count = total if total is not None else len(files)

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, count)

    if format == "megatrace":
        from trainsentry.diagnostics.readers.megatrace import read_megatrace

        return read_megatrace(files, topology, on_file=tick)
    if format == "ras":
        from trainsentry.diagnostics.readers.nccl_ras import read_nccl_ras

        trace = read_nccl_ras(files, on_file=tick)
    else:
        from trainsentry.diagnostics.readers.flight_recorder import read_flight_recorder

        trace = read_flight_recorder(
            files,
            on_file=tick,
            workers=workers,
            topology=topology,
            captured_at_ns=captured_at_ns,
            in_place=in_place,
            newest_bytes=newest_bytes,
        )
    trace.topology = topology
    return trace
