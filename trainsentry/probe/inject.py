"""The probe injected into a training image that does not carry it (docs/probe.md, "Installed").

The operator's admission webhook gives a TrainingJob's pods an init container running
`trainsentry probe install /trainsentry-probe` in the trainsentry image. `install` copies
into that emptyDir:

    /trainsentry-probe/bootstrap/sitecustomize.py   the start-up hook (`injected/`)
    /trainsentry-probe/lib/trainsentry/...          the probe: trainsentry/__init__.py and
                                                    trainsentry/probe/*.py
    /trainsentry-probe/lib/prometheus_client/...    its one dependency (pure Python)

and the training container gets `PYTHONPATH=/trainsentry-probe/bootstrap`, so its Python
imports the hook at start-up, which starts the probe in each training rank
(`bootstrap_decision`, `bootstrap`). The webhook reads the layout from here (`PROBE_MOUNT`,
`BOOTSTRAP_PATH`, `INSTALL_ARGS`, `DUMP_MOUNT`): one home for it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import TextIO

from trainsentry.probe.identity import DEFAULT_DUMP_DIR

PROBE_MOUNT = "/trainsentry-probe"
BOOTSTRAP_PATH = f"{PROBE_MOUNT}/bootstrap"
INSTALL_ARGS = ("probe", "install", PROBE_MOUNT)
#: The Flight Recorder dump folder's volume: the probe's default dump folder's parent.
DUMP_MOUNT = os.path.dirname(DEFAULT_DUMP_DIR)
#: Set in a process whose probe runs: a Python process it starts does not start another.
OWNER_ENV = "TRAINSENTRY_PROBE_PID"

HOOK = Path(__file__).with_name("injected") / "sitecustomize.py"
# `python -m X` / a script named X that starts the ranks rather than being one.
LAUNCHERS = frozenset(
    {"torchrun", "torch.distributed.run", "torch.distributed.launch", "trainsentry.probe.launch"}
)
_ON = {"1", "true", "yes", "on"}
# Interpreter options that take a value as the next argument.
_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def _copy_python_tree(src: Path, dst: Path) -> int:
    """Copies the `.py` files (and `py.typed`) of a package folder; returns how many."""
    count = 0
    for path in sorted(src.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        if path.suffix != ".py" and path.name != "py.typed":
            continue
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        count += 1
    return count


def install(dest: Path) -> dict[str, int]:
    """Copies the hook, the probe and prometheus_client under `dest` (the layout above);
    returns the number of files per part. Files are world-readable: the training container
    may run as any user."""
    import prometheus_client

    import trainsentry

    package = Path(trainsentry.__file__).parent
    lib = dest / "lib"
    bootstrap = dest / "bootstrap"
    for folder in (lib / "trainsentry", bootstrap):
        folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(package / "__init__.py", lib / "trainsentry" / "__init__.py")
    counts = {
        "probe": _copy_python_tree(package / "probe", lib / "trainsentry" / "probe") + 1,
        "prometheus_client": _copy_python_tree(
            Path(prometheus_client.__file__).parent, lib / "prometheus_client"
        ),
    }
    shutil.copyfile(HOOK, bootstrap / "sitecustomize.py")
    counts["hook"] = 1
    for root, dirs, files in os.walk(dest):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
    return counts


def entry_point(argv: Sequence[str]) -> str:
    """Pure: what a Python command line runs: `module:<name>`, `script:<file name>`,
    `command` (-c), or `interactive`. `argv` is `sys.orig_argv` (the interpreter first)."""
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "-m":
            return f"module:{args[0]}" if args else "interactive"
        if arg.startswith("-m") and len(arg) > 2:
            return f"module:{arg[2:]}"
        if arg == "-c" or (arg.startswith("-c") and len(arg) > 2):
            return "command"
        if arg in _WITH_VALUE:
            args = args[1:]
            continue
        if arg == "-" or not arg.startswith("-"):
            return f"script:{os.path.basename(arg)}"
    return "interactive"


def bootstrap_decision(env: Mapping[str, str], argv: Sequence[str], pid: int) -> tuple[bool, str]:
    """Pure: whether the start-up hook starts a probe in this process, and why (not).

    A probe per training rank: the process must be asked to (TRAINSENTRY_PROBE=1), be a rank
    (RANK or LOCAL_RANK set: torchrun's workers, a PyTorchJob's `python train.py`), not be a
    launcher that starts the ranks (torchrun, `-m torch.distributed.run`, our own launcher,
    which starts the probe itself), and not be a child of a process whose probe runs
    (OWNER_ENV, e.g. a data loader started with `spawn`): those would take the rank's port.
    """
    if env.get("TRAINSENTRY_PROBE", "").strip().lower() not in _ON:
        return False, "TRAINSENTRY_PROBE is not 1"
    owner = env.get(OWNER_ENV, "")
    if owner and owner != str(pid):
        return False, f"process {owner} runs this pod's probe for this rank"
    name = entry_point(argv).partition(":")[2]
    if name.removesuffix(".py") in LAUNCHERS:
        return False, f"{name} starts the ranks; each rank starts its own probe"
    if not (env.get("RANK") or env.get("LOCAL_RANK")):
        return False, "not a training rank (neither RANK nor LOCAL_RANK is set)"
    return True, "a training rank"


def bootstrap(
    env: MutableMapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
    stderr: TextIO | None = None,
) -> bool:
    """The hook's work: start this process's probe if `bootstrap_decision` says so, mark the
    environment (OWNER_ENV) and say so in one line on stderr. True if a probe runs."""
    env = os.environ if env is None else env
    argv = list(getattr(sys, "orig_argv", sys.argv)) if argv is None else argv
    out = sys.stderr if stderr is None else stderr
    start, why = bootstrap_decision(env, argv, os.getpid())
    if not start:
        if env.get("TRAINSENTRY_PROBE_VERBOSE", "").strip().lower() in _ON:
            out.write(f"trainsentry: no probe in this process: {why}\n")
        return False
    import trainsentry.probe

    probe = trainsentry.probe.start()
    if probe is None:
        out.write("trainsentry: the probe did not start (see the warning above)\n")
        return False
    env[OWNER_ENV] = str(os.getpid())
    out.write(
        f"trainsentry: probe started for rank {probe.config.rank} of "
        f"{probe.config.namespace}/{probe.config.trainingjob} on port {probe.port}\n"
    )
    return True
