"""Diagnosed hang alerts through the real gateway: the held page carries the culprit rank.

The ranks' probes are real HTTP servers on loopback serving Flight Recorder dumps (the
synthetic NCCL-style dumps of the diagnostics tests, rank 5 never entering the last
collective); the "feishu" channel is a webhook channel counted at a local receiver.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.gateway_process import close_in_process
from tests.support.receiver import Receiver
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.config import GatewaySettings
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.diagnostics.synthetic import make_dump
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import Diagnosis, create_app
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.probe.token import job_token

TOKEN = "gw-token"
PROBE_TOKEN = "probe-token"
WORLD = 8
CULPRIT = 5
JOB_TOKEN = job_token(PROBE_TOKEN, "ml", "llama")
HANG = {"alertname": "TrainingJobHang", "priority": "P0", "trainingjob": "llama", "namespace": "ml"}


async def start_probe(rank: int, *, silent: bool = False) -> web.AppRunner:
    dump = json.dumps(make_dump(rank, WORLD, 60, scenario="hang", culprit=CULPRIT)).encode()

    async def handle(request: web.Request) -> web.Response:
        # The gateway fetches with the job's own token, never the master (probe/token.py).
        if request.headers.get("Authorization") != f"Bearer {JOB_TOKEN}":
            return web.Response(status=401)
        if silent:
            await asyncio.sleep(6)
        return web.Response(
            body=dump,
            content_type="application/json",
            headers={"X-Trainsentry-Rank": str(rank), "X-Trainsentry-Pod": f"llama-w-{rank}",
                     "X-Trainsentry-Node": f"gpu-{rank // 4:02d}"},
        )  # fmt: skip

    app = web.Application()
    app.router.add_get("/dump", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def address(runner: web.AppRunner) -> str:
    port = runner.addresses[0][1]
    return f"127.0.0.1:{port}"


async def gateway(db_url: str, receiver: Receiver, endpoints: list[str]) -> TestServer:
    settings = GatewaySettings(listen="127.0.0.1:0", db=db_url, webhook_token=SecretStr(TOKEN))
    diagnosis = Diagnosis(
        DiagnosisSettings(hold_seconds=6, deadline_seconds=2, request_timeout_seconds=1),
        StaticEndpoints({"ml/llama": endpoints}),
        PROBE_TOKEN,
    )
    notifiers = {
        "console": ConsoleNotifier(),
        "feishu": WebhookNotifier(receiver.url, name="feishu"),
    }
    server = TestServer(
        create_app(settings, notifiers=notifiers, diagnosis=diagnosis), host="127.0.0.1"
    )
    await server.start_server()
    return server


async def post_hang(server: TestServer) -> float:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session:
        body = encode(make_body([make_alert(1, name="TrainingJobHang", labels=HANG)]))
        async with session.post(server.make_url(WEBHOOK_PATH), data=body) as response:
            assert response.status == 200
    return time.monotonic()


async def wait_delivered(receiver: Receiver, within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if receiver.bodies:
            return receiver.bodies[0]
        await asyncio.sleep(0.05)
    raise AssertionError("the hang page was never sent")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_hang_page_names_the_rank_that_never_arrived(db_url: str, receiver: Receiver) -> None:
    probes = [await start_probe(rank, silent=rank == 7) for rank in range(WORLD)]
    server = await gateway(db_url, receiver, [address(p) for p in probes])
    try:
        posted = await post_hang(server)
        page = await wait_delivered(receiver, within=10)
        waited = time.monotonic() - posted
        payload = page["payload"]
        assert payload["alertname"] == "TrainingJobHang"
        assert "rank 5" in payload["diagnosis"], payload["diagnosis"]
        # rank 7's probe never answered: it may be stuck too, so it is listed, after rank 5
        assert payload["culprit_ranks"][0] == CULPRIT
        assert waited < 6 + 1.5  # never later than the hold (plus scheduling slack)
        gw = server.app[GATEWAY_KEY]
        async with gw.engine.connect() as conn:
            from sqlalchemy import select

            from trainsentry.store.schema import alerts

            verdict = (await conn.execute(select(alerts.c.verdict))).scalar_one()
        assert verdict["verdict"] == "hang" and verdict["culprit_ranks"][0] == CULPRIT
        assert any("7" in failed for failed in verdict["ranks_failed"])  # the silent rank
    finally:
        await close_in_process(server)
        for probe in probes:
            await probe.cleanup()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_page_goes_out_at_the_end_of_the_hold_when_no_rank_answers(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    server = await gateway(db_url, receiver, ["127.0.0.1:9"])  # nothing listens there
    try:
        posted = await post_hang(server)
        page = await wait_delivered(receiver, within=10)
        # the page says the diagnosis found nothing rather than guessing a rank
        assert "no rank answered" in page["payload"].get("diagnosis", "no rank answered")
        assert not page["payload"].get("culprit_ranks")
        assert time.monotonic() - posted < 6 + 2.0
    finally:
        await close_in_process(server)
