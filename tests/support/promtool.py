"""Running Prometheus' `promtool` (on PATH) and capturing what it says."""

from __future__ import annotations

import subprocess
from pathlib import Path


def promtool(
    *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS...` with its output captured as text; never raises on a non-zero exit."""
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
