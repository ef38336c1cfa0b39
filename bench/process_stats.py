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
