"""The gateway writes status.lastAlert of TrainingJobs through the (emulated) Kubernetes API:
once per job per batch, resolved when that alert resolves, a storm costs a few calls."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration
from pydantic import SecretStr

from tests.operator.operator_harness import NS, TJ, post, trainingjob
from tests.support.eventually import eventually
from tests.support.gateway_process import close_in_process
from tests.support.kube_emulator import KubeEmulator
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app

TJ_PATH = f"/apis/trainsentry.io/v1alpha1/namespaces/{NS}/trainingjobs"
TOKEN = "t"


def last_alert(emu: KubeEmulator, name: str) -> dict[str, Any]:
    obj = emu.get_live(TJ, NS, name) or {}
    return (obj.get("status") or {}).get("lastAlert") or {}


def status_patches(emu: KubeEmulator) -> int:
    return sum(
        1
        for call in emu.calls
        if call.verb == "patch" and call.resource == "trainingjobs" and call.subresource == "status"
    )


async def start_gateway(
    cluster: KubeEmulator,
    tmp_path: Any,
    *,
    stale_after_seconds: float | None = None,
    tick_interval: float = 1.0,
) -> TestServer:
    """A gateway writing TrainingJob status to the emulated cluster."""
    extra = {} if stale_after_seconds is None else {"stale_after_seconds": stale_after_seconds}
    settings = GatewaySettings(
        listen="127.0.0.1:0",
        db=f"sqlite:///{tmp_path / 'gw.db'}",
        webhook_token=SecretStr(TOKEN),
        trainingjob_status=True,
        **extra,
    )

    async def api() -> ApiClient:
        return ApiClient(Configuration(host=str(cluster.url).rstrip("/")))

    server = TestServer(
        create_app(settings, kube_api=api, tick_interval=tick_interval), host="127.0.0.1"
    )
    await server.start_server()
    return server


async def test_gateway_feeds_last_alert(cluster: KubeEmulator, tmp_path: Any) -> None:
    await post(cluster, TJ_PATH, trainingjob("llama"))
    server = await start_gateway(cluster, tmp_path)
    labels = {"trainingjob": "llama", "namespace": NS}
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:

            async def send(alerts: list[dict[str, Any]]) -> None:
                body = encode(make_body(alerts))
                async with http.post(server.make_url(WEBHOOK_PATH), data=body) as response:
                    assert response.status == 200

            hang = {**labels, "priority": "P0"}
            await send([make_alert(1, name="TrainingJobHang", labels=hang)])
            await eventually(
                lambda: last_alert(cluster, "llama").get("name") == "TrainingJobHang", within=10.0
            )
            assert last_alert(cluster, "llama")["priority"] == "P0"
            assert last_alert(cluster, "llama")["status"] == "firing"

            before = status_patches(cluster)
            for batch in range(4):  # a 200-alert storm of lesser alerts
                await send([make_alert(100 + batch * 50 + i, labels={**labels, "priority": "P2"})
                            for i in range(50)])  # fmt: skip
            await asyncio.sleep(0.5)
            assert status_patches(cluster) - before <= 4  # at most one per batch, not per alert

            await send([make_alert(1, name="TrainingJobHang", labels=hang, status="resolved")])
            await eventually(
                lambda: last_alert(cluster, "llama").get("status") == "resolved", within=10.0
            )
            # an alert of a job without a TrainingJob is not an error
            await send([make_alert(2, labels={"trainingjob": "ghost", "namespace": NS})])
            await asyncio.sleep(0.3)
    finally:
        await close_in_process(server)


async def test_a_hang_alert_alertmanager_stopped_sending_clears_last_alert(
    cluster: KubeEmulator, tmp_path: Any
) -> None:
    """Alertmanager stops sending an alert (e.g. it lost it in a restart): once its endsAt has
    passed, the gateway's ticker expires it, and the job's phase must recover from Hung."""
    await post(cluster, TJ_PATH, trainingjob("llama"))
    server = await start_gateway(cluster, tmp_path, stale_after_seconds=0.5, tick_interval=0.2)
    hang = {"trainingjob": "llama", "namespace": NS, "priority": "P0"}
    ends = datetime.now(UTC) + timedelta(seconds=1)
    try:
        body = encode(make_body([make_alert(1, name="TrainingJobHang", labels=hang, ends_at=ends)]))
        async with (
            aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
            http.post(server.make_url(WEBHOOK_PATH), data=body) as response,
        ):
            assert response.status == 200
        await eventually(
            lambda: last_alert(cluster, "llama").get("status") == "firing", within=10.0
        )
        await eventually(
            lambda: last_alert(cluster, "llama").get("status") == "resolved", within=10.0
        )
        assert last_alert(cluster, "llama")["name"] == "TrainingJobHang"
    finally:
        await close_in_process(server)
