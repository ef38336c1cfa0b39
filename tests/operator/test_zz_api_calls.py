"""The API calls the operator makes, as recorded by the emulator across the operator tests, are
exactly `api_calls.json`; the Helm chart's ClusterRole is checked against that file.

Runs last in this directory (the name), after every test that used the `cluster` fixture. On a
partial run (`-k`, one file) it skips. To regenerate after a deliberate change:
`TRAINSENTRY_UPDATE_API_CALLS=1 pytest tests/operator`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from operator_harness import OPERATOR_CALLS, TESTS_RECORDED

API_CALLS = Path(__file__).resolve().parent / "api_calls.json"


def test_recorded_calls_equal_api_calls_json(request: pytest.FixtureRequest) -> None:
    here = Path(__file__).resolve().parent
    users = {
        item.nodeid
        for item in request.session.items
        if "cluster" in getattr(item, "fixturenames", ())
        and Path(str(item.path)).resolve().parent == here
    }
    if not users or not users <= TESTS_RECORDED:
        pytest.skip("partial run: not every operator test recorded its calls")
    recorded = sorted(
        (call.as_dict() for call in OPERATOR_CALLS),
        key=lambda c: (c["group"], c["resource"], c["subresource"], c["verb"]),
    )
    if os.environ.get("TRAINSENTRY_UPDATE_API_CALLS"):
        API_CALLS.write_text(json.dumps(recorded, indent=1) + "\n")
    expected = json.loads(API_CALLS.read_text())
    assert recorded == expected


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
