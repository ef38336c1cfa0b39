"""A window's regular expression and a crafted label cannot freeze the gateway (issue 32
finding 2), through the real gateway process, its Feishu bot channel and Feishu's contract
server.

A window `{"node": {"regex": "(a+)+"}}` and an alert whose node is 28 `a`s and a `!` froze
the gateway with Python's `re` (13-31 s of backtracking on the event loop): another job's P0
was answered and carded that late, `/healthz` too, and after a kill -9 the change was
planned again and froze the restarted process. With RE2 the other job's P0 is answered and
its card reaches Feishu within 2 s, before and after a kill -9 and restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import start_gateway
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.alerts import utcnow
from trainsentry.gateway.api.app import WEBHOOK_PATH

pytestmark = pytest.mark.e2e
TOKEN = "freeze-token"
HOOK = "bot-hook-freeze"
CRAFTED = "a" * 28 + "!"  # (a+)+ backtracks 2**28 ways over it before failing
WITHIN_S = 2.0  # the bar: another job's P0 answered and carded within 2 s


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "gateway.yaml"
    group = {"priorities": ["P0", "P1", "P2", "P3"], "url_env": "BOT_URL"}
    config.write_text(yaml.safe_dump({"channels": {"feishu_bot": {"groups": {"all": group}}}}))
    return config


async def post(session: aiohttp.ClientSession, url: str, alerts: list[dict[str, Any]]) -> float:
    """Posts one webhook; the seconds until its 200."""
    started = time.monotonic()
    async with session.post(url + WEBHOOK_PATH, data=encode(make_body(alerts))) as response:
        assert response.status == 200, await response.text()
    return time.monotonic() - started


def crafted(index: int, label: str = CRAFTED) -> dict[str, Any]:
    labels = {"priority": "P1", "trainingjob": "team-a-sweep", "namespace": "team-a", "node": label}
    return make_alert(index, labels=labels, starts_at=utcnow())


async def other_jobs_p0_is_prompt(
    session: aiohttp.ClientSession,
    gateway: RunningServer,
    feishu: FeishuContractServer,
    index: int,
) -> None:
    """Another job's P0: answered, carded (the contract server accepted its card) and
    /healthz answered, each within WITHIN_S."""
    job = f"llama-{index}"
    labels = {"priority": "P0", "trainingjob": job, "namespace": "team-b", "node": "gpu-node-2"}
    started = time.monotonic()
    alert = make_alert(index, labels=labels, starts_at=utcnow())
    answered = await post(session, gateway.url, [alert])

    def carded() -> bool:
        return any(job in json.dumps(body) for _, body in feishu.accepted[HOOK])

    await eventually(carded, within=30, interval=0.02)
    card_s = time.monotonic() - started
    started = time.monotonic()
    async with session.get(gateway.url + "/healthz") as response:
        assert response.status == 200
    health_s = time.monotonic() - started
    assert max(answered, card_s, health_s) < WITHIN_S, (
        f"P0 answered after {answered:.2f}s, carded after {card_s:.2f}s, "
        f"/healthz after {health_s:.2f}s"
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_backtracking_window_regex_cannot_hold_up_another_jobs_p0(
    db_url: str, tmp_path: Path
) -> None:
    feishu = FeishuContractServer(hooks={HOOK: Hook()})
    async with feishu:
        config = write_config(tmp_path)
        env = {"BOT_URL": feishu.hook_url(HOOK)}

        def start(name: str) -> RunningServer:
            return start_gateway(tmp_path / name, db_url, token=TOKEN, config=config, env=env)

        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            gateway = await asyncio.to_thread(start, "first")
            try:
                now = utcnow()
                window = {
                    "matchers": {"node": {"regex": "(a+)+"}},
                    "starts_at": now.isoformat(),
                    "ends_at": (now + timedelta(hours=1)).isoformat(),
                    "reason": "rack work",
                    "created_by": "alice",
                }
                async with session.post(f"{gateway.url}/api/v1/maintenance", json=window) as r:
                    assert r.status == 201, await r.text()
                await post(session, gateway.url, [crafted(1)])
                await other_jobs_p0_is_prompt(session, gateway, feishu, 101)

                # kill -9 right after a crafted alert is answered: its change waits to be
                # planned when the process comes back
                await post(session, gateway.url, [crafted(2, "a" * 27 + "!")])
                os.kill(gateway.process.pid, signal.SIGKILL)
                await asyncio.to_thread(gateway.process.wait, 10)
                assert gateway.process.returncode == -signal.SIGKILL
            finally:
                await asyncio.to_thread(gateway.stop)

            gateway = await asyncio.to_thread(start, "second")
            try:
                await other_jobs_p0_is_prompt(session, gateway, feishu, 102)
                # the stored window still matches (RE2 now) a crafted label sent after restart
                await post(session, gateway.url, [crafted(3, "a" * 29 + "!")])
                await other_jobs_p0_is_prompt(session, gateway, feishu, 103)
            finally:
                await asyncio.to_thread(gateway.stop)
