"""Run real servers (Prometheus, Alertmanager, any HTTP process) for tests.

Each server runs as a subprocess on a free port on 127.0.0.1, with its own fresh
working directory (config, storage, log) under the caller's temporary directory.
`start_*` returns once the server answers its readiness URL; `RunningServer` stops
it (terminate, then kill) and prints its log when the block it guards fails.

    with start_prometheus(tmp_path, {"global": {...}, "scrape_configs": [...]},
                          rule_files=[...]) as prom:
        httpx.get(f"{prom.url}/api/v1/query", params={"query": "up"})

Binaries default to the Debian names and can be overridden with the environment
variables PROMETHEUS_BIN and ALERTMANAGER_BIN. Only the standard library is used, so
any test module (and the gateway's e2e tests) can import this file.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml

from tests.support.ports import free_port

LOOPBACK = "127.0.0.1"
DEFAULT_START_TIMEOUT = 30.0
_STOP_GRACE_SECONDS = 5.0
_START_ATTEMPTS = 3  # a free port can be taken between probing and binding: retry
_instance_counter = itertools.count()


class ServerStartError(RuntimeError):
    """A server process exited or did not become ready in time."""


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=_STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=_STOP_GRACE_SECONDS)


@dataclass
class RunningServer:
    """A server subprocess listening on `url`; stop it with `.stop()` or a `with` block."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    url: str = field(init=False)
    _finalizer: weakref.finalize[..., RunningServer] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = f"http://{LOOPBACK}:{self.port}"
        # Safety net: never leave a server behind if a test forgets to stop it.
        self._finalizer = weakref.finalize(self, _kill, self.process)

    @property
    def address(self) -> str:
        """host:port, as used in scrape targets and --listen flags."""
        return f"{LOOPBACK}:{self.port}"

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def print_logs(self) -> None:
        print(f"----- {self.name} log ({self.log_path}) -----", file=sys.stderr)
        print(self.logs(), file=sys.stderr)
        print(f"----- end of {self.name} log -----", file=sys.stderr)

    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        self._finalizer()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.print_logs()
        self.stop()


def _http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _fresh_dir(parent: Path, name: str) -> Path:
    path = Path(parent) / f"{name}-{os.getpid()}-{next(_instance_counter)}"
    path.mkdir(parents=True, exist_ok=False)
    return path


REPO_ROOT = Path(__file__).resolve().parents[2]


def repo_module_argv(module: str, *args: str) -> list[str]:
    """The command line that runs a module of this repository's tests (`tests.support.x`) as
    a server process; pass `env=REPO_MODULE_ENV` to `start_server` so it imports."""
    return [sys.executable, "-m", module, *args]


REPO_MODULE_ENV = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
}


def start_server(
    tmp_path: Path,
    name: str,
    argv_for_port: Callable[[int, Path], Sequence[str]],
    *,
    ready_path: str = "/-/ready",
    timeout: float = DEFAULT_START_TIMEOUT,
    env: Mapping[str, str] | None = None,
    prepare: Callable[[Path], None] | None = None,
) -> RunningServer:
    """Start any HTTP server process and wait until `GET ready_path` answers 2xx.

    `argv_for_port(port, workdir)` builds the command line for a given port; `prepare`
    may write config files into the fresh `workdir` first. The process's stdout and
    stderr go to `workdir/<name>.log`.
    """
    last_error = ""
    for _attempt in range(_START_ATTEMPTS):
        workdir = _fresh_dir(tmp_path, name)
        if prepare is not None:
            prepare(workdir)
        port = free_port()
        log_path = workdir / f"{name}.log"
        argv = list(argv_for_port(port, workdir))
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                cwd=workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        server = RunningServer(name, port, process, workdir, log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                break
            if _http_ok(server.url + ready_path):
                return server
            time.sleep(0.1)
        server.stop()
        last_error = server.logs()
        if "address already in use" not in last_error:
            break
    raise ServerStartError(f"{name} did not become ready; its log:\n{last_error}")


def _binary(env_var: str, default: str) -> str:
    path = os.environ.get(env_var) or shutil.which(default) or f"/usr/bin/{default}"
    return path


def start_prometheus(
    tmp_path: Path,
    config: Mapping[str, Any],
    rule_files: Sequence[Path] = (),
    *,
    extra_args: Sequence[str] = (),
    timeout: float = DEFAULT_START_TIMEOUT,
    backfill: str | None = None,
) -> RunningServer:
    """A real Prometheus with `config` (a prometheus.yml as a dict) and `rule_files`.

    `rule_files` are added to the config's `rule_files` as absolute paths. Storage is a
    fresh directory, so nothing carries over between servers. `backfill`: OpenMetrics text
    (samples with timestamps, ending in `# EOF`) written into the storage first with
    `promtool tsdb create-blocks-from openmetrics`, so the server starts with that history.
    """
    binary = _binary("PROMETHEUS_BIN", "prometheus")
    full_config = dict(config)
    full_config["rule_files"] = [
        *full_config.get("rule_files", []),
        *(str(Path(p).resolve()) for p in rule_files),
    ]

    def prepare(workdir: Path) -> None:
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(full_config, sort_keys=False))
        if backfill is not None:
            (workdir / "history.om").write_text(backfill)
            promtool = str(Path(binary).with_name("promtool"))
            done = subprocess.run(
                [promtool, "tsdb", "create-blocks-from", "openmetrics", "history.om", "data"],
                cwd=workdir, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            if done.returncode != 0:
                raise ServerStartError(f"promtool backfill failed: {done.stderr[-2000:]}")

    def argv(port: int, workdir: Path) -> list[str]:
        return [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{port}",
            "--web.enable-lifecycle",
            "--log.level=info",
            *extra_args,
        ]

    return start_server(tmp_path, "prometheus", argv, prepare=prepare, timeout=timeout)


def start_alertmanager(
    tmp_path: Path,
    config: Mapping[str, Any],
    *,
    extra_args: Sequence[str] = (),
    timeout: float = DEFAULT_START_TIMEOUT,
) -> RunningServer:
    """A real Alertmanager with `config` (an alertmanager.yml as a dict), gossip off."""
    binary = _binary("ALERTMANAGER_BIN", "prometheus-alertmanager")

    def prepare(workdir: Path) -> None:
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def argv(port: int, workdir: Path) -> list[str]:
        return [
            binary,
            f"--config.file={workdir / 'alertmanager.yml'}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{port}",
            "--cluster.listen-address=",
            "--log.level=info",
            *extra_args,
        ]

    return start_server(tmp_path, "alertmanager", argv, prepare=prepare, timeout=timeout)


@contextlib.contextmanager
def logs_on_error(*servers: RunningServer) -> Iterator[None]:
    """Print every server's log if the block raises (the servers keep running)."""
    try:
        yield
    except BaseException:
        for server in servers:
            server.print_logs()
        raise


T = TypeVar("T")


def wait_for(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """Polls `probe` until it returns something truthy; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def http_json(url: str, data: Any = None, token: str | None = None) -> Any:
    """GET (or POST `data` as JSON) with an optional bearer token; the JSON answer or None."""
    request = urllib.request.Request(url, method="POST" if data is not None else "GET")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    body = json.dumps(data).encode() if data is not None else None
    with urllib.request.urlopen(request, body, timeout=10) as response:
        raw = response.read()
    return json.loads(raw) if raw else None
