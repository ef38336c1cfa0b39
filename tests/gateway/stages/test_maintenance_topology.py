"""A maintenance window on a rack (docs/oncall.md's `--match rack=r7`) mutes the alerts of
that rack's nodes through the real gateway: the alerts carry no `rack` label, the topology
stage (issue 23) knows each node's place, and windows match it; the same P0 on a node of
another rack rings."""

from __future__ import annotations

from datetime import timedelta

from tests.gateway.stages.test_maintenance_service import (
    P0,
    START,
    call,
    phoned,
    post_alerts,
    settle,
    start,
)
from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from tests.support.webhook_factory import make_alert
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.sections import build_topology

TOPOLOGY = {
    "levels": ["leaf_switch", "rack"],
    "nodes": {
        "gpu-17": {"leaf_switch": "leaf-3", "rack": "r7"},
        "gpu-18": {"leaf_switch": "leaf-3", "rack": "r8"},
    },
}


async def test_a_window_on_a_rack_mutes_the_alerts_of_its_nodes(
    db_url: str, receiver: Receiver
) -> None:
    clock = Clock(START)
    server = await start(
        db_url, receiver, clock, topology=build_topology(TopologySettings.model_validate(TOPOLOGY))
    )
    try:
        body = {
            "matchers": {"rack": "r7", "alertname": {"regex": "GPU.*"}},
            "starts_at": START.isoformat(),
            "ends_at": (START + timedelta(hours=2)).isoformat(),
            "reason": "rack r7 power work",
            "created_by": "alice",
        }
        status, window = await call(server, "POST", "/api/v1/maintenance", body)
        assert status == 201, window
        await post_alerts(
            server,
            [
                make_alert(1, labels={**P0, "node": "gpu-17"}),  # GPUXidError on rack r7
                make_alert(2, labels={**P0, "node": "gpu-18"}),  # rack r8
                make_alert(3, labels={**P0, "node": "gpu-17"}, name="NodeDown"),  # not GPU.*
                # its own rack label wins over the topology's place
                make_alert(4, labels={**P0, "node": "gpu-17", "rack": "r9"}),
            ],
        )
        await settle(server)
        # 2 and 4 (not muted: its own rack r9) are one incident, one page; 3 is another cause
        assert sorted(phoned(receiver)) == [(2, "firing"), (3, "firing")]
        status, detail = await call(server, "GET", "/api/v1/alerts/4")
        assert detail["muted_by"] is None
        status, detail = await call(server, "GET", "/api/v1/alerts/1")
        assert detail["muted_by"]["window_id"] == window["id"]
        assert detail["muted_by"]["reason"] == "rack r7 power work"
    finally:
        await close_in_process(server)
