"""What the benchmarks read of a running process from /proc (Linux), in one place."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all its threads) process `pid` used so far; 0.0 where
    /proc is not there (not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (empty where /proc is not there)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(child) for child in listed.read().split()]
    except OSError:
        return []


def children_cpu_seconds(pid: int) -> dict[int, float]:
    """Each live child process of `pid` and the CPU time it used so far (`cpu_seconds`)."""
    return {child: cpu_seconds(child) for child in children(pid)}
