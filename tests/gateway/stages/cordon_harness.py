"""What the cordon tests share: the Kubernetes API as the kmock emulator over HTTP with the
real TrainingJob CRD and built-in schemas, the real gateway in process (a replica per call,
each with its own console file, all on one database), a real Prometheus remembering the
alerts it fired (the evidence the gateway asks for: tests/support/prometheus_history.py),
presses of the card's buttons as signed Feishu callbacks through the gateway's callback
route, and alerts as Alertmanager sends them. The approver is alice (`ou_alice`)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import kmock
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.operator.operator_harness import TJ, Validator, declare_cluster
from tests.support.gateway_process import close_in_process, post_alerts
from tests.support.kube_emulator import KubeEmulator
from tests.support.prometheus_history import remembering
from tests.support.webhook_factory import make_alert
from trainsentry.config import Settings
from trainsentry.config.remediation import CordonSettings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.api.app import CardCallbackSettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.sections import build_topology
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.sign import event_signature
from trainsentry.oncall.config import parse_oncall

VERIFICATION = "vt-cordon"
ENCRYPT_KEY = "ek-cordon"
CARD_PATH = "/api/v1/feishu/card"
TOKEN = "api-token"
JOBS_PATH = "/apis/trainsentry.io/v1alpha1/namespaces/ml/trainingjobs"
NODES = [f"gpu-node-{index}" for index in range(8)]
ONCALL = {
    "people": {"alice": {"feishu_open_id": "ou_alice"}, "bob": {"feishu_open_id": "ou_bob"}},
    "schedules": {
        "infra": {
            "timezone": "UTC",
            "layers": [
                {"name": "primary", "start": "2026-01-05T09:00", "shift": "1w", "members": ["bob"]}
            ],
        }
    },
}


async def create(cluster: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    async with cluster.post(path, json=body) as answer:
        assert answer.status == 201, await answer.text()


async def list_nodes(cluster: KubeEmulator, job: str, nodes: Sequence[str]) -> None:
    """Writes `status.nodes` of TrainingJob ml/JOB, as the operator does."""
    headers = {"Content-Type": "application/merge-patch+json"}
    body = {"status": {"nodes": list(nodes)}}
    async with cluster.patch(f"{JOBS_PATH}/{job}/status", json=body, headers=headers) as reply:
        assert reply.status == 200, await reply.text()


def node_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}


def job_body(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainsentry.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"job": name}}},
    }


def fault(
    index: int,
    node: str,
    job: str | None,
    hours_ago: float,
    name: str = "GPUFellOffBus",
    **labels: str,
) -> dict[str, Any]:
    """An alert occurrence as Alertmanager sends it; `job` None: a cluster-wide rule's alert,
    which names no namespace and no TrainingJob."""
    at = datetime.now(UTC) - timedelta(hours=hours_ago)
    alert = make_alert(
        index, name=name, starts_at=at,
        labels={"node": node, "namespace": "ml", "trainingjob": job or "", "component": "gpu",
                **labels},
    )  # fmt: skip
    if job is None:
        for key in ("namespace", "trainingjob"):
            del alert["labels"][key]
    return alert


@contextlib.asynccontextmanager
async def emulated_cluster() -> AsyncIterator[KubeEmulator]:
    """Eight Nodes and two TrainingJobs in `ml`: "big", whose status lists the eight nodes,
    and "small", which lists none yet."""
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu, workloads=False)
        emu.validator = Validator()
        for node in NODES:
            await create(emu, "/api/v1/nodes", node_body(node))
        for job in ("big", "small"):
            await create(emu, JOBS_PATH, job_body("ml", job))
        await list_nodes(emu, "big", NODES)
        yield emu


@dataclass
class Running:
    server: TestServer
    gateway: Gateway
    console: Path

    async def post(self, *alerts: dict[str, Any]) -> None:
        await post_alerts(self.server, list(alerts))

    def cards(self) -> list[dict[str, Any]]:
        if not self.console.exists():
            return []
        lines = [json.loads(line) for line in self.console.read_text().splitlines()]
        return [line["payload"] for line in lines if line["kind"] == "cordon"]

    async def press(self, value: dict[str, Any], event_id: str, who: str = "ou_alice") -> str:
        return str((await self.press_answer(value, event_id, who))["toast"]["content"])

    async def press_answer(
        self, value: dict[str, Any], event_id: str, who: str = "ou_alice"
    ) -> dict[str, Any]:
        body = json.dumps(
            {
                "schema": "2.0",
                "header": {
                    "event_id": event_id,
                    "token": VERIFICATION,
                    "event_type": "card.action.trigger",
                },
                "event": {
                    "operator": {"open_id": who},
                    "action": {"value": value, "tag": "button"},
                    "context": {"open_message_id": "om_1"},
                },
            }
        ).encode()
        ts = str(int(time.time()))
        headers = {
            "X-Lark-Request-Timestamp": ts,
            "X-Lark-Request-Nonce": "n-" + event_id,
            "X-Lark-Signature": event_signature(ts, "n-" + event_id, ENCRYPT_KEY, body),
            "Content-Type": "application/json",
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.server.make_url(CARD_PATH), data=body, headers=headers) as answer,
        ):
            assert answer.status == 200, await answer.text()
            return dict(await answer.json())


Start = Callable[..., Awaitable[Running]]


@contextlib.asynccontextmanager
async def gateways(cluster: KubeEmulator, tmp_path: Path, db_url: str) -> AsyncIterator[Start]:
    """`start(fired=ALERTS, **remediation)` starts a gateway (a replica, with its own console
    file) on the one database, talking to `cluster`, with a Prometheus that fired ALERTS
    (None: no Prometheus; `evidence_url` names one instead)."""
    servers: list[TestServer] = []
    prometheus = contextlib.ExitStack()

    async def api() -> ApiClient:
        return ApiClient(Configuration(host=str(cluster.url).rstrip("/")))

    async def run(
        *,
        replica: str = "a",
        topology: dict[str, Any] | None = None,
        channels: dict[str, Any] | None = None,
        fired: Sequence[Mapping[str, Any]] | None = None,
        evidence_url: str = "",
        **remediation: Any,
    ) -> Running:
        settings = Settings.model_validate({"gateway": {"db": db_url, "api_token": TOKEN}})
        console = tmp_path / f"console-{replica}.jsonl"
        if fired is not None:
            evidence_url = prometheus.enter_context(remembering(tmp_path, fired)).url
        app = create_app(
            settings.gateway,
            notifiers={**(channels or {}), "console": ConsoleNotifier(console)},
            card_callback=CardCallbackSettings(CARD_PATH, VERIFICATION, ENCRYPT_KEY),
            kube_api=api,
            topology=build_topology(TopologySettings.model_validate(topology or {})),
            oncall=parse_oncall(ONCALL),
            remediation=CordonSettings.model_validate(
                {
                    "threshold": 15,
                    "check_seconds": 3600,
                    "approvers": ["alice"],
                    "evidence": {"prometheus_url": evidence_url},
                    **remediation,
                }
            ),
        )
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return Running(server, server.app[GATEWAY_KEY], console)

    try:
        yield run
    finally:
        for server in servers:
            await close_in_process(server)
        prometheus.close()


def unschedulable(cluster: KubeEmulator, node: str) -> bool:
    body = cluster.get_live("v1/nodes", None, node) or {}
    return bool(body.get("spec", {}).get("unschedulable"))


def node_events(cluster: KubeEmulator, node: str) -> list[dict[str, Any]]:
    return [e for e in cluster.live("v1/events", "default") if e["involvedObject"]["name"] == node]


def job_condition(cluster: KubeEmulator, job: str) -> dict[str, Any] | None:
    body = cluster.get_live(TJ, "ml", job) or {}
    found = [c for c in body.get("status", {}).get("conditions", []) if c["type"] == "NodeCordoned"]
    return found[0] if found else None
