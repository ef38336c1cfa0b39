"""The Flight Recorder scenario corpus (tests/diagnostics/fr_scenarios.py), generated once.

Running the gloo jobs takes ~15 s of wall time, so their dumps are cached under
`.cache/fr_scenarios/<key>/` in the checkout (gitignored), keyed by a hash of the scenario
script and the torch version: a change to either makes a fresh corpus. A scenario is
generated into a private folder and renamed into place, so a half-written one is never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from diagnostics import fr_scenarios
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _complete(path: Path, scenario: str) -> bool:
    world = fr_scenarios.WORLD[scenario]
    return all(
        len(list((path / sub).glob("fr_rank_*"))) == world for sub in ("json", "pkl", "pgcfg")
    )


def _make(scenario: str, target: Path) -> None:
    if _complete(target, scenario):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(2):
        work = Path(tempfile.mkdtemp(prefix=f".{scenario}-", dir=target.parent))
        fr_scenarios.generate(scenario, str(work), free_port())
        if _complete(work, scenario):
            shutil.rmtree(target, ignore_errors=True)
            os.replace(work, target)
            return
        shutil.rmtree(work, ignore_errors=True)
    raise RuntimeError(f"scenario {scenario} left incomplete dumps twice")


@pytest.fixture(scope="session")
def fr_corpus() -> dict[str, Path]:
    """Scenario name -> its folder (json/, pkl/, pgcfg/ dumps), generating what is missing."""
    torch = pytest.importorskip("torch")
    script = Path(fr_scenarios.__file__).read_bytes()
    key = hashlib.sha256(script + torch.__version__.encode()).hexdigest()[:16]
    base = ROOT / ".cache" / "fr_scenarios" / key
    paths = {name: base / name for name in fr_scenarios.WORLD}
    with ThreadPoolExecutor(len(paths)) as pool:
        for future in [pool.submit(_make, name, path) for name, path in paths.items()]:
            future.result()
    return paths
