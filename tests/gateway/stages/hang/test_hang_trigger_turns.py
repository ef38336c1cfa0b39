"""One job's flood of hang triggers takes a few of each turn of the gateway's event loop,
and a trigger of a known hang is answered in the turn that handles it (issue 42: 25,000
posts in 5 s; `trigger.LoopTurns`, `JobHangs.known`).

Before, every request whose bytes had arrived was handled in the same turn: a job's
thousands of triggers made one turn long, and every other job's intake (a webhook's store
writes each wait for a turn) waited behind all of them. The handler test drives the real
app's trigger handler with requests whose bodies have arrived, all at once, as the event
loop sees a flood: 300 of team-a's then one of team-b's; team-b's answer comes in the
first turn, before all but `TRIGGERS_PER_TURN` of team-a's (before: after all 300).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import TestServer, make_mocked_request

from tests.support.gateway_process import close_in_process
from tests.support.hang_triggers import trigger_json
from trainsentry.gateway.api.app import HANG_TRIGGER_PATH, receive_hang_trigger
from trainsentry.gateway.stages.hang.trigger import (
    KNOWN_BODY,
    TRIGGERS_PER_TURN,
    LoopTurns,
)

PROBE_TOKEN = "probe-token"


async def test_a_key_gets_its_budget_a_turn_in_order_and_other_keys_never_wait() -> None:
    turns = LoopTurns(per_turn=4)
    order: list[tuple[str, int]] = []

    async def work(key: str, i: int) -> None:
        await turns.turn(key)
        order.append((key, i))

    tasks = [asyncio.ensure_future(work("a", i)) for i in range(10)]
    tasks.append(asyncio.ensure_future(work("b", 0)))
    await asyncio.sleep(0)  # one turn: every task has asked
    assert order == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0)]
    assert turns.waiting("a") == 6 and turns.waiting("b") == 0
    tasks[4].cancel()  # a waiter that goes away gives its place up
    await asyncio.gather(*tasks, return_exceptions=True)
    assert [i for key, i in order if key == "a"] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert turns.waiting("a") == 0
    for _ in range(3):  # idle again: nothing left scheduled, the next caller goes at once
        await asyncio.sleep(0)
    before = len(order)
    await work("a", 10)
    assert len(order) == before + 1


def _trigger(namespace: str, rank: int, seq: int) -> bytes:
    return trigger_json(namespace, "llama", rank, seq)


def _arrived(app: web.Application, body: bytes) -> web.Request:
    """A trigger request from 127.0.0.1 whose whole body has arrived, as aiohttp hands it to
    the handler in the turn after its bytes came."""
    protocol = mock.Mock(_reading_paused=False)
    payload = StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    payload.feed_data(body)
    payload.feed_eof()
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda key, default=None: (
        ("127.0.0.1", 40000) if key == "peername" else default
    )
    headers = {
        "Authorization": f"Bearer {PROBE_TOKEN}",
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
    }
    return make_mocked_request(
        "POST", HANG_TRIGGER_PATH, headers, app=app, payload=payload, transport=transport
    )


async def _gateway(tmp_path: Path) -> Any:
    from pydantic import SecretStr

    from trainsentry.config import GatewaySettings
    from trainsentry.config.diagnosis import DiagnosisSettings
    from trainsentry.gateway.assemble import Diagnosis, create_app
    from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints

    settings = GatewaySettings(
        listen="127.0.0.1:0", db=f"sqlite:///{tmp_path / 'gw.db'}", webhook_token=SecretStr("w")
    )
    jobs = {f"{team}/llama": ["127.0.0.1:9"] for team in ("team-a", "team-b")}
    diagnosis = Diagnosis(DiagnosisSettings(hold_seconds=1), StaticEndpoints(jobs), PROBE_TOKEN)
    server = TestServer(create_app(settings, diagnosis=diagnosis), host="127.0.0.1")
    await server.start_server()
    return server


async def test_one_jobs_flood_of_known_triggers_takes_a_few_of_each_turn(tmp_path: Path) -> None:
    server = await _gateway(tmp_path)
    try:
        async with aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {PROBE_TOKEN}"}
        ) as http:
            for team in ("team-a", "team-b"):  # each job's first trigger: its stored hang
                url = server.make_url(HANG_TRIGGER_PATH)
                async with http.post(url, data=_trigger(team, 0, 100)) as first:
                    assert first.status == 202, await first.text()
        app = server.app
        answered: list[tuple[str, int, bytes]] = []

        async def post(team: str, body: bytes) -> None:
            response = await receive_hang_trigger(_arrived(app, body))
            assert isinstance(response, web.Response) and isinstance(response.body, bytes)
            answered.append((team, response.status, response.body))

        flood = [post("team-a", _trigger("team-a", 1 + i % 63, 101 + i)) for i in range(300)]
        await asyncio.gather(*flood, post("team-b", _trigger("team-b", 5, 101)))
    finally:
        await close_in_process(server)
    assert {(status, body) for _, status, body in answered} == {(200, KNOWN_BODY)}
    assert json.loads(KNOWN_BODY)["hang"] == "known"  # what the probe stops posting on
    team_b = [team for team, _, _ in answered].index("team-b")
    assert team_b <= TRIGGERS_PER_TURN, f"team-b answered after {team_b} of team-a's triggers"
