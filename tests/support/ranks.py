"""Rank processes of a multi-process test job, one OS process per rank."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence


def run_ranks(
    script: str, world: int, args: Sequence[str], env: Mapping[str, str], timeout_s: float
) -> list[int]:
    """Runs `python script --rank R *args` for every rank as its own process (one rank's
    abort must not kill the others), with `env` over this process's environment; returns
    their exit codes, a rank still running after `timeout_s` killed."""
    full_env = {**os.environ, **env}
    procs = [
        subprocess.Popen(
            [sys.executable, script, "--rank", str(rank), *args],
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for rank in range(world)
    ]
    codes = []
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        codes.append(proc.returncode)
    return codes
