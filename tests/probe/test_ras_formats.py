"""The probe's RAS client on reports as NCCL writes them: the real 2.28.9 artifacts, the
2.28.7/2.28.9 JSON defect (no comma after a missing rank's `"nvml_dev": N`, as
`jsonWriteMissingRank` in NCCL's src/ras/client_support.cc prints it up to 2.29.2), a JSON
reply beyond repair (text instead), and which ranks are behind or missing, by process."""

from __future__ import annotations

import json

from probe.fake_ras_server import JSON_REPORT, FakeRasServer
from tests.support.nccl_artifacts import nccl_dir
from trainsentry.probe import ras

MISSING_2289 = """        {
          "rank": 2,
          "host": "127.0.0.1",
          "pid": 468,
          "cuda_dev": 0,
          "nvml_dev": 0
          "status": {
            "unresponsive": true,
            "considered_dead": false
          }
        }"""


def defect_report() -> str:
    """The real hang.json with rank 2's process not answering, written as 2.28.9 writes a
    missing rank (ranks_count 3, missing_ranks_count 1)."""
    real = (nccl_dir() / "ras" / "hang.json").read_text()
    start = real.index(',\n        {\n          "rank": 2,')
    end = real.index(',\n        {\n          "rank": 3,')
    text = real[:start] + real[end:]
    text = text.replace('"ranks_count": 4', '"ranks_count": 3')
    text = text.replace('"missing_ranks_count": 0', '"missing_ranks_count": 1')
    head, sep, tail = text.partition('"missing_ranks": [\n')
    assert sep
    return head + sep + MISSING_2289 + tail.lstrip("\n").replace("      ]", "\n      ]", 1)


def test_the_defect_is_what_json_refuses() -> None:
    raw = defect_report()
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        assert "delimiter" in str(exc)
    else:
        raise AssertionError("the 2.28.9 report should not parse as it is")


def test_2289_json_with_an_unresponsive_process_is_read() -> None:
    with FakeRasServer(json_report=defect_report()) as server:
        status = ras.query(server.addr, timeout=5)
    assert status.ok, status.error
    assert status.format == "json"
    assert status.missing_ranks == 1
    assert status.unresponsive_processes == 1
    assert status.incomplete_communicators == 1
    (suspect,) = status.suspects
    assert suspect["rank"] == 2 and suspect["state"] == "missing"
    assert (suspect["host"], suspect["pid"], suspect["gpu"]) == ("127.0.0.1", 468, "0")
    assert "repaired" in status.note


def test_json_beyond_repair_falls_back_to_text() -> None:
    broken = JSON_REPORT[: len(JSON_REPORT) // 2] + "\n}}"
    with FakeRasServer(json_report=broken) as server:
        status = ras.query(server.addr, timeout=5)
    assert status.ok, status.error
    assert status.format == "text"
    assert status.nccl_version == "2.27.3+cuda12.9"
    assert server.commands.count("CLIENT PROTOCOL 2") == 2
    assert server.commands.count("SET FORMAT json") == 1
    assert "unparseable json" in status.note


def test_real_2289_reports_name_rank_2_behind_with_its_process() -> None:
    for name, fmt in (("hang.txt", "text"), ("hang.json", "json")):
        raw = (nccl_dir() / "ras" / name).read_text()
        status = ras.status_from_report(raw, fmt)
        assert status.ok, (name, status.error)
        assert [
            (s["rank"], s["state"], s["op"], s["waiting_in"], s["host"], s["pid"])
            for s in status.suspects
        ] == [(2, "behind", "AllReduce", 20, "127.0.0.1", 468)], name


def test_text_report_suspects_name_missing_and_behind_processes() -> None:
    with FakeRasServer(supports_json=False) as server:
        status = ras.query(server.addr, timeout=5)
    found = {(s["communicator"], s["rank"], s["state"], s["pid"]) for s in status.suspects}
    assert found == {
        ("0123456789abcdef", 13, "missing", 4242),
        ("00000000deadbeef", 2, "behind", 77),
    }


def test_the_metrics_name_each_suspect_and_forget_it_when_it_recovers() -> None:
    from prometheus_client import generate_latest

    from trainsentry.probe.metrics import ProbeMetrics

    metrics = ProbeMetrics({"namespace": "ml", "trainingjob": "llama", "rank": "0"}, 4)
    hung = ras.status_from_report((nccl_dir() / "ras" / "hang.txt").read_text(), "text")
    metrics.apply_ras(hung)
    text = generate_latest(metrics.registry).decode()
    lines = [
        line for line in text.splitlines() if line.startswith("trainsentry_probe_ras_suspect{")
    ]
    assert len(lines) == 1, lines
    assert 'comm_rank="2"' in lines[0] and 'state="behind"' in lines[0]
    assert 'host="127.0.0.1"' in lines[0] and 'pid="468"' in lines[0]
    healthy = ras.status_from_report((nccl_dir() / "ras" / "hang.txt").read_text(), "text")
    healthy.suspects.clear()
    metrics.apply_ras(healthy)
    text = generate_latest(metrics.registry).decode()
    assert "trainsentry_probe_ras_suspect{" not in text
