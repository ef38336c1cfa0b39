"""The injected probe: `trainsentry probe install` and the start-up hook, in a stand-in for a
training image without trainsentry (tests/support/training_image.py), real processes.

Which process starts a probe is `inject.bootstrap_decision` (pure, tested here on command
lines as Python writes them in `sys.orig_argv`); the processes below show the hook does it
before the user's code, chains to the image's own sitecustomize and stays out of the way
where it should."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from tests.support.training_image import REPO, training_image
from trainsentry.probe.inject import (
    BOOTSTRAP_PATH,
    DUMP_MOUNT,
    INSTALL_ARGS,
    OWNER_ENV,
    PROBE_MOUNT,
    bootstrap_decision,
    entry_point,
)

RANK = {"TRAINSENTRY_PROBE": "1", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--lr", "1"], "script:train.py"),
        (["/usr/bin/python3", "-u", "/w/train.py"], "script:train.py"),
        (["python", "-m", "torch.distributed.run", "--nproc-per-node", "8", "t.py"],
         "module:torch.distributed.run"),
        (["python", "-mtorch.distributed.run", "t.py"], "module:torch.distributed.run"),
        (["python", "-W", "ignore", "-X", "dev", "-m", "pkg.train"], "module:pkg.train"),
        (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nnodes", "2", "t.py"],
         "script:torchrun"),
        (["python", "-c", "print(1)"], "command"),
        (["python"], "interactive"),
    ],
)  # fmt: skip
def test_entry_point_reads_the_command_line_as_python_does(argv: list[str], expected: str) -> None:
    assert entry_point(argv) == expected


@pytest.mark.parametrize(
    ("env", "argv", "start", "why"),
    [
        (RANK, ["python", "train.py"], True, "a training rank"),
        ({**RANK, "LOCAL_RANK": ""}, ["python", "train.py"], True, "a training rank"),
        ({"TRAINSENTRY_PROBE": "1"}, ["python", "prepare.py"], False, "not a training rank"),
        ({**RANK, "TRAINSENTRY_PROBE": "0"}, ["python", "train.py"], False, "is not 1"),
        (RANK, ["python", "/usr/local/bin/torchrun", "t.py"], False, "torchrun starts the ranks"),
        (RANK, ["python", "-m", "torch.distributed.run", "t.py"], False, "starts the ranks"),
        (RANK, ["python", "-m", "trainsentry.probe.launch", "t.py"], False, "starts the ranks"),
        ({**RANK, OWNER_ENV: "41"}, ["python", "worker.py"], False, "process 41 runs"),
        ({**RANK, OWNER_ENV: "42"}, ["python", "train.py"], True, "a training rank"),
    ],
)
def test_one_probe_per_training_rank(
    env: dict[str, str], argv: list[str], start: bool, why: str
) -> None:
    decided, reason = bootstrap_decision(env, argv, pid=42)
    assert (decided, why in reason) == (start, True), reason


def test_the_layout_the_webhook_mounts() -> None:
    assert f"{PROBE_MOUNT}/bootstrap" == BOOTSTRAP_PATH
    assert INSTALL_ARGS == ("probe", "install", PROBE_MOUNT)
    assert DUMP_MOUNT == "/var/run/trainsentry"


# --------------------------------------------------------------------------- processes

RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time
    loaded = sys.modules.get("trainsentry")
    print("trainsentry from", loaded.__file__ if loaded else None, flush=True)
    print("image hook", os.environ.get("IMAGE_HOOK_RAN"), flush=True)
    servers = [t for t in threading.enumerate() if t.name == "trainsentry-probe-http"]
    print("probe servers", len(servers), flush=True)
    time.sleep(float(os.environ.get("HOLD", "0")))
    """
)


def installed(tmp_path: Path) -> Path:
    """`trainsentry probe install` as the init container runs it."""
    dest = tmp_path / "trainsentry-probe"
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", *INSTALL_ARGS[:2], str(dest)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "installed the trainsentry probe" in done.stdout
    return dest


def pod_env(dest: Path, **extra: str) -> dict[str, str]:
    """What the webhook gives the container (its PYTHONPATH at the copy's bootstrap folder),
    with an ephemeral loopback port instead of the job's."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(dest / "bootstrap"),
        "TRAINSENTRY_PROBE_PORT": "0",
        "TRAINSENTRY_PROBE_BIND": "127.0.0.1",
        "TRAINSENTRY_JOB": "llama",
        "TRAINSENTRY_NAMESPACE": "team-a",
        "TRAINSENTRY_FR_DUMP_DIR": str(dest.parent / "fr"),
        **extra,
    }


def run(python: Path, script: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(python), *args, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def started_port(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"probe started for rank 3 of team-a/llama on port (\d+)", line)
    assert found, line + proc.stderr.read()
    return int(found.group(1))


@pytest.mark.e2e
def test_the_hook_starts_the_probe_before_the_script_and_keeps_the_images_own(
    tmp_path: Path,
) -> None:
    hook = "import os\nos.environ['IMAGE_HOOK_RAN'] = 'yes'\n"
    python = training_image(tmp_path / "image", sitecustomize=hook)
    dest = installed(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    proc = run(python, script, pod_env(dest, **RANK, HOLD="30"))
    try:
        port = started_port(proc)
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=5).json()
        assert (status["rank"], status["trainingjob"], status["namespace"]) == (
            3,
            "llama",
            "team-a",
        )
        assert proc.stdout is not None
        loaded = proc.stdout.readline()
        assert f"{dest / 'lib' / 'trainsentry'}" in loaded, loaded
        assert proc.stdout.readline().strip() == "image hook yes"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.e2e
def test_no_probe_outside_a_rank_and_none_in_the_launcher(tmp_path: Path) -> None:
    """A helper script (no RANK) and torch's launcher run untouched: no probe, no port."""
    python = training_image(tmp_path / "image")
    dest = installed(tmp_path)
    script = tmp_path / "prepare.py"
    script.write_text(RANK_SCRIPT)
    env = pod_env(dest, TRAINSENTRY_PROBE="1", TRAINSENTRY_PROBE_VERBOSE="1")
    done = subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "no probe in this process: not a training rank" in done.stderr
    assert "probe servers 0" in done.stdout
    launcher = subprocess.run(
        [str(python), "-m", "torch.distributed.run", "--help"],
        env={**env, **RANK},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert launcher.returncode == 0, launcher.stderr
    assert "torch.distributed.run starts the ranks" in launcher.stderr


@pytest.mark.e2e
def test_an_image_that_carries_trainsentry_keeps_its_own_and_its_launcher(
    tmp_path: Path,
) -> None:
    """The image's trainsentry wins over the copy (the copy is appended to sys.path), and a
    job started through its launcher gets exactly one probe (the launcher's)."""
    python = training_image(tmp_path / "image", with_trainsentry=True)
    dest = installed(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    proc = run(python, script, pod_env(dest, **RANK, HOLD="0"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"trainsentry from {REPO / 'trainsentry'}" in out, out
    assert "probe started for rank 3" in err
    launched = subprocess.run(
        [str(python), "-m", "trainsentry.probe.launch", str(script)],
        env={**pod_env(dest, **RANK, HOLD="0"), "TRAINSENTRY_PROBE_VERBOSE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert launched.returncode == 0, launched.stderr
    assert "trainsentry.probe.launch starts the ranks" in launched.stderr
    assert "probe servers 1" in launched.stdout, launched.stdout  # the launcher's, only


@pytest.mark.e2e
def test_a_failing_image_hook_and_a_busy_port_never_stop_the_script(tmp_path: Path) -> None:
    python = training_image(tmp_path / "image", sitecustomize="raise RuntimeError('broken')\n")
    dest = installed(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    with __import__("socket").socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        env = pod_env(dest, **{**RANK, "TRAINSENTRY_PROBE_PORT": port, "LOCAL_RANK": "0"})
        started = time.monotonic()
        done = subprocess.run(
            [str(python), str(script)], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    assert "the image's sitecustomize failed: RuntimeError('broken')" in done.stderr
    assert "the probe did not start" in done.stderr
    assert time.monotonic() - started < 30
