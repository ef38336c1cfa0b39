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


def test_a_probe_token_with_a_trailing_newline_is_stripped() -> None:
    """A Secret made from an echoed file: the probe and the gateway both strip it."""
    from trainsentry.config.diagnosis import DiagnosisSettings
    from trainsentry.gateway.sections import build_diagnosis_parts
    from trainsentry.probe.identity import config_from_env

    config = config_from_env({"TRAINSENTRY_PROBE_TOKEN": "s3cret\n"})
    assert config.token == "s3cret" and bearer_ok("Bearer s3cret", config.token)
    assert config_from_env({"TRAINSENTRY_PROBE_TOKEN": " \n"}).token is None
    built = build_diagnosis_parts(
        DiagnosisSettings(static_endpoints={"a/b": ["127.0.0.1:1"]}),
        {"TRAINSENTRY_PROBE_TOKEN": "s3cret\n"},
    )
    assert built is not None and built[2] == "s3cret"


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


def test_watchdog_dumps_are_listed_and_served_behind_the_token(tmp_path: Path) -> None:
    """Dumps torch's watchdog wrote on a timeout (here: the real ones of the H100 hang)
    outlive the rank that wrote them; any probe of the pod serves them."""
    from tests.support.nccl_artifacts import nccl_dir
    from trainsentry.probe.identity import ProbeConfig
    from trainsentry.probe.recorders import Recorders
    from trainsentry.probe.runtime import Probe

    folder = tmp_path / "fr"
    folder.mkdir()
    originals = {}
    for rank in range(4):
        data = (nccl_dir() / "hang" / "watchdog" / f"fr_nccl_rank_{rank}").read_bytes()
        (folder / f"fr_rank_{rank}").write_bytes(data)
        originals[f"fr_rank_{rank}"] = data
    (folder / "unrelated.txt").write_text("not a dump")
    (tmp_path / "secret").write_text("outside the folder")
    config = ProbeConfig(bind="127.0.0.1", port=0, token="tok", dump_prefix=f"{folder}/fr_rank_")
    probe = Probe(config, Recorders([]))
    probe.server.start()
    base = f"http://127.0.0.1:{probe.port}"
    auth = {"Authorization": "Bearer tok"}
    try:
        assert httpx.get(f"{base}/dumps", timeout=5).status_code == 401
        assert httpx.get(f"{base}/dumps/fr_rank_0", timeout=5).status_code == 401
        listing = httpx.get(f"{base}/dumps", headers=auth, timeout=5).json()["dumps"]
        assert sorted(d["name"] for d in listing) == sorted(originals)
        assert {d["name"]: d["bytes"] for d in listing} == {
            name: len(data) for name, data in originals.items()
        }
        for name, data in originals.items():
            response = httpx.get(f"{base}/dumps/{name}", headers=auth, timeout=5)
            assert response.status_code == 200 and response.content == data
        for bad in ("unrelated.txt", "..%2Fsecret", "../secret", "fr_rank_9", "fr_rank_0%00"):
            response = httpx.get(f"{base}/dumps/{bad}", headers=auth, timeout=5)
            assert response.status_code == 404, bad
    finally:
        probe.stop()


def test_torch_settings_switch_on_what_a_hang_needs_unless_the_user_chose() -> None:
    from trainsentry.probe.identity import torch_settings

    assert torch_settings({}, "/var/run/trainsentry/fr") == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_ENABLE_TIMING": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": "/var/run/trainsentry/fr/fr_rank_",
    }
    chosen = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "0",  # the older name still counts as a choice
        "TORCH_NCCL_ENABLE_TIMING": "0",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/dump_",
    }
    assert torch_settings(chosen, "/x") == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert torch_settings({"TRAINSENTRY_PROBE_TORCH_ENV": "0"}, "/x") == {}


def test_prepare_falls_back_to_a_writable_folder(tmp_path: Path) -> None:
    from trainsentry.probe.runtime import prepare_torch_environment

    blocked = tmp_path / "file-in-the-way"
    blocked.write_text("")
    env = {"TRAINSENTRY_FR_DUMP_DIR": str(blocked / "fr")}
    settings = prepare_torch_environment(env)
    prefix = settings["TORCH_FR_DUMP_TEMP_FILE"]
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == prefix
    assert not prefix.startswith(str(blocked)) and prefix.endswith("/trainsentry-fr/fr_rank_")
    env = {"TRAINSENTRY_FR_DUMP_DIR": str(tmp_path / "fr")}
    assert prepare_torch_environment(env)["TORCH_FR_DUMP_TEMP_FILE"] == f"{tmp_path}/fr/fr_rank_"
    assert (tmp_path / "fr").is_dir()


def test_host_ips_come_from_the_downward_api_first() -> None:
    from trainsentry.probe.identity import host_ips

    assert host_ips({"POD_IP": "10.0.3.17"}) == ("10.0.3.17",)
    assert host_ips({"POD_IP": "10.0.3.17", "POD_IPS": "10.0.3.17,fd00::11"}) == (
        "10.0.3.17",
        "fd00::11",
    )
    assert isinstance(host_ips({}), tuple)


def test_a_probe_accepts_its_jobs_derived_token_and_no_other_jobs() -> None:
    """The gateway fetches a job's dumps with that job's token (`token.job_token` of the
    master): a probe holding the master (the manual path) or the job's token (the operator's
    Secret) accepts it; another job's token, or the master given to a job-token probe, not."""
    from trainsentry.probe.identity import ProbeConfig
    from trainsentry.probe.recorders import Recorders
    from trainsentry.probe.runtime import Probe
    from trainsentry.probe.token import job_token

    mine = job_token("master", "team-a", "llama")
    other = job_token("master", "team-b", "llama")
    assert mine != other and len(mine) == 64 and mine != job_token("master", "team-a", "llam")
    cases = {
        "master": {"master": 200, mine: 200, other: 401, "wrong": 401},
        mine: {mine: 200, "master": 401, other: 401},
    }
    for configured, answers in cases.items():
        config = ProbeConfig(
            bind="127.0.0.1", port=0, token=configured, namespace="team-a", trainingjob="llama"
        )
        probe = Probe(config, Recorders([]))
        probe.server.start()
        try:
            for given, status in answers.items():
                response = httpx.get(
                    f"http://127.0.0.1:{probe.port}/stack",
                    headers={"Authorization": f"Bearer {given}"},
                    timeout=5,
                )
                assert response.status_code == status, (configured, given)
        finally:
            probe.stop()
