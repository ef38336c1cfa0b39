"""The API calls the operator makes, as recorded by the emulator across the operator tests, are
exactly `api_calls.json`; the Helm chart's ClusterRole is checked against that file.

Runs last in this directory (the name), after every test that used the `cluster` fixture. On a
partial run (`-k`, one file) it skips. With pytest-xdist the tests of this folder share one
worker, where they run in this order (tests/support/xdist_scheduling.py). scripts/test.sh runs
the `e2e` tests (the operator as a process) in a run of their own: there each call they made
must be in the file. To regenerate after a deliberate change:
`TRAINSENTRY_UPDATE_API_CALLS=1 pytest tests/operator`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from operator_harness import OPERATOR_CALLS, TESTS_RECORDED

API_CALLS = Path(__file__).resolve().parent / "api_calls.json"


def _recorded(request: pytest.FixtureRequest) -> list[dict[str, str]]:
    """The calls recorded by every test of this run that used `cluster` in this directory;
    skips when one of them has not run (yet) in this process."""
    here = Path(__file__).resolve().parent
    users = {
        item.nodeid
        for item in request.session.items
        if "cluster" in getattr(item, "fixturenames", ())
        and Path(str(item.path)).resolve().parent == here
    }
    elsewhere = users - TESTS_RECORDED
    if users and elsewhere and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail(
            f"{len(elsewhere)} of this folder's tests ran on another pytest-xdist worker"
            " (tests/support/xdist_scheduling.py keeps them on one): e.g. " + min(elsewhere)
        )
    if not users or elsewhere:
        pytest.skip("partial run: not every operator test recorded its calls")
    return sorted(
        (call.as_dict() for call in OPERATOR_CALLS),
        key=lambda c: (c["group"], c["resource"], c["subresource"], c["verb"]),
    )


def test_recorded_calls_equal_api_calls_json(request: pytest.FixtureRequest) -> None:
    recorded = _recorded(request)
    if os.environ.get("TRAINSENTRY_UPDATE_API_CALLS"):
        API_CALLS.write_text(json.dumps(recorded, indent=1) + "\n")
    expected = json.loads(API_CALLS.read_text())
    assert recorded == expected


@pytest.mark.e2e
def test_calls_of_the_operator_process_are_in_api_calls_json(
    request: pytest.FixtureRequest,
) -> None:
    """In a run of the `e2e` tests alone (scripts/test.sh's second run), the calls the
    operator made as a process are each in the file (the ClusterRole grants them)."""
    expected = json.loads(API_CALLS.read_text())
    outside = [call for call in _recorded(request) if call not in expected]
    assert outside == []


def test_api_calls_json_is_well_formed() -> None:
    calls = json.loads(API_CALLS.read_text())
    verbs = {"get", "list", "watch", "create", "patch", "delete"}
    assert calls and all(
        set(call) == {"verb", "group", "resource", "subresource"} and call["verb"] in verbs
        for call in calls
    )
    assert {
        "verb": "patch",
        "group": "trainsentry.io",
        "resource": "trainingjobs",
        "subresource": "status",
    } in calls
