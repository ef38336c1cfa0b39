"""A TrainingJob whose spec.alerting nothing reads is told so (issue 20): the operator, told by
the chart whether the gateway's job alerting is on (`--job-alerting`), writes
AlertingReady=Unknown with the reason and a Warning event; it never touches the gateway's
own AlertingReady."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from operator_harness import NS, TJ, OperatorThread, patch, post, trainingjob

from tests.support.eventually import eventually
from tests.support.kube_emulator import KubeEmulator
from trainsentry.operator.reconcile import Sources
from trainsentry.operator.spec import TrainingJobSpec
from trainsentry.operator.status import JobAlertingScope, alerting_condition

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
OFF = JobAlertingScope(enabled=False)
SELECTOR = {"selector": {"matchLabels": {"job": "x"}}}


def alerting_ready(emu: KubeEmulator, name: str) -> dict[str, Any] | None:
    body = emu.get_live(TJ, NS, name) or {}
    found = [
        c
        for c in (body.get("status") or {}).get("conditions") or []
        if c["type"] == "AlertingReady"
    ]
    return found[0] if found else None


def reconciled(emu: KubeEmulator, name: str) -> bool:
    body = emu.get_live(TJ, NS, name) or {}
    return bool((body.get("status") or {}).get("observedGeneration"))


Start = Callable[[JobAlertingScope | None], Any]


@pytest.fixture
async def start(cluster: KubeEmulator, sources: Sources) -> AsyncIterator[Start]:
    running: list[OperatorThread] = []

    async def run(scope: JobAlertingScope | None) -> OperatorThread:
        for before in running:
            await before.stop()
        running.clear()
        thread = OperatorThread(
            str(cluster.url).rstrip("/"), dataclasses.replace(sources, job_alerting=scope)
        )
        await thread.start(cluster)
        running.append(thread)
        return thread

    yield run
    for thread in running:
        await thread.stop()


async def test_job_alerting_off_tells_the_team_and_on_leaves_it_to_the_gateway(
    cluster: KubeEmulator, start: Start
) -> None:
    await start(OFF)
    routed = {**SELECTOR, "alerting": {"feishu": {"chatId": "oc_team"}, "owners": ["ou_a"]}}
    await post(cluster, TJ_PATH, trainingjob("routed", routed))
    overrides = {**SELECTOR, "alerting": {"priorityOverrides": {"GPUTemperatureHigh": "P1"}}}
    await post(cluster, TJ_PATH, trainingjob("plain", overrides))
    await eventually(lambda: alerting_ready(cluster, "routed") is not None)
    condition = alerting_ready(cluster, "routed")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("Unknown", "JobAlertingDisabled")
    assert "gateway.jobAlerting.enabled" in condition["message"]
    assert "global routes" in condition["message"]
    await eventually(
        lambda: any(
            e["reason"] == "JobAlertingDisabled" and e["type"] == "Warning"
            for e in cluster.live("v1/events", NS)
        )
    )
    # priorityOverrides is applied by the operator itself: nothing to warn about
    await eventually(lambda: reconciled(cluster, "plain"))
    assert alerting_ready(cluster, "plain") is None

    # the chart turns job alerting on: the operator's condition goes, the gateway's is kept
    await start(JobAlertingScope(enabled=True))
    await eventually(lambda: alerting_ready(cluster, "routed") is None)
    gateway_says = {
        "type": "AlertingReady",
        "status": "True",
        "reason": "Routed",
        "message": "cards to chat oc_team",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    status_path = f"{TJ_PATH}/routed/status"
    body = cluster.get_live(TJ, NS, "routed") or {}
    conditions = [*body["status"]["conditions"], gateway_says]
    await patch(cluster, status_path, {"status": {"conditions": conditions}})
    await patch(cluster, f"{TJ_PATH}/routed", {"spec": {"worldSize": 2}})  # a reconcile
    await eventually(
        lambda: (cluster.get_live(TJ, NS, "routed") or {})["status"].get("observedGeneration") == 2
    )
    assert alerting_ready(cluster, "routed") == gateway_says


def test_the_condition_follows_the_scope() -> None:
    spec = TrainingJobSpec.model_validate(
        {**SELECTOR, "alerting": {"onCallRosterRef": {"name": "roster", "key": "r.yaml"}}}
    )
    assert alerting_condition(spec, "team-a", None) is None  # not told: nothing said
    disabled = alerting_condition(spec, "team-a", OFF)
    assert disabled is not None and disabled.unknown and disabled.reason == "JobAlertingDisabled"
    scoped = JobAlertingScope(enabled=True, namespaces=frozenset({"team-b", "team-c"}))
    elsewhere = alerting_condition(spec, "team-a", scoped)
    assert elsewhere is not None and elsewhere.reason == "JobAlertingNotInNamespace"
    assert "team-b, team-c" in elsewhere.message and "team-a" in elsewhere.message
    assert alerting_condition(spec, "team-b", scoped) is None
    assert alerting_condition(spec, "team-a", JobAlertingScope(enabled=True)) is None
    nothing = TrainingJobSpec.model_validate(SELECTOR)
    assert alerting_condition(nothing, "team-a", OFF) is None
