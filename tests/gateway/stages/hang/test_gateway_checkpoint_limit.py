"""The gateway's hang diagnosis reads a TrainingJob's `spec.checkpointLimitSeconds` through
the Kubernetes API (the kmock emulator over real HTTP, objects validated against the CRD)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.operator.operator_harness import NS, patch, pod, post, trainingjob
from tests.support.kube_emulator import KubeEmulator
from trainsentry.alerts import JobRef
from trainsentry.gateway.stages.hang.diagnosis import (
    KubernetesEndpoints,
    StaticEndpoints,
    past_checkpoint_limit,
)
from trainsentry.gateway.stages.hang.enrichment import HangVerdict
from trainsentry.kube.names import InvalidName

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
POD_PATH = f"/api/v1/namespaces/{NS}/pods"
SPEC = {"selector": {"matchLabels": {"job": "ck"}}, "worldSize": 2}


async def test_the_jobs_checkpoint_limit_is_read_with_its_ranks(cluster: KubeEmulator) -> None:
    await post(cluster, TJ_PATH, trainingjob("ck", {**SPEC, "checkpointLimitSeconds": 600}))
    for index in range(2):
        await post(cluster, POD_PATH, pod(f"ck-{index}", "ck", "gpu-1"))
    job = JobRef(NS, "ck")
    async with ApiClient(Configuration(host=str(cluster.url).rstrip("/"))) as api:
        resolver = KubernetesEndpoints(api)
        ranks = await resolver(job)
        assert ranks.checkpoint_limit_seconds == 600.0
        # The team removes it: the gateway's default applies again at the next diagnosis.
        await patch(cluster, f"{TJ_PATH}/ck", {"spec": {"checkpointLimitSeconds": None}})
        assert (await resolver(job)).checkpoint_limit_seconds is None
    static = await StaticEndpoints({str(job): ["10.0.0.1:9401"]})(job)
    assert static.checkpoint_limit_seconds is None and len(static.endpoints) == 1


@pytest.mark.parametrize("limit", [59, 604801, "30m"])
async def test_the_crd_refuses_an_unusable_checkpoint_limit(
    cluster: KubeEmulator, limit: object
) -> None:
    body = trainingjob("bad", {**SPEC, "checkpointLimitSeconds": limit})
    async with cluster.post(TJ_PATH, json=body) as answer:
        assert answer.status == 422, await answer.text()


def _checkpoint(waited_s: float) -> HangVerdict:
    return HangVerdict(
        job="team-a/ck",
        verdict="checkpoint",
        summary="rank 2 (pod ck-1, node gpu-1) is saving a checkpoint (torch.save); "
        "its peers wait for it",
        culprit_ranks=(2,),
        report={"hang": {"waited_s": waited_s}},
    )


def test_a_checkpoint_is_held_until_its_peers_have_waited_the_limit() -> None:
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    summary, until = past_checkpoint_limit(_checkpoint(40.0), 600.0, now)
    assert until is not None and (until - now).total_seconds() == 560.0
    assert summary == (
        "rank 2 (pod ck-1, node gpu-1) is saving a checkpoint (torch.save) past the job's "
        "checkpoint limit (10 min); its peers still wait"
    )
    # Already past it (the dumps say the peers waited 700 s): paged now.
    _, until = past_checkpoint_limit(_checkpoint(700.0), 600.0, now)
    assert until is None


async def test_a_job_from_alert_labels_that_is_no_name_is_never_asked_for(
    cluster: KubeEmulator,
) -> None:
    """The job of a hang alert comes from its labels (anyone's): the resolver refuses one
    that is no Kubernetes name before any request (the diagnosis then fails, and the page
    goes out without a verdict)."""
    async with ApiClient(Configuration(host=str(cluster.url).rstrip("/"))) as api:
        resolver = KubernetesEndpoints(api)
        for job in (JobRef(NS, "../../team-b/trainingjobs/x"), JobRef("../team-b", "ck")):
            with pytest.raises(InvalidName):
                await resolver(job)
    assert cluster.sent_paths(exclude_agent="kmock/") == []
