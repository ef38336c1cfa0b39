"""Runs the real gateway (`trainsentry gateway`) as a subprocess on a free loopback port."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from realservers import RunningServer, start_server


def start_gateway(
    tmp_path: Path,
    db_url: str,
    *,
    token: str | None = None,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    console_file: Path | None = None,
) -> RunningServer:
    full_env = dict(env or {})
    if token:
        full_env["TRAINSENTRY_WEBHOOK_TOKEN"] = token
        full_env.setdefault("TRAINSENTRY_API_TOKEN", token)

    def argv(port: int, _workdir: Path) -> list[str]:
        args = [sys.executable, "-m", "trainsentry", "gateway", "--listen", f"127.0.0.1:{port}"]
        args += ["--db", db_url]
        if config is not None:
            args += ["--config", str(config)]
        if console_file is not None:
            args += ["--console-file", str(console_file)]
        return args

    return start_server(tmp_path, "gateway", argv, ready_path="/readyz", env=full_env)
