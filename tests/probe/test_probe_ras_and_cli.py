"""The probe's RAS thread and `/ras`, and the `trainsentry probe` command, over real sockets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from probe.fake_ras_server import FakeRasServer
from probe.probe_harness import free_port, scrape, value
from trainsentry.cli import main
from trainsentry.probe.identity import config_from_env
from trainsentry.probe.runtime import Probe

TOKEN = "cli-test-token"

pytestmark = pytest.mark.e2e  # starts probe HTTP servers (and processes)


@pytest.fixture
def ras_server() -> Iterator[FakeRasServer]:
    with FakeRasServer() as server:
        yield server


@pytest.fixture
def probe(ras_server: FakeRasServer) -> Iterator[Probe]:
    config = config_from_env(
        {
            "RANK": "0",
            "WORLD_SIZE": "4",
            "TRAINSENTRY_PROBE_PORT": "0",
            "TRAINSENTRY_PROBE_BIND": "127.0.0.1",
            "TRAINSENTRY_PROBE_INTERVAL": "0.2",
            "TRAINSENTRY_PROBE_RAS": "1",
            "TRAINSENTRY_PROBE_RAS_INTERVAL": "0.5",
            "NCCL_RAS_ADDR": ras_server.addr,
            "TRAINSENTRY_PROBE_TOKEN": TOKEN,
            "TRAINSENTRY_JOB": "llama",
        }
    )
    instance = Probe(config)
    instance.start()
    yield instance
    instance.stop()


def test_rank0_probe_exports_ras_counts_and_snapshot(probe: Probe) -> None:
    deadline = time.monotonic() + 15
    samples = scrape(probe.port)
    while value(samples, "trainsentry_probe_ras_up") != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        samples = scrape(probe.port)
    assert value(samples, "trainsentry_probe_ras_up", trainingjob="llama", rank="0") == 1
    assert value(samples, "trainsentry_probe_ras_dead_processes") == 1
    assert value(samples, "trainsentry_probe_ras_missing_ranks") == 2
    assert value(samples, "trainsentry_probe_ras_communicators") == 3
    assert value(samples, "trainsentry_probe_ras_queries_total", result="ok") >= 1  # type: ignore[operator]
    url = f"http://127.0.0.1:{probe.port}/ras"
    assert httpx.get(url, timeout=5).status_code == 401
    snap = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    assert snap["ok"] is True and snap["format"] == "json"
    assert json.loads(snap["raw"])["communicators_count"] == 3


@pytest.mark.torch
def test_probe_survives_a_ras_server_that_goes_away(
    probe: Probe, ras_server: FakeRasServer
) -> None:
    pytest.importorskip("torch")  # "healthy" below needs a readable Flight Recorder
    ras_server.stop()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        samples = scrape(probe.port)
        if (value(samples, "trainsentry_probe_ras_queries_total", result="absent") or 0) >= 1:
            break
        time.sleep(0.2)
    assert value(samples, "trainsentry_probe_ras_up") == 0
    assert value(samples, "trainsentry_probe_healthy") == 1  # progress polling carries on


def test_cli_ras_json_and_exit_codes(
    ras_server: FakeRasServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "ras", "--addr", ras_server.addr, "--json", "--timeout", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dead_processes"] == 1 and report["format"] == "json"
    assert main(["probe", "ras", "--addr", ras_server.addr, "--text", "--timeout", "5"]) == 0
    assert "INCOMPLETE" in capsys.readouterr().out
    assert main(["probe", "ras", "--addr", f"127.0.0.1:{free_port()}", "--timeout", "2"]) == 1
    assert "cannot connect" in capsys.readouterr().err


def test_cli_status_and_dump(
    probe: Probe,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = f"http://127.0.0.1:{probe.port}"
    assert main(["probe", "status", base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 4
    assert main(["probe", "status", base]) == 0
    assert capsys.readouterr().out.startswith("rank 0/4")
    monkeypatch.delenv("TRAINSENTRY_PROBE_TOKEN", raising=False)
    assert main(["probe", "dump", base]) == 2
    monkeypatch.setenv("TRAINSENTRY_PROBE_TOKEN", "wrong")
    assert main(["probe", "dump", base]) == 1
    monkeypatch.setenv("TRAINSENTRY_PROBE_TOKEN", TOKEN)
    out = tmp_path / "rank0.json"
    assert main(["probe", "dump", base, "-o", str(out)]) == 0
    assert "pg_status" in json.loads(out.read_text())
    assert main(["probe", "status", f"http://127.0.0.1:{free_port()}"]) == 1


def test_cli_help_lists_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["probe", "--help"])
    assert exit_info.value.code == 0
    assert "Exit codes" in capsys.readouterr().out
