"""trainsentry's start-up hook in an instrumented pod (docs/probe.md, "Installed").

The operator's admission webhook copies the probe into an emptyDir (`trainsentry probe
install`) and puts this file's folder first on the training container's PYTHONPATH. Python
imports `sitecustomize` once at start-up, from the first folder of `sys.path` holding one,
before any user code, so before `torch.distributed` is initialised. This hook:

1. runs the image's own `sitecustomize`, if it has one (the next one on `sys.path`), so an
   image that relies on it keeps working;
2. appends the copied probe (`../lib`) to the END of `sys.path`: the image's own packages
   (its trainsentry, its prometheus_client) win over the copies;
3. starts the probe in a training rank (`trainsentry.probe.inject.bootstrap` decides which
   process is one).

Nothing here raises: a failure writes one line to stderr and the program runs on. The file
is plain enough for any Python from 3.6 on to read, so an older interpreter than the probe's
gets a clear line instead of a syntax error.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB = os.path.join(os.path.dirname(_HERE), "lib")
_NEEDS = (3, 11)  # the probe's requires-python (pyproject.toml)


def _chain_to_the_images_own() -> None:
    try:
        import importlib.machinery
        import importlib.util

        rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # what Python itself does with a failing sitecustomize
        sys.stderr.write(f"trainsentry: the image's sitecustomize failed: {exc!r}\n")


def _start_the_probe() -> None:
    wanted = os.environ.get("TRAINSENTRY_PROBE", "").strip().lower() in ("1", "true", "yes", "on")
    if not wanted:
        return
    if sys.version_info < _NEEDS:
        have = f"{sys.version_info[0]}.{sys.version_info[1]}"
        sys.stderr.write(
            f"trainsentry: probe not started: it needs Python {_NEEDS[0]}.{_NEEDS[1]} or "
            f"newer, this is {have}\n"
        )
        return
    if _LIB not in sys.path:
        sys.path.append(_LIB)
    try:
        from trainsentry.probe import inject
    except ImportError as exc:  # the image's own, older trainsentry won: its launcher works
        sys.stderr.write(
            f"trainsentry: probe not started by the injected hook ({exc!r}); the image's own "
            "trainsentry starts it through its launcher or trainsentry.probe.start()\n"
        )
        return
    try:
        inject.bootstrap()
    except Exception as exc:
        sys.stderr.write(f"trainsentry: probe not started: {exc!r}\n")


_chain_to_the_images_own()
_start_the_probe()
