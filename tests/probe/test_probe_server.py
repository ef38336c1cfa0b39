"""The probe's HTTP server and failure isolation, in processes without a training job."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from probe.probe_harness import REPO, scrape, value
from trainsentry.probe.server import bearer_ok

pytestmark = pytest.mark.e2e  # starts probe HTTP servers (and processes)


def test_bearer_ok() -> None:
    assert bearer_ok("Bearer s3cret", "s3cret")
    assert bearer_ok("bearer s3cret", "s3cret")
    assert not bearer_ok("Bearer s3cret", None)
    assert not bearer_ok(None, "s3cret")
    assert not bearer_ok("Basic s3cret", "s3cret")
    assert not bearer_ok("Bearer s3cre", "s3cret")


SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    if sys.argv[1] == "no-torch":
        sys.modules["torch"] = None  # importing torch now fails, as without the extra
    import trainsentry.probe as probe
    from trainsentry.probe.identity import config_from_env
    p = probe.start(config_from_env({
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8",
        "TRAINSENTRY_PROBE_PORT": "0", "TRAINSENTRY_PROBE_BIND": "127.0.0.1",
        "TRAINSENTRY_PROBE_INTERVAL": "0.2", "TRAINSENTRY_NODE": "gpu-07",
        "TRAINSENTRY_PROBE_TOKEN": sys.argv[2] if len(sys.argv) > 2 else "",
    }))
    assert p is not None
    for _ in range(5):
        probe.step()
    print(json.dumps({"port": p.port}), flush=True)
    total = 0
    # the "training" keeps going whatever the probe does
    for i in range(100 if sys.argv[1] == "no-torch" else 600):
        total += i
        time.sleep(0.05)
    print("trained", total, flush=True)
    """
)


def run_script(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], int]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr.log").open("w"),
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # log lines may come first
        seen.append(line)
        if line.startswith("{"):
            return proc, int(json.loads(line)["port"])
    proc.kill()
    raise AssertionError("".join(seen))


def test_without_torch_probe_serves_unhealthy_and_training_continues(tmp_path: Path) -> None:
    proc, port = run_script(tmp_path, "no-torch", "tok")
    try:
        deadline = time.monotonic() + 10
        errors = 0.0
        while time.monotonic() < deadline and errors < 2:
            samples = scrape(port)
            errors = value(samples, "trainsentry_probe_poll_errors_total") or 0.0
            time.sleep(0.2)
        assert errors >= 2  # it keeps trying, and says so
        assert value(samples, "trainsentry_probe_healthy", rank="3", local_rank="1") == 0
        assert value(samples, "trainsentry_probe_step", node="gpu-07") == 5
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=5).json()
        assert status["healthy"] is False and "torch" in status["error"]
        # /dump fails cleanly (500), and the process survives it.
        dump = httpx.get(
            f"http://127.0.0.1:{port}/dump", headers={"Authorization": "Bearer tok"}, timeout=5
        )
        assert dump.status_code == 500
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).text == "ok\n"
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "trained 4950" in out
    finally:
        proc.kill()


@pytest.mark.torch
def test_dump_and_ras_are_disabled_without_a_token(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc, port = run_script(tmp_path, "torch")
    try:
        for path in ("/dump", "/ras"):
            response = httpx.get(
                f"http://127.0.0.1:{port}{path}", headers={"Authorization": "Bearer x"}, timeout=5
            )
            assert response.status_code == 403
        assert httpx.get(f"http://127.0.0.1:{port}/nope", timeout=5).status_code == 404
        samples = scrape(port)
        # torch present, no process group yet: the Flight Recorder reads fine and is empty.
        deadline = time.monotonic() + 10
        while value(samples, "trainsentry_probe_healthy") != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
            samples = scrape(port)
        assert value(samples, "trainsentry_probe_healthy") == 1
        # Status-only polls: nothing in flight, so no full dump was ever needed.
        assert value(samples, "trainsentry_probe_flight_recorder_entries") is None
    finally:
        proc.kill()
        proc.wait()
