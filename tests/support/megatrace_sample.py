"""The real Megatrace sample (tests/fixtures/megatrace/, origin in its README), unpacked.

The eight rank logs are 13 MB as text and 0.6 MB as the committed `.tar.xz`; tests and
`bench/bench_analyze.py` unpack it once into a folder of their own.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parents[1] / "fixtures" / "megatrace" / "log_rank2_slow.tar.xz"


def unpack(target: Path) -> Path:
    """Unpack the sample under `target`; return its folder (`config.yaml`, `rank_N.log`)."""
    folder = target / "log_rank2_slow"
    if not (folder / "config.yaml").is_file():
        with tarfile.open(ARCHIVE, "r:xz") as tar:
            tar.extractall(target, filter="data")
    return folder
