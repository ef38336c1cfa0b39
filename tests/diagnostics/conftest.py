"""The Flight Recorder scenario corpus (tests/diagnostics/fr_scenarios.py), generated once.

Running the gloo jobs takes a minute or more of wall time, so their dumps are kept in the
tests' cache (tests/support/generated_cache.py: `~/.cache/trainsentry-tests/fr_scenarios/`,
outside the checkout), keyed by a hash of the scenario script and the torch and Python
versions: a change to any makes a fresh corpus. A scenario is generated into a private
folder and renamed into place, so a half-written one is never used.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from diagnostics import fr_scenarios
from tests.support.generated_cache import cached_folder
from tests.support.megatrace_sample import unpack as unpack_megatrace
from tests.support.ports import free_port


def _complete(path: Path, scenario: str) -> bool:
    world = fr_scenarios.WORLD[scenario]
    return all(
        len(list((path / sub).glob("fr_rank_*"))) == world for sub in ("json", "pkl", "pgcfg")
    )


def _scenario(scenario: str, torch_version: str) -> Path:
    def make(work: Path) -> None:
        fr_scenarios.generate(scenario, str(work), free_port())

    return cached_folder(
        f"fr_scenarios/{scenario}",
        [Path(fr_scenarios.__file__).read_bytes(), torch_version.encode()],
        make,
        lambda path: _complete(path, scenario),
    )


@pytest.fixture(scope="session")
def fr_corpus() -> dict[str, Path]:
    """Scenario name -> its folder (json/, pkl/, pgcfg/ dumps), generating what is missing."""
    torch = pytest.importorskip("torch")
    with ThreadPoolExecutor(len(fr_scenarios.WORLD)) as pool:
        futures = {
            name: pool.submit(_scenario, name, torch.__version__) for name in fr_scenarios.WORLD
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="session")
def megatrace_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Megatrace sample's folder (tests/fixtures/megatrace/), unpacked once."""
    return unpack_megatrace(tmp_path_factory.mktemp("megatrace"))
