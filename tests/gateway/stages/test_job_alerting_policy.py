"""A TrainingJob's on-call reference may name one of the gateway's escalation policies
(issue 21: "per team ... or the TrainingJob's roster reference"): the ConfigMap key holds
`escalation_policy: NAME` instead of inline `layers:`. The job's P0 pages follow that
policy; an unknown name is AlertingReady=False (UnknownEscalationPolicy) and the pages take
the global route. The real gateway, the Kubernetes API as the kmock emulator, Feishu as the
contract server (its urgent_phone calls are the pages)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.stages.test_job_alerting import (
    Running,
    alert,
    cluster,
    condition,
    create,
    events,
    feishu,
    gateway_with,
    tj_path,
    trainingjob,
)
from tests.support.feishu_server import FeishuContractServer
from tests.support.kube_emulator import KubeEmulator
from trainsentry.alerts import Priority

__all__ = ["cluster", "feishu"]  # the fixtures, shared with test_job_alerting

ONCALL = {
    "people": {
        "pat": {"feishu_open_id": "ou_pat"},
        "lee": {"feishu_open_id": "ou_lee"},
    },
    "schedules": {
        "team-a": {
            "timezone": "UTC",
            "layers": [{"name": "primary", "start": "2026-01-05T09:00", "shift": "1w",
                        "members": ["pat"]}],
        },
    },
    "escalation_policies": {
        "team-a-p0": {
            "steps": [
                {"schedule": "team-a", "wait_minutes": 10},
                {"people": ["lee"], "name": "lead", "wait_minutes": 10},
            ]
        }
    },
}  # fmt: skip


@pytest.fixture
async def gateway(
    cluster: KubeEmulator, feishu: FeishuContractServer, tmp_path: Path
) -> AsyncIterator[Any]:
    async with gateway_with(cluster, feishu, tmp_path, oncall=ONCALL) as (start, _):
        yield start


def configmap(name: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"roster.yaml": text},
    }


async def test_a_job_naming_an_escalation_policy_pages_through_it(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    configmaps = "/api/v1/namespaces/team-a/configmaps"
    await create(cluster, configmaps, configmap("policy", "escalation_policy: team-a-p0\n"))
    await create(cluster, configmaps, configmap("typo", "escalation_policy: {P0: team-a-p1}\n"))
    await create(cluster, configmaps, configmap("p0", "escalation_policy: {P0: team-a-p0}\n"))
    await create(
        cluster, configmaps, configmap("both", "escalation_policy: team-a-p0\nlayers: []\n")
    )
    for name, ref in (("a", "policy"), ("typo", "typo"), ("both", "both"), ("p", "p0")):
        alerting = {"onCallRosterRef": {"name": ref, "key": "roster.yaml"}}
        await create(cluster, tj_path("team-a"), trainingjob("team-a", name, alerting))
    running: Running = await gateway()
    assert running.stage.escalation_policy("team-a/a", Priority.P1) == "team-a-p0"
    assert running.stage.escalation_policy("team-a/p", Priority.P0) == "team-a-p0"
    assert running.stage.escalation_policy("team-a/p", Priority.P1) == ""
    per_priority = condition(cluster, "team-a", "p")
    assert (per_priority["status"], per_priority["message"]) == (
        "True",
        "pages follow escalation policies P0: team-a-p0 (ConfigMap p0 key roster.yaml)",
    )
    ready = condition(cluster, "team-a", "a")
    assert (ready["status"], ready["reason"]) == ("True", "Ready"), ready
    assert "escalation policy team-a-p0" in ready["message"]
    typo = condition(cluster, "team-a", "typo")
    assert (typo["status"], typo["reason"]) == ("False", "UnknownEscalationPolicy"), typo
    assert "'team-a-p1'" in typo["message"] and "team-a-p0" in typo["message"]
    assert "UnknownEscalationPolicy" in {e["reason"] for e in events(cluster, "team-a", "typo")}
    both = condition(cluster, "team-a", "both")
    assert (both["status"], both["reason"]) == ("False", "InvalidRoster"), both

    await running.post(alert(1, "team-a", "a", "TrainingJobDown"))
    # step 1 of team-a-p0: the team-a schedule's person, not the global roster's
    assert [user for _, users in feishu.urgent_calls for user in users] == ["ou_pat"]
    await running.post(alert(2, "team-a", "typo", "TrainingJobDown"))
    await running.post(alert(3, "team-a", "both", "TrainingJobDown"))
    # the jobs whose reference cannot be followed: the global roster
    await running.post(alert(4, "team-a", "p", "TrainingJobDown"))
    assert [user for _, users in feishu.urgent_calls for user in users] == [
        "ou_pat",
        "ou_gus",
        "ou_gus",
        "ou_pat",
    ]
