"""trainsentry: monitoring, alerting and fault diagnosis for GPU training jobs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trainsentry")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["__version__"]
