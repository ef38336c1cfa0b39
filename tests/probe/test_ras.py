"""The NCCL RAS client against a local RAS server over real TCP."""

from __future__ import annotations

import time
from typing import Any

import pytest

from probe.fake_ras_server import JSON_REPORT, TEXT_REPORT, FakeRasServer
from probe.probe_harness import free_port
from trainsentry.probe import ras
from trainsentry.probe.ras_report import load_json, report_from_text


def test_json_report_when_server_supports_it() -> None:
    with FakeRasServer() as server:
        status = ras.query(server.addr, timeout=5, collective_timeout=3)
    assert server.commands == [
        "CLIENT PROTOCOL 2",
        "TIMEOUT 3",
        "SET FORMAT json",
        "VERBOSE STATUS",
    ]
    assert status.ok, status.error
    assert status.format == "json"
    assert status.server_protocol == 2
    assert status.nccl_version == "2.28.7"
    assert status.communicators == 3
    assert status.missing_ranks == 2
    assert status.dead_processes == 1
    assert status.unresponsive_processes == 1
    assert status.incomplete_communicators == 1
    assert status.mismatch_communicators == 1
    assert status.error_communicators == 1
    assert status.timeouts == 1


def test_text_report_when_json_is_refused() -> None:
    with FakeRasServer(supports_json=False) as server:
        status = ras.query(server.addr, timeout=5)
    assert "SET FORMAT json" in server.commands  # asked, got "ERROR: ...", fell back
    assert status.ok, status.error
    assert status.format == "text"
    assert status.nccl_version == "2.27.3+cuda12.9"
    assert status.communicators == 1 + 4 + 8
    assert status.missing_ranks == 3
    assert status.unresponsive_processes == 1
    assert status.dead_processes == 2
    assert status.incomplete_communicators == 1
    assert status.error_communicators == 1
    assert status.mismatch_communicators == 1
    assert status.timeouts == 2


def test_old_protocol_gets_text_without_set_format() -> None:
    with FakeRasServer(protocol=1, supports_json=False) as server:
        status = ras.query(server.addr, timeout=5)
    assert not any(c.startswith("SET FORMAT") for c in server.commands)
    assert status.ok and status.format == "text" and status.server_protocol == 1


def test_server_closing_after_handshake() -> None:
    with FakeRasServer(close_after_handshake=True) as server:
        status = ras.query(server.addr, timeout=5)
    assert not status.ok
    assert "closed" in status.error


def test_report_cut_short_is_not_ok_but_keeps_raw() -> None:
    with FakeRasServer(supports_json=False, truncate_report=True) as server:
        status = ras.query(server.addr, timeout=5)
    assert not status.ok
    assert "ended early" in status.error
    assert status.raw and "Warnings" not in status.raw


def test_truncated_json_is_an_error() -> None:
    with FakeRasServer(truncate_report=True) as server:
        status = ras.query(server.addr, timeout=5)
    assert not status.ok and "unparseable json" in status.error


def test_absent_server() -> None:
    status = ras.query(f"127.0.0.1:{free_port()}", timeout=2)
    assert not status.ok
    assert "cannot connect" in status.error


def test_silent_server_times_out_within_budget() -> None:
    with FakeRasServer(silent=True) as server:
        started = time.monotonic()
        status = ras.query(server.addr, timeout=1.0)
        elapsed = time.monotonic() - started
    assert not status.ok and "timed out" in status.error
    assert elapsed < 3.0


def test_parsers_agree_on_healthy_reports() -> None:
    healthy_text = TEXT_REPORT.split("\nErrors\n")[0] + "\nErrors\n======\n\nWarnings\n========\n\n"
    counts = report_from_text(healthy_text).counts
    assert counts.missing_ranks == 0 and counts.dead_processes == 0
    assert counts.communicators == 13
    assert ras.counts_from_json(load_json(JSON_REPORT)[0]).communicators == 3


def test_parse_addr() -> None:
    assert ras.parse_addr("10.1.2.3:1234") == ("10.1.2.3", 1234)
    assert ras.parse_addr("[::1]:28028") == ("::1", 28028)
    assert ras.parse_addr("localhost") == ("localhost", 28028)


def test_a_report_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45: the counts and the suspects come from one parse of the report's text (the
    JSON loaded once; the text read in one pass), not from a second parser."""
    from trainsentry.probe import ras_report

    read: list[str] = []
    for name in ("load_json", "report_from_text", "parse_report"):
        real = getattr(ras_report, name)

        def counted(*args: object, _real: Any = real, _name: str = name) -> Any:
            read.append(_name)
            return _real(*args)

        monkeypatch.setattr(ras_report, name, counted)
        if hasattr(ras, name):
            monkeypatch.setattr(ras, name, counted)
    assert ras.status_from_report(JSON_REPORT, "json").communicators == 3
    assert read == ["load_json"]
    read.clear()
    assert ras.status_from_report(TEXT_REPORT, "text").communicators == 13
    assert read == ["report_from_text"]
