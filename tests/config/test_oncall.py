"""The gateway reads the `oncall:` section: accepted as the CLI reads it, and refused at start
with an error naming the field (schedules, escalation policies, the policy's references)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.oncall.oncall_helpers import EXAMPLE
from tests.support.gateway_process import start_gateway
from trainsentry.config import ConfigError, load_settings
from trainsentry.gateway.assemble import app_from_settings, oncall_of

POLICIES = {
    "gpu-p0": {
        "steps": [
            {"schedule": "gpu-infra", "wait_minutes": 10},
            {"schedule": "gpu-infra", "position": 2},
            {"people": ["alice"], "name": "lead"},
        ],
        "repeat": 2,
        "call_every_minutes": 5,
    }
}


def config(tmp_path: Path, **changes: Any) -> Path:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["oncall"]["escalation_policies"] = POLICIES
    for key, value in changes.items():
        raw[key] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_section_is_accepted_and_parsed(tmp_path: Path) -> None:
    settings = load_settings(config(tmp_path), env={})
    oncall = oncall_of(settings)
    assert oncall is not None and sorted(oncall.schedules) == ["gpu-infra"]
    policy = oncall.escalation_policies["gpu-p0"]
    assert [step.name for step in policy.steps] == ["gpu-infra", "gpu-infra#2", "lead"]
    app_from_settings(settings, env={})  # builds


BAD = [
    (
        ["schedules", "gpu-infra", "layers", 0, "members", 0],
        "zed",
        "oncall.schedules.gpu-infra.layers[0].members[0]: unknown person 'zed'",
    ),
    (
        ["escalation_policies", "gpu-p0", "steps", 2, "people", 0],
        "zed",
        "oncall.escalation_policies.gpu-p0.steps[2].people[0]: unknown person 'zed'",
    ),
    (
        ["escalation_policies", "gpu-p0", "steps", 0, "schedule"],
        "nope",
        "oncall.escalation_policies.gpu-p0.steps[0].schedule: unknown schedule 'nope'",
    ),
    (
        ["escalation_policies", "gpu-p0", "steps", 1, "position"],
        0,
        "oncall.escalation_policies.gpu-p0.steps[1].position: must be a number from 1 to 10",
    ),
    (
        ["escalation_policies", "gpu-p0", "repeat"],
        "twice",
        "oncall.escalation_policies.gpu-p0.repeat: must be a whole number 1-10",
    ),
    (
        ["escalation_policies", "gpu-p0", "steps", 0, "people"],
        ["alice"],
        "oncall.escalation_policies.gpu-p0.steps[0]: needs exactly one of schedule or people",
    ),
    (
        ["escalation_policies", "gpu-p0", "call_every_minutes"],
        0,
        "oncall.escalation_policies.gpu-p0.call_every_minutes: must be minutes from 1 to 1440",
    ),
    (
        ["schedules", "gpu-infra", "overrides", 0, "end"],
        "2026-10-27T11:00",
        "oncall.schedules.gpu-infra.overrides[0].end: is not after start",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD)
def test_a_bad_section_is_a_config_error_naming_the_field(
    tmp_path: Path, path: list[Any], value: Any, message: str
) -> None:
    file = config(tmp_path)
    raw = yaml.safe_load(file.read_text())
    where = raw["oncall"]
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    file.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as caught:
        load_settings(file, env={})  # checked with every other section
    assert message in str(caught.value)


def test_the_policy_may_name_configured_escalation_policies_only(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "routing:\n  routes:\n    - {id: team, namespaces: [ml], channels: [phone],"
        " escalation: gpu-p1}\n"
    )
    settings = load_settings(config(tmp_path, gateway={"policy_file": str(policy)}), env={})
    with pytest.raises(ConfigError) as caught:
        app_from_settings(settings, env={})
    assert "routing.routes[0].escalation: unknown escalation policy 'gpu-p1'" in str(caught.value)
    policy.write_text("routing:\n  escalation: {P0: gpu-p0, P1: nope}\n")
    with pytest.raises(ConfigError) as caught:
        app_from_settings(settings, env={})
    assert "routing.escalation.P1: unknown escalation policy 'nope'" in str(caught.value)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_gateway_process_serves_the_section(db_url: str, tmp_path: Path) -> None:
    with start_gateway(tmp_path, db_url, token="t", config=config(tmp_path)) as gateway:
        answer = httpx.get(
            f"{gateway.url}/api/v1/oncall?schedule=gpu-infra&at=2026-10-27T13:00",
            headers={"Authorization": "Bearer t"},
        ).json()
    assert [p["name"] for p in answer["on_call"]] == ["carol", "bob"]
    # refused at start, naming the field
    bad = config(tmp_path)
    raw = yaml.safe_load(bad.read_text())
    raw["oncall"]["schedules"]["gpu-infra"]["layers"][0]["members"][0] = "zed"
    bad.write_text(yaml.safe_dump(raw))
    args = ["gateway", "--config", str(bad), "--db", db_url, "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "oncall.schedules.gpu-infra.layers[0].members[0]: unknown person 'zed'" in done.stderr
