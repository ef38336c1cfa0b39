"""Concurrent large bodies against the real gateway process (issue 19 finding 10): the bytes
of bodies held at once are capped (`gateway.max_body_bytes_in_flight`), beyond it 503 with
Retry-After, and the process's peak RSS shows it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from tests.support.gateway_process import start_gateway
from tests.support.raw_http import RawResponse, raw_request
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import make_alert

TOKEN = "s3cret-token"
MIB = 1024 * 1024
CLIENTS = 48


def peak_rss_mib(server: RunningServer) -> float:
    """The process's high-water resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def large_body() -> bytes:
    """A 7.5 MiB webhook Alertmanager could send, but version 3: parsed whole, then a 400
    (so nothing is stored and the test measures only the bodies and their parsing)."""
    alert = json.dumps(make_alert(0)).encode()
    count = int(7.5 * MIB) // (len(alert) + 1)
    return b'{"version": "3", "status": "firing", "alerts": [' + b",".join([alert] * count) + b"]}"


def flood(server: RunningServer, body: bytes) -> list[RawResponse]:
    auth = [("Authorization", f"Bearer {TOKEN}")]
    with ThreadPoolExecutor(CLIENTS) as pool:
        path = "/api/v1/alertmanager"
        futures = [
            pool.submit(raw_request, server.port, "POST", path, auth, body, timeout=120)
            for _ in range(CLIENTS)
        ]
        return [future.result() for future in futures]


def test_concurrent_large_bodies_are_capped_in_memory(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"gateway": {"max_body_bytes_in_flight": 32 * MIB}}))
    body = large_body()
    assert 7 * MIB < len(body) < 8 * MIB
    with start_gateway(
        tmp_path, f"sqlite:///{tmp_path / 'store.db'}", token=TOKEN, config=config
    ) as server:
        before = peak_rss_mib(server)
        answers = flood(server, body)
        grown = peak_rss_mib(server) - before
        statuses = sorted(answer.status for answer in answers)
        # 48 bodies at once held 360 MiB and more (644 MB RSS in the red-team run); at most
        # four 7.5 MiB bodies at once, plus the parse of one, stay well under that.
        print(f"peak RSS grew {grown:.0f} MiB; {statuses.count(503)} of {CLIENTS} got 503")
        assert grown < 200, (before, grown, statuses.count(503))
        assert set(statuses) == {400, 503}, statuses
        busy = [answer for answer in answers if answer.status == 503]
        assert all(answer.headers.get("retry-after") == "1" for answer in busy)
        assert raw_request(server.port, "GET", "/healthz").status == 200
