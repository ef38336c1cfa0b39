"""One node (issue 45): with `policy.node_labels` naming a label the defaults do not, every
part of the gateway names the same node for an alert: the store (the blast radius counts
it), correlation, incidents, infrastructure incidents, topology, cordon, the cards and the
console. Through a real gateway in process (SQLite and PostgreSQL).

The alerts name their node by `kubernetes_node` and carry node_exporter's `instance`
(`10.0.0.N:9100`), which the default `node_labels` would take for the node: a part that
resolved the node on its own would name the address.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr
from sqlalchemy import select

from tests.gateway.ui.helpers import signed_in
from tests.support.gateway_process import close_in_process, post_alerts
from tests.support.webhook_factory import BASE_TIME, make_alert
from trainsentry.config import ConsoleSettings, GatewaySettings
from trainsentry.config.remediation import CordonSettings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.cordon import candidates
from trainsentry.gateway.policy.incident import IncidentState
from trainsentry.gateway.policy.infra import InfraState
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.sections import build_topology
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import node_of, parse_payload
from trainsentry.store.incidents import incident_of_alert
from trainsentry.store.node_health import node_occurrences
from trainsentry.store.policy_state import load_states
from trainsentry.store.schema import alerts, notifications

TOKEN = "node-labels-token"
# The lone GPU's card at once, not after `infrastructure.hold` (this test is about its node)
POLICY = "node_labels: [kubernetes_node]\ninfrastructure: {hold: 0}\n"
TOPOLOGY = {
    "levels": ["leaf_switch", "rack"],
    "nodes": {
        **{f"gpu-node-{i}": {"leaf_switch": "leaf-7", "rack": "r1"} for i in (1, 2, 3)},
        "gpu-node-9": {"leaf_switch": "leaf-9", "rack": "r2"},
    },
}
LINK_DOWN = (1, 2, 3)  # one IB link down on each of three nodes under leaf-7
FELL_OFF = 9  # a GPU fell off the bus on gpu-node-9, alone under leaf-9
NOW = BASE_TIME + timedelta(seconds=30)  # the gateway's clock: all of them within the window


def on_node(index: int, name: str, **labels: str) -> dict[str, Any]:
    """A cluster-wide alert (no namespace: trusted evidence, tenancy.py) naming its node
    `gpu-node-<index>` by `kubernetes_node` only."""
    alert = make_alert(
        index,
        name=name,
        labels={
            "kubernetes_node": f"gpu-node-{index}",
            "instance": f"10.0.0.{index}:9100",
            "priority": "P0",
            **labels,
        },
        starts_at=BASE_TIME + timedelta(seconds=index),
    )
    for label in ("node", "namespace", "trainingjob"):  # cluster-wide: trusted evidence
        del alert["labels"][label]
    return alert


@pytest.fixture
async def gateway(db_url: str, tmp_path: Path) -> AsyncIterator[TestServer]:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=db_url,
        webhook_token=SecretStr(TOKEN),
        api_token=SecretStr(TOKEN),
        console=ConsoleSettings(),
        policy_file=policy_file,
    )
    app = create_app(
        settings,
        notifiers={"console": ConsoleNotifier()},
        topology=build_topology(TopologySettings.model_validate(TOPOLOGY)),
        tick_interval=3600,
        clock=lambda: NOW,
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        links = [
            on_node(i, "IBPhysicalLinkDown", component="fabric", device="mlx5_0", port="1")
            for i in LINK_DOWN
        ]
        fell = on_node(FELL_OFF, "GPUFellOffBus", component="gpu", gpu="3")
        await post_alerts(server, [*links, fell], TOKEN)
        yield server
    finally:
        await close_in_process(server)


async def test_every_part_names_the_node_the_policy_s_node_labels_name(
    gateway: TestServer,
) -> None:
    engine = gateway.app[GATEWAY_KEY].engine
    policy = load_policy(overrides={"node_labels": ["kubernetes_node"]})
    async with engine.connect() as conn:
        stored = {
            row.fingerprint: row
            for row in await conn.execute(
                select(alerts.c.id, alerts.c.fingerprint, alerts.c.node, alerts.c.topology)
            )
        }
        sent = list((await conn.execute(select(notifications))).all())
        fell = stored[f"{FELL_OFF:016x}"]
        incident = await incident_of_alert(conn, fell.id)
        correlation = await load_states(
            conn, "correlation", ["node=gpu-node-9", "node=10.0.0.9:9100"]
        )
        infra = await load_states(conn, "infra", ["leaf_switch=leaf-7"])
        occurrences = await node_occurrences(conn, BASE_TIME)

    element = infra.get("leaf_switch=leaf-7")
    found = candidates(  # what cordon reads (stages/services/cordon.py), what it would recommend
        [row.alert() for row in occurrences], policy, CordonSettings(threshold=1), {}, NOW
    )
    [card] = [r for r in sent if r.kind == "alert" and r.alert_id == fell.id]
    payload = parse_payload(card.payload)
    drawn = json.dumps(build_card(card.kind, payload))
    opened = [r for r in sent if r.kind == "infra" and r.payload["event"] == "infra_opened"]
    session = await signed_in(gateway, "ann", TOKEN)
    try:
        async with session.get(gateway.make_url("/ui/")) as r:
            page = await r.text()
    finally:
        await session.close()
    assert incident is not None

    named = {
        # the node each occurrence is stored with (the blast radius and node health count it)
        "store": sorted(row.node for row in stored.values()),
        # the leaf switch each alert was placed under, by its node
        "topology": sorted((row.topology or {}).get("leaf_switch", "-") for row in stored.values()),
        "correlation": [key.removeprefix("node=") for key in correlation],
        "incident": sorted(IncidentState.from_json(incident.state).nodes),
        "infrastructure": list(InfraState.from_json(element).nodes) if element else [],
        "infrastructure card": [n for r in opened for n in r.payload["infrastructure"]["nodes"]],
        "cordon": sorted(c.health.node for c in found),
        "card payload": [node_of(payload)],
        "card": re.findall(r"\*\*Node:\*\* ([^\\\"]+)", drawn),
        "console": sorted(re.findall(r'<span class="where">([^< ]*)', page)),
    }
    under_leaf_7 = ["gpu-node-1", "gpu-node-2", "gpu-node-3"]
    assert named == {
        "store": [*under_leaf_7, "gpu-node-9"],
        "topology": ["leaf-7", "leaf-7", "leaf-7", "leaf-9"],
        "correlation": ["gpu-node-9"],
        "incident": ["gpu-node-9"],
        "infrastructure": under_leaf_7,
        "infrastructure card": under_leaf_7,
        "cordon": [*under_leaf_7, "gpu-node-9"],
        "card payload": ["gpu-node-9"],
        "card": ["gpu-node-9"],
        "console": [*under_leaf_7, "gpu-node-9"],
    }
