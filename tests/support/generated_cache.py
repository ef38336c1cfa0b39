"""Test data that takes long to make (the dumps of real multi-process gloo jobs), made once
and kept between runs.

`cached_folder(kind, inputs, make, complete)` is `<root>/<kind>/<key>/`, the key a hash of
`inputs` (the bytes of what decides the data: the generator's script, the torch and Python
versions), so a change to any of them makes new data. What is missing is made by `make` into
a private folder beside it and renamed into place only once `complete` says it is whole: a
half-made folder is never used, and runs that make the same folder at once keep the first
one placed. Nothing replaces or removes a complete folder, so a run reading it is never cut
short.

The root is `$TRAINSENTRY_TEST_CACHE`, else `~/.cache/trainsentry-tests`: outside the
checkout, so that a fresh clone on the same machine (CI's) finds what an earlier run made;
remove the folder to make everything anew.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def cache_root() -> Path:
    configured = os.environ.get("TRAINSENTRY_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "trainsentry-tests"


def cache_key(inputs: Iterable[bytes]) -> str:
    """Pure: a hash of `inputs` and the running Python's version (16 hex digits)."""
    digest = hashlib.sha256(sys.version.encode())
    for part in inputs:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def cached_folder(
    kind: str,
    inputs: Iterable[bytes],
    make: Callable[[Path], None],
    complete: Callable[[Path], bool],
    *,
    attempts: int = 2,
) -> Path:
    """The folder of `kind` for `inputs`, made with `make(folder)` when it is not there yet.
    RuntimeError when `attempts` runs of `make` all leave something `complete` refuses."""
    target = cache_root() / kind / cache_key(inputs)
    if complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(attempts):
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            make(work)
            if complete(work) and _placed(work, target, complete):
                return target
        finally:
            shutil.rmtree(work, ignore_errors=True)
    raise RuntimeError(f"{kind}: {attempts} runs left incomplete data (under {target.parent})")


def _placed(work: Path, target: Path, complete: Callable[[Path], bool]) -> bool:
    """Renames `work` to `target`, unless another run placed a complete one first (that one
    stays: a run may be reading it). An incomplete leftover (nothing this module places) is
    removed first. True when `target` is complete."""
    try:
        os.rename(work, target)
    except OSError:
        if complete(target):
            return True
        shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(OSError):  # placed by another run meanwhile
            os.rename(work, target)
    return complete(target)
