"""Rank processes of a multi-process test job, one OS process per rank."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence


def run_ranks(
    script: str, world: int, args: Sequence[str], env: Mapping[str, str], timeout_s: float
) -> list[int]:
    """Runs `python script --rank R *args` for every rank as its own process (one rank's
    abort must not kill the others), with `env` over this process's environment; returns
    their exit codes, a rank still running `timeout_s` after the start killed (one deadline
    for the whole job: a hung job costs `timeout_s`, not `timeout_s` per rank). Their stderr
    is this process's, so a rank's error shows with the test's output (it went to a pipe no
    one read, which could also fill and stop a rank that wrote much)."""
    full_env = {**os.environ, **env}
    procs = [
        subprocess.Popen(
            [sys.executable, script, "--rank", str(rank), *args],
            env=full_env,
            stdout=subprocess.DEVNULL,
        )
        for rank in range(world)
    ]
    deadline = time.monotonic() + timeout_s
    codes = []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        codes.append(proc.returncode)
    return codes
