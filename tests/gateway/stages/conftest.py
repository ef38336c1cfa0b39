"""Fixtures for the stage tests that read or write TrainingJobs through the Kubernetes API."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock
import pytest

from tests.operator.operator_harness import Validator, declare_cluster
from tests.support.kube_emulator import KubeEmulator


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    """The emulated Kubernetes API (kmock over real HTTP) with the TrainingJob CRD, validating
    every object written against its schema. Unlike the operator tests' `cluster`, its calls
    are not recorded into the operator's api_calls.json: the gateway is not the operator.
    Modules with their own `cluster` (cordon, job alerting, topology) override this one."""
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu)
        emu.validator = Validator()
        yield emu
