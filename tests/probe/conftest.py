"""Fixtures for the probe tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from probe.probe_harness import GlooJob, launch_job


@pytest.fixture
def gloo_job(tmp_path: Path) -> Iterator[Callable[..., GlooJob]]:
    """A starter `start(world_size, **env) -> GlooJob`; every job it starts is killed after."""
    started: list[GlooJob] = []

    def start(world_size: int, **env: str) -> GlooJob:
        job = launch_job(tmp_path / f"job{len(started)}", world_size, env)
        started.append(job)
        return job

    yield start
    for job in started:
        job.stop()
