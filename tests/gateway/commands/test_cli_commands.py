"""`trainsentry ack` and `trainsentry export` as a user runs them (subprocesses)."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.gateway_process import close_in_process
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.config import GatewaySettings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.assemble import create_app

TOKEN = "cli-token"


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    import os

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trainsentry", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_ack_and_export_commands(db_url: str, tmp_path: Path) -> None:
    settings = GatewaySettings(
        listen="127.0.0.1:0", db=db_url, webhook_token=SecretStr(TOKEN), api_token=SecretStr(TOKEN)
    )
    server = TestServer(create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as s:
            body = make_body([make_alert(i, labels={"priority": "P1"}) for i in range(1, 4)])
            async with s.post(server.make_url(WEBHOOK_PATH), data=encode(body)) as response:
                assert response.status == 200
        gateway = str(server.make_url("/")).rstrip("/")
        env = {"TRAINSENTRY_API_TOKEN": TOKEN}
        code, out = await run_cli(
            "ack", "2", "--by", "dana", "--gateway", gateway, "--json", env=env
        )
        assert code == 0, out
        assert json.loads(out)["acked_by"] == "dana"
        code, out = await run_cli("ack", "99", "--gateway", gateway, env=env)
        assert code == 3 and "no alert 99" in out
        code, out = await run_cli(
            "ack", "1", "--gateway", gateway, env={"TRAINSENTRY_API_TOKEN": "x"}
        )
        assert code == 1 and "401" in out
        code, out = await run_cli("ack", "1", "--silence", "soon", "--gateway", gateway)
        assert code == 2
    finally:
        await close_in_process(server)

    csv_path = tmp_path / "alerts.csv"
    code, out = await run_cli("export", "--db", db_url, "--out", str(csv_path))
    assert code == 0 and "wrote 3 rows" in out, out
    with csv_path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["occurrence"] for r in rows] == ["alert-1", "alert-2", "alert-3"]
    assert rows[1]["acked_by"] == "dana" and rows[0]["alert_priority"] == "P1"

    from openpyxl import load_workbook

    xlsx = tmp_path / "alerts.xlsx"
    code, out = await run_cli("export", "--db", db_url, "--out", str(xlsx))
    assert code == 0, out
    sheet = load_workbook(xlsx, read_only=True).active
    values = [list(r) for r in sheet.iter_rows(values_only=True)]
    assert values[0][0] == "occurrence" and len(values) == 4


def test_every_command_has_help_with_exit_codes() -> None:
    import subprocess

    from trainsentry.cli import COMMANDS

    for name in COMMANDS:
        result = subprocess.run(
            [sys.executable, "-m", "trainsentry", name, "--help"], capture_output=True, text=True
        )
        assert result.returncode == 0, (name, result.stderr)
        assert "xit code" in result.stdout, f"{name} --help documents no exit codes"
