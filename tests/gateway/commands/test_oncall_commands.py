"""`trainsentry oncall override`, `trainsentry escalate` and `trainsentry ack --comment` as a
user runs them (subprocesses) against a real gateway on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.oncall_gateway import START, TOKEN, call, called, post_alerts, settle
from tests.support.oncall_gateway import start as start_gateway
from tests.support.receiver import Receiver
from tests.support.webhook_factory import make_alert, make_body


async def cli(*args: str, token: str = TOKEN) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSENTRY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trainsentry", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**env, "TRAINSENTRY_API_TOKEN": token},
    )  # fmt: skip
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_override_escalate_and_ack_commands(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start_gateway(db_url, receiver, clock, tmp_path)
    url = str(server.make_url("/")).rstrip("/")
    try:
        code, out = await cli(
            "oncall", "override", "add", "--schedule", "gpu-infra", "--who", "carol",
            "--start", "2026-11-20T00:00", "--end", "2026-11-20T12:00", "--reason", "swap day",
            "--by", "alice", "--gateway", url, "--json",
        )  # fmt: skip
        assert code == 0, out
        added = json.loads(out)
        assert (added["who"], added["created_by"], added["reason"]) == (
            "carol",
            "alice (API token)",  # the typed name, with the token it came with
            "swap day",
        )
        code, out = await cli(
            "oncall", "override", "add", "--schedule", "gpu-infra", "--who", "zed",
            "--start", "2026-11-21T00:00", "--end", "2026-11-21T12:00", "--gateway", url,
        )  # fmt: skip
        assert code == 1 and "who: unknown person 'zed'" in out
        code, out = await cli("oncall", "override", "list", "--gateway", url)
        assert code == 0 and f"#{added['id']} gpu-infra override carol" in out
        await post_alerts(server, make_body([make_alert(1, labels={"priority": "P0"})]))
        await settle(server)
        assert called(receiver) == ["carol"]
        code, out = await cli("escalate", "1", "--by", "carol", "--gateway", url)
        assert code == 0 and "calling alice (gpu-infra#2)" in out, out
        await settle(server)
        assert called(receiver) == ["carol", "alice"]
        code, out = await cli("escalate", "99", "--gateway", url)
        assert code == 3
        code, out = await cli(
            "ack", "1", "--by", "alice", "--comment", "on it", "--gateway", url, "--json"
        )
        assert code == 0 and json.loads(out)["comment"] == "on it"
        code, out = await cli("escalate", "1", "--gateway", url)
        assert code == 1 and "409" in out
        code, out = await cli("oncall", "override", "remove", str(added["id"]), "--gateway", url)
        assert code == 0 and out.startswith("removed")
        code, out = await cli("oncall", "override", "remove", str(added["id"]), "--gateway", url)
        assert code == 3
        code, out = await cli("oncall", "override", "list", "--gateway", url, token="wrong")
        assert code == 1 and "401" in out
        clock.now = START + timedelta(hours=1)
        status, _ = await call(server, "GET", "/api/v1/oncall")
        assert status == 200
    finally:
        await close_in_process(server)
