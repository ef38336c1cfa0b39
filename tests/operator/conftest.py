"""Fixtures for the operator tests. Makes `tests/support/kube_emulator.py` and this directory's
`operator_harness.py` importable by their plain names."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

for _path in (Path(__file__).resolve().parents[1], Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import kmock  # noqa: E402
from operator_harness import OPERATOR_CALLS, TESTS_RECORDED, Validator, declare_cluster  # noqa: E402

from tests.support.kube_emulator import KubeEmulator  # noqa: E402
from trainsentry.operator.reconcile import Sources, load_sources  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def sources() -> Sources:
    return load_sources(DATA / "rules", DATA / "dashboards")


@pytest.fixture
async def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KubeEmulator]:
    validator = Validator()
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu)
        emu.validator = validator
        emu.validation = validator  # for assertions on what was checked
        yield emu
    validator.promtool_check(tmp_path)
    OPERATOR_CALLS.update(emu.recorded_calls(exclude_agent="kmock/"))
    TESTS_RECORDED.add(request.node.nodeid)
