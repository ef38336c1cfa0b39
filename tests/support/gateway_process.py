"""Runs the real gateway (`trainsentry gateway`) as a subprocess on a free loopback port;
`close_in_process` closes one started in-process with aiohttp's TestServer."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.support.realservers import RunningServer, start_server
from tests.support.webhook_factory import bodies_by_group, encode
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.pipeline import GATEWAY_KEY


def start_gateway(
    tmp_path: Path,
    db_url: str,
    *,
    token: str | None = None,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    console_file: Path | None = None,
    log_level: str | None = None,
    python_args: Sequence[str] = (),
) -> RunningServer:
    """`python_args`: the interpreter's own options before `-m trainsentry` (e.g. a
    profiler's)."""
    full_env = dict(env or {})
    if token:
        full_env["TRAINSENTRY_WEBHOOK_TOKEN"] = token
        full_env.setdefault("TRAINSENTRY_API_TOKEN", token)

    def argv(port: int, _workdir: Path) -> list[str]:
        args = [
            sys.executable,
            *python_args,
            "-m",
            "trainsentry",
            "gateway",
            "--listen",
            f"127.0.0.1:{port}",
        ]
        args += ["--db", db_url]
        if config is not None:
            args += ["--config", str(config)]
        if console_file is not None:
            args += ["--console-file", str(console_file)]
        if log_level is not None:
            args += ["--log-level", log_level]
        return args

    return start_server(tmp_path, "gateway", argv, ready_path="/readyz", env=full_env)


async def close_in_process(server: TestServer) -> None:
    """Closes an in-process gateway, then lets the loop run until no other task is left (at
    least 10 ms, at most 0.2 s: a test may keep tasks of its own, a second replica say), so
    connection closes still under way finish in the test rather than in pytest-asyncio's
    loop shutdown. (The teardown hangs once seen here came from aiosqlite's stop():
    store/sqlite_driver.py.) Most tests have none left once the server closed, where a
    fixed 0.2 s wait was spent in full."""
    await server.close()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 0.2
    this = asyncio.current_task()
    while True:
        await asyncio.sleep(0.01)
        busy = any(task is not this and not task.done() for task in asyncio.all_tasks())
        if not busy or loop.time() >= deadline:
            return


async def post_alerts(
    server: TestServer, alerts: list[dict[str, Any]], token: str | None = None
) -> None:
    """Posts `alerts` to an in-process gateway as Alertmanager would (one webhook per group,
    the shipped route: webhook_factory.bodies_by_group), asserts the 200s, then waits until
    the gateway has planned and sent what they caused (`settle`)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        url = server.make_url(WEBHOOK_PATH)
        for body in bodies_by_group(alerts):
            async with session.post(url, data=encode(body)) as response:
                assert response.status == 200, await response.text()
    await server.app[GATEWAY_KEY].settle()


def settled_rss(pid: int, *, within_s: float = 30.0) -> int:
    """The process's resident memory once it stops growing (the gateway imports the
    analyzer in the background after it is ready): two readings 1 s apart within 1 MiB."""
    import time

    def rss() -> int:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    deadline = time.monotonic() + within_s
    last = rss()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = rss()
        if abs(now - last) < 2**20:
            return now
        last = now
    return last
