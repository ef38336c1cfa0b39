"""The shared server helper itself: real Prometheus and Alertmanager start, answer, stop."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.support.realservers import (
    ServerStartError,
    free_port,
    start_alertmanager,
    start_prometheus,
    start_server,
)

pytestmark = pytest.mark.e2e


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_free_port_is_below_the_ephemeral_range() -> None:
    """An outgoing connection may take a port of the kernel's ephemeral range between the
    probe and the server's bind; below the range only a listener can."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low < 16000:
        pytest.skip(f"no room below the ephemeral range ({low} and up)")
    assert all(free_port() < low for _ in range(20))


def test_prometheus_and_alertmanager_start_answer_and_stop(tmp_path: Path) -> None:
    rule = tmp_path / "r.yaml"
    rule.write_text("groups:\n- name: g\n  rules:\n  - record: one\n    expr: vector(1)\n")
    with (
        start_alertmanager(
            tmp_path, {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}
        ) as am,
        start_prometheus(
            tmp_path,
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.address]}]}]},
            },
            rule_files=[rule],
        ) as prom,
    ):
        status = _get_json(f"{am.url}/api/v2/status")
        assert status["cluster"]["status"] == "disabled"
        groups = _get_json(f"{prom.url}/api/v1/rules")["data"]["groups"]
        assert [g["name"] for g in groups] == ["g"]
        assert prom.workdir != am.workdir
    assert not prom.is_running() and not am.is_running()


def test_a_server_that_exits_raises_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="boom"):
        start_server(tmp_path, "bad", lambda port, wd: ["sh", "-c", "echo boom; exit 3"], timeout=5)
