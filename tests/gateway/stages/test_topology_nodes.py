"""The topology read from Kubernetes Node labels (gateway/stages/services/topology.py) through the
kmock emulator: every page of nodes is read, only `list nodes` is called, a failing API keeps
the last good topology."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.support.kube_emulator import KubeEmulator
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.sections import build_topology
from trainsentry.gateway.stages.services.topology import TopologySource

SECTION = {
    "levels": ["leaf_switch", "rack"],
    "kubernetes": True,
    "node_labels": {"leaf_switch": "example.com/leaf", "rack": "topology.example.com/rack"},
}


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emu, kmock.Server(emu):
        emu.declare("v1/nodes", "Node", namespaced=False)
        yield emu


async def add_node(
    emu: KubeEmulator, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
    }
    async with emu.post("/api/v1/nodes", json=body) as resp:
        assert resp.status == 201, await resp.text()


def source(emu: KubeEmulator) -> TopologySource:
    async def api() -> ApiClient:
        return ApiClient(Configuration(host=str(emu.url).rstrip("/")))

    built = build_topology(TopologySettings.model_validate(SECTION), api)
    assert built is not None
    return built


async def test_node_labels_give_each_node_its_place(cluster: KubeEmulator) -> None:
    for i in range(103):  # three pages of 50
        labels = {"example.com/leaf": f"leaf-{i // 4}", "topology.example.com/rack": f"r{i // 32}"}
        await add_node(cluster, f"gpu-node-{i}", labels)
    await add_node(cluster, "cpu-node", {"kubernetes.io/os": "linux"})
    await add_node(cluster, "odd-node", {"example.com/leaf": "x" * 63 + "\u0000"})
    topo = source(cluster)
    topo._page_size = 50
    try:
        assert len(topo.current()) == 0, "nothing before the first listing"
        await topo.refresh()
    finally:
        await topo.stop()
    current = topo.current()
    assert current.place("gpu-node-102") == {"leaf_switch": "leaf-25", "rack": "r3"}
    assert current.place("cpu-node") == {} and current.place("odd-node") == {}
    assert len(current) == 103
    ours = [
        c for c, agent in zip(cluster.calls, cluster.agents, strict=True) if "kmock" not in agent
    ]
    assert len(ours) == 3, "three pages of 50"
    verbs = {(call.verb, call.resource) for call in cluster.recorded_calls(exclude_agent="kmock/")}
    assert verbs == {("list", "nodes")}, "RBAC: list nodes, nothing else"


async def test_a_failing_api_keeps_the_last_topology(cluster: KubeEmulator) -> None:
    await add_node(cluster, "gpu-node-0", {"example.com/leaf": "leaf-7"})
    topo = source(cluster)
    try:
        await topo.refresh()
        cluster.inject_fault("list", "nodes", 500)
        with pytest.raises(Exception, match="500"):
            await topo.refresh()
    finally:
        await topo.stop()
    assert topo.current().place("gpu-node-0") == {"leaf_switch": "leaf-7"}


async def test_node_annotations_place_each_hca_on_its_rail(cluster: KubeEmulator) -> None:
    """Issue 44: a cluster that publishes where each HCA is cabled (a Node annotation)."""
    rails = {"example.com/rail-leaves": "mlx5_0=su2-leaf-0,mlx5_3=su2-leaf-3"}
    await add_node(cluster, "gpu-node-0", {"topology.example.com/rack": "r1"}, rails)
    section = {**SECTION, "rail_annotations": {"leaf_switch": "example.com/rail-leaves"}}
    section["node_labels"] = {"rack": "topology.example.com/rack"}

    async def api() -> ApiClient:
        return ApiClient(Configuration(host=str(cluster.url).rstrip("/")))

    topo = build_topology(TopologySettings.model_validate(section), api)
    assert topo is not None
    try:
        await topo.refresh()
    finally:
        await topo.stop()
    current = topo.current()
    assert current.place("gpu-node-0", "mlx5_3") == {"leaf_switch": "su2-leaf-3", "rack": "r1"}
    assert current.place("gpu-node-0") == {"rack": "r1"}
