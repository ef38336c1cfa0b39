"""How a parallel run (pytest-xdist, `-n 2`: scripts/test.sh's first run) hands the tests to
its workers.

Each test is a unit of its own, handed to whichever worker asks next, as `--dist load` does;
except the tests under a folder of `ONE_WORKER`: those are one unit, so they run on one worker,
in one process, in collection order. tests/operator/test_zz_api_calls.py needs that: it checks
the calls that every test of its folder recorded, in its own process, before it.

(pytest-xdist's `--dist loadgroup` would do it with `xdist_group` marks, but 3.8.0 names a
group by rewriting `item._nodeid`, which pytest 9.2 no longer reads: the marks group nothing.)
"""

from __future__ import annotations

from typing import Any

ONE_WORKER = ("tests/operator/",)


def unit_of(nodeid: str) -> str:
    """Pure: the unit of work a test belongs to: its folder of `ONE_WORKER`, else itself."""
    for folder in ONE_WORKER:
        if nodeid.startswith(folder):
            return folder
    return nodeid


def make_scheduler(config: Any, log: Any) -> Any:
    """pytest-xdist's scope scheduler with `unit_of` as the scope; None (xdist's own choice)
    unless the run distributes by load (`-n` without another `--dist`)."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)
