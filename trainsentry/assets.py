"""Where the bundled data lives: rule files, dashboards, policy, demo incident.

`rules/` and `dashboards/` at the top of the source tree are the single source. In a
source checkout (editable install) we read them there; an installed wheel carries a
copy under `trainsentry/data/` (see setup.py's build step).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"
_SOURCE_ROOT = PACKAGE_DIR.parent


def _bundled(name: str) -> Path:
    in_source = _SOURCE_ROOT / name
    if in_source.is_dir() and (_SOURCE_ROOT / "pyproject.toml").is_file():
        return in_source
    return DATA_DIR / name


def rules_dir() -> Path:
    """Directory of Prometheus rule files (`*.yaml`)."""
    return _bundled("rules")


def dashboards_dir() -> Path:
    """Directory of Grafana dashboard JSON files."""
    return _bundled("dashboards")


def data_file(name: str) -> Path:
    """A file shipped inside the package's data folder (policy, demo incident, ...)."""
    return DATA_DIR / name
