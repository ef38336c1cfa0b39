"""Real Flight Recorder dumps from a 4-rank gloo job on CPU (torch.distributed).

The four jobs run concurrently from one module fixture (most of their time is process
start-up and the idle wait before dumping), each in its own directory and port; their dumps
are kept in the tests' cache (tests/support/generated_cache.py), keyed by a hash of
fr_job.py and the torch and Python versions, so a later run reads them without a job.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from diagnostics import fr_job
from tests.support.generated_cache import cached_folder
from tests.support.ports import free_port
from trainsentry.cli import main as cli_main
from trainsentry.diagnostics import analyze

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

SCENARIOS = ("hang", "size", "slow", "lost")


def _job(scenario: str, torch_version: str) -> Path:
    """One scenario's dumps, one per rank. gloo aborts a process once it sees the mismatched
    size; the culprit dumps right after enqueueing, which it wins by a wide margin, but a
    lost race gets one more try (`cached_folder`'s second attempt)."""

    def make(work: Path) -> None:
        fr_job.launch(scenario, str(work), free_port())

    return cached_folder(
        f"fr_job/{scenario}",
        [Path(fr_job.__file__).read_bytes(), torch_version.encode()],
        make,
        lambda path: path.is_dir() and len(_dump_files(path)) == fr_job.WORLD_SIZE,
    )


@pytest.fixture(scope="module")
def dumps() -> dict[str, Path]:
    torch = pytest.importorskip("torch")
    with ThreadPoolExecutor(len(SCENARIOS)) as pool:
        futures = {name: pool.submit(_job, name, torch.__version__) for name in SCENARIOS}
        return {name: future.result() for name, future in futures.items()}


def _dump_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith("fr_rank_"))


def test_skipped_collective_is_a_hang_naming_the_rank(dumps: dict[str, Path]) -> None:
    assert len(_dump_files(dumps["hang"])) == fr_job.WORLD_SIZE
    report = analyze([dumps["hang"]], in_place=True)  # each rank wrote its own file
    assert report.verdict == "hang"
    hang = report.to_dict()["hang"]
    assert hang["missing_ranks"] == [fr_job.HANG_SKIPPER]
    assert hang["root_cause_ranks"] == [fr_job.HANG_SKIPPER]
    assert hang["seq"] == 11  # ten good all_reduces, then the one rank 3 skipped
    assert hang["op"].startswith("all_reduce")
    assert hang["waited_s"] >= 2.0


def test_different_size_is_a_size_mismatch_naming_the_rank(dumps: dict[str, Path]) -> None:
    files = _dump_files(dumps["size"])
    assert all(p.suffix == ".pkl" for p in files)
    assert fr_job.SIZE_CULPRIT in {int(p.stem.rsplit("_", 1)[1]) for p in files}
    report = analyze([dumps["size"]])
    assert report.verdict == "mismatch"
    (mismatch,) = report.blocking_mismatches
    assert mismatch.kind == "size"
    assert mismatch.culprit_ranks == (fr_job.SIZE_CULPRIT,)
    assert mismatch.seq == 11


def test_sleeping_rank_is_slow(dumps: dict[str, Path]) -> None:
    report = analyze([dumps["slow"]])
    assert report.verdict == "slow"
    top = report.slow.slow_ranks[0]
    assert top.rank == fr_job.SLOW_RANK
    assert top.p_value < 1e-3
    assert top.lag_ms >= fr_job.SLOW_SLEEP_S * 1000 * 0.5


def test_skipper_whose_dump_is_lost_is_named_unread(dumps: dict[str, Path], tmp_path: Path) -> None:
    """Rank 3 skips the last all_reduce and its dump never arrives. gloo's pg_config names no
    group, so only the all_gathers (output [4, 16] from a [16] input) tell that the world has
    4 ranks: rank 3 is named as the rank the waits lead to, whose data was not read (not as a
    root cause: whether it waits on someone is unknown), and the all_gathers are not called
    a size mismatch of a 3-rank group. The subgroup {1, 2, 3} has no such hint: its
    membership is unknown and says so, rather than naming a rank."""
    files = _dump_files(dumps["lost"])
    assert len(files) == fr_job.WORLD_SIZE
    for path in files:
        if not path.stem.endswith(f"_{fr_job.HANG_SKIPPER}"):
            shutil.copy(path, tmp_path / path.name)
    report = analyze([tmp_path])
    out = report.to_dict()
    assert report.blocking_mismatches == []
    assert out["verdict"] == "hang"
    hang = out["hang"]
    assert hang["description"] == "default_pg"
    assert hang["missing_ranks"] == [fr_job.HANG_SKIPPER]
    assert hang["ranks_without_dump"] == [fr_job.HANG_SKIPPER]
    assert hang["root_cause_ranks"] == [] and out["culprit_ranks"] == []
    assert out["unread_suspect_ranks"] == [fr_job.HANG_SKIPPER]
    assert hang["membership_known"] is True
    (sub,) = [h for h in out["hangs"] if h["description"] != "default_pg"]
    assert sub["arrived_ranks"] == [1, 2] and sub["missing_ranks"] == []
    assert sub["membership_known"] is False
    assert any("membership" in note and sub["communicator"] in note for note in out["notes"])


def test_cli_json_and_exit_code(dumps: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["analyze", str(dumps["hang"]), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 3
    assert out["verdict"] == "hang"
    assert out["hang"]["missing_ranks"] == [fr_job.HANG_SKIPPER]
    assert {"verdict", "hang", "mismatches", "slow_ranks", "gaps", "inputs"} <= set(out)
