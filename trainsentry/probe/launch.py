"""Launcher hook: start the probe when TRAINSENTRY_PROBE=1, then run the training script.

    TRAINSENTRY_PROBE=1 torchrun --nproc-per-node 8 -m trainsentry.probe.launch train.py ARGS
    TRAINSENTRY_PROBE=1 python -m trainsentry.probe.launch -m my.training.module ARGS

The probe starts before the script runs, i.e. before `init_process_group`, so it can still
switch the Flight Recorder on (TORCH_FR_BUFFER_SIZE) for the process groups the script
creates. Without TRAINSENTRY_PROBE=1 the script runs untouched.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m trainsentry.probe.launch (SCRIPT | -m MODULE) [ARGS...]"


def maybe_start() -> None:
    """Start the probe if the environment asks for it (also usable from sitecustomize)."""
    if os.environ.get("TRAINSENTRY_PROBE", "").strip().lower() in {"1", "true", "yes", "on"}:
        import trainsentry.probe

        trainsentry.probe.start()


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(USAGE, file=sys.stderr)
        return 2
    maybe_start()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
