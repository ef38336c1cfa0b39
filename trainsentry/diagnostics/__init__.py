"""Collective diagnostics: which collective hung, which rank never arrived, who is slow.

`analyze(paths)` is the entry point (see `trainsentry.diagnostics.api`). Attributes are
imported lazily so `trainsentry --help` does not pay for numpy and scipy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainsentry.diagnostics.api import AnalyzeError, analyze, analyze_trace
    from trainsentry.diagnostics.report import Report

__all__ = ["AnalyzeError", "Report", "analyze", "analyze_trace"]


def __getattr__(name: str) -> Any:
    if name in ("analyze", "analyze_trace", "AnalyzeError"):
        from trainsentry.diagnostics import api

        return getattr(api, name)
    if name == "Report":
        from trainsentry.diagnostics.report import Report

        return Report
    raise AttributeError(name)
