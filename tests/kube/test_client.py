"""The one Kubernetes client (trainsentry/kube/client.py) against the kmock emulator over
real HTTP, every object written checked against the real built-in schemas (strict,
kubernetes-validate): the generic operations on Secrets and Pods, names refused before any
request, retries."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.operator.operator_harness import Validator
from tests.support.kube_emulator import KubeEmulator
from trainsentry.kube.client import Kube, KubeError, RetryPolicy
from trainsentry.kube.names import InvalidName
from trainsentry.kube.resources import NODES, PODS, SECRETS, TRAININGJOBS

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05)


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emu, kmock.Server(emu):
        emu.declare("v1/secrets", "Secret")
        emu.declare("v1/pods", "Pod")
        emu.declare("v1/nodes", "Node", namespaced=False)
        emu.declare("trainsentry.io/v1alpha1/trainingjobs", "TrainingJob", status=True)
        emu.validator = Validator()
        yield emu


@pytest.fixture
async def kube(cluster: KubeEmulator) -> AsyncIterator[Kube]:
    async with ApiClient(Configuration(host=str(cluster.url).rstrip("/"))) as api:
        yield Kube(api, FAST)


def secret(name: str, value: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": labels or {}},
        "type": "Opaque",
        "data": {"token": base64.b64encode(value.encode()).decode()},
    }


def pod(name: str, job: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"job": job}},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
    }


def ours(cluster: KubeEmulator) -> list[str]:
    return cluster.sent_paths(exclude_agent="kmock/")


async def test_secrets_created_read_listed_patched_and_deleted(
    cluster: KubeEmulator, kube: Kube
) -> None:
    made = await kube.create(SECRETS, "team-a", secret("probe-token", "t0", {"app": "probe"}))
    assert made["metadata"]["namespace"] == "team-a" and made["metadata"]["uid"]
    await kube.create(SECRETS, "team-b", secret("probe-token", "other", {"app": "probe"}))
    got = await kube.get(SECRETS, "team-a", "probe-token")
    assert got is not None and base64.b64decode(got["data"]["token"]) == b"t0"
    assert await kube.get(SECRETS, "team-a", "missing") is None
    listed = await kube.list(SECRETS, "team-a", "app=probe")
    assert [s["metadata"]["namespace"] for s in listed] == ["team-a"]
    everywhere = await kube.list(SECRETS, None, "app=probe")
    assert sorted(s["metadata"]["namespace"] for s in everywhere) == ["team-a", "team-b"]
    rotated = base64.b64encode(b"t1").decode()
    patched = await kube.patch(
        SECRETS,
        "team-a",
        "probe-token",
        {"data": {"token": rotated}, "metadata": {"labels": {"app": None}}},
    )
    assert patched["data"]["token"] == rotated and "app" not in patched["metadata"]["labels"]
    with pytest.raises(KubeError) as conflict:
        await kube.create(SECRETS, "team-a", secret("probe-token", "again"))
    assert conflict.value.status == 409
    assert await kube.delete(SECRETS, "team-a", "probe-token") is True
    assert await kube.delete(SECRETS, "team-a", "probe-token") is False
    assert cluster.get_live("v1/secrets", "team-b", "probe-token") is not None
    assert "/api/v1/namespaces/team-a/secrets/probe-token" in ours(cluster)


async def test_pods_listed_by_selector_and_page_by_page(cluster: KubeEmulator, kube: Kube) -> None:
    for index in range(5):
        await kube.create(PODS, "ml", pod(f"big-{index}", "big"))
    await kube.create(PODS, "ml", pod("small-0", "small"))
    assert [p["metadata"]["name"] for p in await kube.list(PODS, "ml", "job=small")] == ["small-0"]
    names: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        page, token = await kube.list_page(
            PODS, "ml", label_selector="job=big", limit=2, token=token
        )
        names += [p["metadata"]["name"] for p in page]
        pages += 1
        if token is None:
            break
    assert names == [f"big-{index}" for index in range(5)] and pages == 3
    assert await kube.patch(PODS, "ml", "big-0", {"metadata": {"labels": {"job": "moved"}}})
    assert len(await kube.list(PODS, "ml", "job=big")) == 4
    assert await kube.delete(PODS, "ml", "small-0")
    with pytest.raises(KubeError) as refused:  # the real Pod schema: containers are required
        await kube.create(
            PODS, "ml", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {}}
        )
    assert refused.value.status == 422


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("team-a", "../../team-b/secrets/bot"),
        ("team-a", "%2e%2e/%2e%2e/team-b/secrets/bot"),
        ("team-a", ".."),
        ("team-a", "Bot"),
        ("team-a", ""),
        ("team-a", "a" * 254),
        ("../team-b", "bot"),
        ("team-a.example", "bot"),  # a namespace is a label: no dots
        ("a" * 64, "bot"),
        ("", "bot"),
    ],
)
async def test_names_are_refused_before_any_request(
    cluster: KubeEmulator, kube: Kube, namespace: str, name: str
) -> None:
    calls = [
        kube.get(SECRETS, namespace, name),
        kube.patch(SECRETS, namespace, name, {"data": {}}),
        kube.delete(SECRETS, namespace, name),
        kube.create(SECRETS, namespace, secret(name, "x")),
        kube.rewrite_conditions(TRAININGJOBS, namespace, name, lambda c, _m: c),
    ]
    for call in calls:
        with pytest.raises(InvalidName, match="is not a valid Kubernetes name"):
            await call
    assert ours(cluster) == []


async def test_a_node_label_never_becomes_another_path(cluster: KubeEmulator, kube: Kube) -> None:
    for node in ("../namespaces/kube-system/secrets/x", "gpu-1/../../x", "gpu-1%2F..", "GPU-1"):
        with pytest.raises(InvalidName, match="Node name"):
            await kube.patch(NODES, None, node, {"spec": {"unschedulable": True}})
    with pytest.raises(InvalidName, match="subresource"):
        await kube.patch(TRAININGJOBS, "ml", "big", {}, "status/../../x")
    assert ours(cluster) == []


async def test_retries_on_429_and_5xx_then_gives_up_and_not_on_4xx(
    cluster: KubeEmulator, kube: Kube
) -> None:
    cluster.inject_fault("create", "secrets", 503, times=2)
    cluster.inject_fault("create", "secrets", 429, times=1)
    await kube.create(SECRETS, "team-a", secret("bot", "x"))
    assert ours(cluster).count("/api/v1/namespaces/team-a/secrets") == 4
    cluster.inject_fault("get", "secrets", 500, times=FAST.attempts)
    with pytest.raises(KubeError) as failed:
        await kube.get(SECRETS, "team-a", "bot")
    assert failed.value.status == 500
    cluster.inject_fault("get", "secrets", 403, times=1)
    before = len(ours(cluster))
    with pytest.raises(KubeError) as forbidden:
        await kube.get(SECRETS, "team-a", "bot")
    assert forbidden.value.status == 403 and len(ours(cluster)) == before + 1
