"""Node health: hardware faults only, weighed by kind and halved every half-life
(gateway/policy/health.py), and `GET /api/v1/nodes?sort=health` over real HTTP with the real
gateway, its store (SQLite and PostgreSQL) and a topology."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import Alert, AlertStatus
from trainsentry.config import GatewaySettings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import build_topology, create_app
from trainsentry.gateway.policy.health import decayed, fault_of, score_nodes
from trainsentry.gateway.policy.rules import load_policy

TOKEN = "s3cret-token"
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
POLICY = load_policy()
DAY = 86400.0


def occurrence(name: str, node: str, days_ago: float, **labels: str) -> Alert:
    return Alert(
        fingerprint=f"{name}-{node}-{days_ago}",
        status=AlertStatus.FIRING,
        labels={"alertname": name, "node": node, **labels},
        annotations={},
        starts_at=NOW - timedelta(days=days_ago),
        ends_at=None,
    )


@pytest.mark.parametrize(
    ("name", "labels", "kind", "weight"),
    [
        ("GPUXidDoubleBitECC", {"xid": "48", "gpu": "3"}, "ecc_double_bit", 8.0),
        ("GPUFellOffBus", {"xid": "79"}, "fell_off_bus", 6.0),  # XID 79: RESTART_BM, 6
        ("GPUXidRowRemapFailure", {"xid": "64"}, "row_remap_failure", 10.0),
        ("GPUXid", {"xid": "64"}, "xid:64", 3.0),  # NVIDIA: RESET_GPU
        ("GPUXid", {"xid": "48"}, "xid:48", 8.0),  # NVIDIA: WORKFLOW_XID_48
        ("GPUXidNVLinkError", {"xid": "74"}, "xid:74", 3.0),  # NVIDIA: WORKFLOW_NVLINK_ERR
        ("GPUXidResetRequired", {"xid": "61"}, "xid:61", 10.0),  # NVIDIA: CONTACT_SUPPORT
        ("GPUXidResetRequired", {"xid": "109"}, "xid:109", 3.0),  # RESET_GPU
        ("GPURowRemapFailure", {}, "row_remap_failure", 10.0),
        ("IBLinkFlapping", {"device": "mlx5_0"}, "ib_link_flap", 2.0),
        ("GPUTemperatureCritical", {}, "thermal", 1.0),
    ],
)
def test_hardware_faults_are_weighed_by_kind(
    name: str, labels: dict[str, str], kind: str, weight: float
) -> None:
    fault = fault_of(occurrence(name, "n1", 0, **labels), POLICY)
    assert fault is not None and (fault.kind, fault.weight) == (kind, weight)


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("NodeFilesystemSpaceCritical", {"component": "node", "mountpoint": "/ckpt"}),
        ("NodeOOMKills", {"component": "node"}),
        ("GPUXidApplicationError", {"xid": "13", "component": "gpu"}),  # RESTART_APP
        ("GPUXidInformational", {"xid": "45", "component": "gpu"}),  # WORKFLOW_XID_45
        # NVIDIA's immediate action for these is not a GPU reset: not sick hardware
        ("GPUXidContainedECC", {"xid": "94"}),  # RESTART_APP
        ("GPUXidHighSingleBitECCRate", {"xid": "92"}),  # IGNORE
        ("GPUXidRowRemapPending", {"xid": "63"}),  # IGNORE
        ("GPUXidResetRequired", {"xid": "154"}),  # XID_154: the XID it names counts
        ("TrainingJobHang", {}),
        ("IBSymbolErrors", {"component": "fabric"}),
    ],
)
def test_what_is_not_sick_hardware_weighs_nothing(name: str, labels: dict[str, str]) -> None:
    assert fault_of(occurrence(name, "n1", 0, **labels), POLICY) is None


def cluster_wide(alert: dict[str, Any]) -> dict[str, Any]:
    """A `make_alert` as a chart's cluster-wide rule raises it: no namespace, no job."""
    for key in ("namespace", "trainingjob"):
        del alert["labels"][key]
    return alert


def test_scores_decay_and_rank_the_sickest_first() -> None:
    week = POLICY.node_health.half_life / DAY
    ranked = score_nodes(
        [
            # a lemon: three XID 79 in six days
            occurrence("GPUFellOffBus", "lemon", 0, xid="79", gpu="2"),
            occurrence("GPUFellOffBus", "lemon", 3, xid="79", gpu="2"),
            occurrence("GPUFellOffBus", "lemon", 6, xid="79", gpu="2"),
            # one row-remap failure a week ago weighs half its 10
            occurrence("GPURowRemapFailure", "old", week, gpu="0"),
            # many full disks and OOMs: not a fault
            *(
                occurrence("NodeFilesystemSpaceCritical", "disky", d, component="node")
                for d in range(9)
            ),
            occurrence("GPUXidDoubleBitECC", "ancient", 31, xid="48"),  # past the horizon
        ],
        POLICY,
        NOW,
    )
    assert [h.node for h in ranked] == ["lemon", "old"]
    lemon, old = ranked
    expected = sum(
        decayed(6.0, NOW - timedelta(days=d), NOW, POLICY.node_health.half_life) for d in (0, 3, 6)
    )
    assert lemon.score == pytest.approx(expected)
    assert lemon.faults == {"fell_off_bus": 3} and list(lemon.gpus) == ["2"]
    assert old.score == pytest.approx(5.0)
    assert lemon.last_fault_at == NOW


@pytest.fixture
async def server(db_url: str, tmp_path: Path) -> AsyncIterator[TestServer]:
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        console_file=tmp_path / "console.jsonl",
        webhook_token=SecretStr(TOKEN),
    )
    topology = build_topology(
        TopologySettings(levels=("rack",), nodes={f"gpu-{i:04d}": {"rack": "r1"} for i in range(4)})
    )
    app = create_app(settings, topology=topology, clock=lambda: NOW)
    test_server = TestServer(app, host="127.0.0.1")
    await test_server.start_server()
    try:
        yield test_server
    finally:
        await test_server.close()


async def get(http: aiohttp.ClientSession, server: TestServer, query: str) -> tuple[int, Any]:
    async with http.get(server.make_url(f"/api/v1/nodes{query}")) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


async def test_nodes_sorted_by_health(server: TestServer) -> None:
    def at(days: float) -> datetime:
        return NOW - timedelta(days=days)

    alerts = [
        *(
            cluster_wide(make_alert(1, name="GPUFellOffBus", labels={"xid": "79"},
                                    starts_at=at(d), fingerprint=f"bus{int(d * 10)}"))
            for d in (0.5, 3, 6)
        ),
        cluster_wide(make_alert(2, name="IBLinkFlapping", labels={"device": "mlx5_0"},
                                starts_at=at(1))),
        *(
            cluster_wide(make_alert(3, name="NodeFilesystemSpaceCritical",
                                    labels={"component": "node"}, starts_at=at(d),
                                    fingerprint=f"disk{int(d * 10)}"))
            for d in (0.1, 0.2, 0.3, 0.4)
        ),
        # a team's own rule raising hardware faults of gpu-0003: its word, no fault
        *(
            make_alert(3, name="GPUFellOffBus", labels={"xid": "79", "node": "gpu-0003"},
                       starts_at=at(d), fingerprint=f"forged{int(d * 10)}")
            for d in (0.1, 0.2, 0.3, 0.4, 0.5)
        ),
    ]  # fmt: skip
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with http.post(server.make_url(WEBHOOK_PATH), data=encode(make_body(alerts))) as r:
            assert r.status == 200
        status, body = await get(http, server, "?sort=health")
        assert status == 200
        nodes = [(item["node"], item["faults"]) for item in body["items"]]
        assert nodes[:2] == [("gpu-0001", {"fell_off_bus": 3}), ("gpu-0002", {"ib_link_flap": 1})]
        # the disk-full node and the other placed nodes are healthy: score 0, after them
        assert [(item["node"], item["score"]) for item in body["items"][2:]] == [
            ("gpu-0000", 0.0), ("gpu-0003", 0.0),
        ]  # fmt: skip
        assert body["items"][0]["topology"] == {"rack": "r1"}
        assert body["items"][0]["gpus"][0]["gpu"] == "1"
        assert body["items"][0]["score"] > body["items"][1]["score"] > 0

        status, body = await get(http, server, "?sort=name&limit=2")
        assert [item["node"] for item in body["items"]] == ["gpu-0000", "gpu-0001"]
        assert body["total"] == 4
        for bad in ("?sort=worst", "?limit=0", "?limit=" + "9" * 50):
            status, _ = await get(http, server, bad)
            assert status == 400, bad
    async with aiohttp.ClientSession() as anonymous:
        status, _ = await get(anonymous, server, "")
        assert status == 401


def test_incidents_skip_alerts_that_say_nothing_about_the_hardware() -> None:
    from trainsentry.gateway.policy.infra import hardware_component

    disk = occurrence("NodeFilesystemSpaceCritical", "n1", 0, component="node")
    link = occurrence("IBPhysicalLinkDown", "n1", 0, component="fabric")
    down = occurrence("NodeExporterDown", "n1", 0, component="node")
    assert hardware_component(disk, POLICY) == ""
    assert (hardware_component(link, POLICY), hardware_component(down, POLICY)) == (
        "fabric",
        "node",
    )
