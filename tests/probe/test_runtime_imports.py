"""The probe's poll thread imports torch's recorder module (torch._C._distributed_c10d) while
the training script may still be importing torch: Python takes a dotted module's import
locks child first, a package's own import parent first, and breaks the inverted order by
failing one of the two imports (a real 4-rank gloo job's rank died of _DeadlockError in
`from torch._C import *`). A package built like torch's, slow to import, shows it: without
the package first, its import fails (ImportError, partly initialised `_C`)."""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path

import pytest

from trainsentry.probe.runtime import import_from_thread

# torch/__init__.py does `from torch._C import *` after other work; _C's submodule is what
# the probe asks for.
INIT = """\
import builtins
builtins.{name}_inside.set()
import time
time.sleep(0.3)  # the rest of the package's import: the probe's thread asks meanwhile
from {name}._C import VALUE
"""


def test_a_thread_importing_a_submodule_during_the_packages_import_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "slow_pkg_like_torch"
    (tmp_path / name / "_C").mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text(INIT.format(name=name))
    # torch._C's initialisation imports modules of torch, which ask for torch itself
    (tmp_path / name / "_C" / "__init__.py").write_text(f"import {name}\nVALUE = 1\n")
    (tmp_path / name / "_C" / "_distributed.py").write_text("RECORDERS = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    inside = threading.Event()
    monkeypatch.setattr("builtins." + name + "_inside", inside, raising=False)
    found: list[object] = []

    def poll() -> None:
        inside.wait(10)
        found.append(import_from_thread(f"{name}._C._distributed").RECORDERS)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        package = importlib.import_module(name)  # the training script's import
    finally:
        thread.join(10)
        for module in [m for m in sys.modules if m.split(".")[0] == name]:
            del sys.modules[module]
    assert package.VALUE == 1
    assert found == [2]
