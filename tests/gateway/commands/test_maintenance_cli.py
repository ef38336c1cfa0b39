"""`trainsentry maintenance add|list|end` as a user runs it (subprocesses) against a real
gateway over loopback HTTP."""

from __future__ import annotations

import json

import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.gateway.commands.test_cli_commands import run_cli
from tests.support.gateway_process import close_in_process
from trainsentry.config import GatewaySettings, MaintenanceSettings
from trainsentry.gateway.assemble import create_app

TOKEN = "cli-token"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_maintenance_add_list_end(db_url: str) -> None:
    settings = GatewaySettings(
        listen="127.0.0.1:0", db=db_url, webhook_token=SecretStr(TOKEN), api_token=SecretStr(TOKEN)
    )
    maintenance = MaintenanceSettings(max_window_hours=48, max_total_hours=24 * 30)
    app = create_app(settings, maintenance=maintenance)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        gateway = ["--gateway", str(server.make_url("/")).rstrip("/")]
        env = {"TRAINSENTRY_API_TOKEN": TOKEN}
        code, out = await run_cli(
            "maintenance", "add", "--match", "node=gpu-node-17", "--match", "job~llama-.*",
            "--duration", "2h", "--reason", "NVLink swap", "--by", "alice", "--json",
            *gateway, env=env,
        )  # fmt: skip
        assert code == 0, out
        one_off = json.loads(out)
        assert one_off["matchers"] == {"node": "gpu-node-17", "job": {"regex": "llama-.*"}}
        assert one_off["active"] and one_off["created_by"] == "alice (API token)"  # with how
        code, out = await run_cli(
            "maintenance", "add", "--match", "rack=r7", "--rrule", "FREQ=WEEKLY;BYDAY=TU;COUNT=4",
            "--at", "02:00", "--duration", "120m", "--timezone", "Europe/Berlin", *gateway,
            env=env,
        )  # fmt: skip
        assert code == 0, out
        recurring_id = out.split()[0]
        assert recurring_id.startswith("mw-") and "FREQ=WEEKLY;BYDAY=TU;COUNT=4" in out
        code, out = await run_cli("maintenance", "list", *gateway, env=env)
        assert code == 0 and one_off["id"] in out and recurring_id in out, out
        assert "ACTIVE" in out and "NVLink swap" in out
        code, out = await run_cli(
            "maintenance", "end", one_off["id"], "--by", "bob", *gateway, env=env
        )
        assert code == 0 and "ended by bob" in out, out
        code, out = await run_cli("maintenance", "list", "--json", *gateway, env=env)
        assert [w["id"] for w in json.loads(out)["items"]] == [recurring_id]
        code, out = await run_cli("maintenance", "list", "--all", *gateway, env=env)
        assert one_off["id"] in out and "ended by bob" in out
        # refusals: the field named, exit 2; no such window, exit 3; a wrong token, exit 1
        code, out = await run_cli(
            "maintenance", "add", "--match", "node=x", "--duration", "3d", *gateway, env=env
        )
        assert code == 2 and "window.ends_at" in out and "cap" in out, out
        code, out = await run_cli(
            "maintenance", "add", "--match", "node=x", "--rrule", "FREQ=DAILY", "--at", "02:00",
            "--duration", "1h", "--timezone", "Mars/Base", *gateway, env=env,
        )  # fmt: skip
        assert code == 2 and "window.timezone" in out, out
        # windows that would mute every alert, or never end (issue 32 finding 5)
        code, out = await run_cli(
            "maintenance", "add", "--match", "node=x", "--rrule", "FREQ=DAILY", "--at", "00:00",
            "--duration", "1d", "--timezone", "UTC", *gateway, env=env,
        )  # fmt: skip
        assert code == 2 and "window.rrule: needs COUNT or UNTIL" in out, out
        code, out = await run_cli(
            "maintenance", "add", "--match", "nosuchlabel=", "--duration", "1h", *gateway, env=env
        )
        assert code == 2 and "window.matchers: every matcher matches the empty string" in out
        code, out = await run_cli(
            "maintenance", "add", "--match", "node~(a+)+(?=!)", "--duration", "1h", *gateway,
            env=env,
        )  # fmt: skip
        assert code == 2 and "window.matchers.node.regex: not a regular expression" in out, out
        code, out = await run_cli("maintenance", "add", "--match", "node", "--duration", "1h")
        assert code == 2 and "LABEL=VALUE" in out
        code, out = await run_cli("maintenance", "end", "mw-00ff", *gateway, env=env)
        assert code == 3 and "no maintenance window" in out
        code, out = await run_cli(
            "maintenance", "end", recurring_id, *gateway, env={"TRAINSENTRY_API_TOKEN": "x"}
        )
        assert code == 1 and "401" in out
    finally:
        await close_in_process(server)
