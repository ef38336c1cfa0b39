"""The real NCCL Flight Recorder dumps in tests/fixtures/nccl (H100, torch 2.11, NCCL 2.28.9).

`pp/`: a 4-stage send/recv pipeline whose rank 2 stops; `compute_timing/`: rank 3's GPU spins
in a compute kernel queued before all_reduce #20, TORCH_NCCL_ENABLE_TIMING=1; `hang/`: rank 2
never calls all_reduce #20. Watchdog pickles, unedited (tests that need a variant copy them
and say what they change).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from tests.support.nccl_artifacts import nccl_dir, watchdog_dump
from trainsentry.cli import main as cli_main
from trainsentry.diagnostics import analyze


def _latest_entry_ns(case: str) -> int:
    latest = 0
    for rank in range(4):
        for entry in watchdog_dump(case, rank)["entries"]:
            for key in ("time_created_ns", "time_discovered_started_ns"):
                if isinstance(entry.get(key), int):
                    latest = max(latest, entry[key])
    return latest


def test_pipeline_hang_names_the_stage_that_never_posted() -> None:
    """Rank 1 waits in `send 1->2`, rank 3 in `recv 3<-2`, rank 0 behind rank 1: rank 2 is the
    root cause (it was `ok` before: p2p waits were listed but made no verdict)."""
    out = analyze([nccl_dir() / "pp" / "watchdog"]).to_dict()
    assert out["verdict"] == "hang"
    assert out["root_cause_ranks"] == [2]
    assert out["culprit_ranks"] == [2]
    assert out["hang"]["communicator"] == "0/p2p"
    assert out["hang"]["missing_ranks"] == [2]
    assert out["hang"]["arrived_ranks"] == [1, 3]
    waits = {(w["rank"], w["peer"], w["op"]) for w in out["p2p_waits"]}
    assert {(1, 2, "send"), (3, 2, "recv")} <= waits


def test_stuck_gpu_with_timing_names_the_rank_that_never_started() -> None:
    """Every rank enqueued all_reduce #20; ranks 0-2 started it, rank 3 (GPU busy) did not."""
    out = analyze([nccl_dir() / "compute_timing" / "watchdog"]).to_dict()
    assert out["verdict"] == "hang"
    assert out["hang"]["seq"] == 20
    assert out["hang"]["missing_ranks"] == []
    assert out["hang"]["not_started_ranks"] == [3]
    assert out["hang"]["timing_recorded"] is True
    assert out["not_started_ranks"] == [3]
    assert out["root_cause_ranks"] == [3]
    assert out["culprit_ranks"] == [3]
    assert any("never started" in n and "[3]" in n for n in out["notes"])


def test_stuck_gpu_without_timing_says_what_to_switch_on(tmp_path: Path) -> None:
    """The same dumps as NCCL writes them with timing off: `last_started_collective` -1 and
    in-flight entries `scheduled` with no start time (as in pp/, recorded without timing)."""
    for rank in range(4):
        dump = watchdog_dump("compute_timing", rank)
        for status in dump["pg_status"].values():
            status["last_started_collective"] = -1
        for entry in dump["entries"]:
            entry["time_discovered_started_ns"] = None
            if entry["state"] == "started":
                entry["state"] = "scheduled"
        (tmp_path / f"fr_nccl_rank_{rank}").write_bytes(pickle.dumps(dump))
    out = analyze([tmp_path]).to_dict()
    assert out["verdict"] == "hang"
    assert out["hang"]["timing_recorded"] is False
    assert out["hang"]["not_started_ranks"] == [] and out["root_cause_ranks"] == []
    assert any("TORCH_NCCL_ENABLE_TIMING=1" in n for n in out["notes"])


def test_wait_is_measured_against_the_given_capture_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--captured-at-ns 25 s after the last entry: waited ~25 s, whatever the files' mtime
    (copied here today, a day after the hang) and whenever the analysis runs."""
    at = _latest_entry_ns("hang") + 25 * 10**9
    code = cli_main(
        ["analyze", str(nccl_dir() / "hang" / "watchdog"), "--json", f"--captured-at-ns={at}"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 3
    assert out["hang"]["missing_ranks"] == [2]
    assert 25 <= out["hang"]["waited_s"] < 27
    assert out["captured_from"] == ["option"] and out["captured_at_ns"] == at


def test_sidecar_then_mtime_give_the_capture_time(tmp_path: Path) -> None:
    source = nccl_dir() / "hang" / "watchdog"
    last = _latest_entry_ns("hang")
    for rank in range(4):
        shutil.copy(source / f"fr_nccl_rank_{rank}", tmp_path / f"fr_nccl_rank_{rank}")
        os.utime(tmp_path / f"fr_nccl_rank_{rank}", ns=(last + 40 * 10**9,) * 2)
    by_mtime = analyze([tmp_path], in_place=True).to_dict()
    assert by_mtime["captured_from"] == ["mtime"]
    assert 40 <= by_mtime["hang"]["waited_s"] < 42
    for rank in range(4):
        (tmp_path / f"fr_nccl_rank_{rank}.captured_at_ns").write_text(str(last + 10 * 10**9))
    by_sidecar = analyze([tmp_path], in_place=True).to_dict()
    assert by_sidecar["captured_from"] == ["sidecar"]
    assert 10 <= by_sidecar["hang"]["waited_s"] < 12
    assert len(by_sidecar["inputs"]) == 4  # the sidecars are not read as dumps


def test_snapshot_of_a_running_job_is_not_a_hang(capsys: pytest.CaptureFixture[str]) -> None:
    """Taken 0.5 s after ranks 0, 1, 3 entered all_reduce #20, these dumps are what a live job
    looks like between two collectives: the end of the record, not a hang."""
    at = _latest_entry_ns("hang") + 500_000_000
    code = cli_main(
        ["analyze", str(nccl_dir() / "hang" / "watchdog"), "--json", f"--captured-at-ns={at}"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verdict"] == "ok"
    assert any("not a hang" in n for n in out["notes"])


def test_summary_names_the_rank_that_never_started(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["analyze", str(nccl_dir() / "compute_timing" / "watchdog")])
    summary = " ".join(capsys.readouterr().out.split())
    assert code == 3
    assert "never started on rank(s): 3" in summary
    assert "root cause rank(s): 3" in summary


# ------------------------------------------------------------------ copied dumps


def _copied(case: str, tmp_path: Path) -> Path:
    """The watchdog dumps as `kubectl cp` leaves them: new files, the copy's mtime."""
    target = tmp_path / case
    shutil.copytree(nccl_dir() / case / "watchdog", target)
    return target


def test_copied_dumps_claim_no_wait_beyond_what_the_entries_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Copied with fresh file times and no capture time, the real hang still names rank 2,
    but its wait is unknown: only "at least 0.01 s before the last recorded event" (rank 2's
    completion of #19, discovered just after the others entered #20). Before: the copy's
    mtime was taken as the capture time, and the ranks "waited 264,023.9 s" (73 hours)."""
    folder = _copied("hang", tmp_path)
    out = analyze([folder]).to_dict()
    assert out["verdict"] == "hang" and out["culprit_ranks"] == [2]
    assert out["captured_from"] == ["unknown"] and out["captured_at_ns"] is None
    assert out["hang"]["waited_s"] is None
    assert 0.005 < out["hang"]["waited_at_least_s"] < 0.02
    assert any("--captured-at" in n and "no capture time" in n for n in out["notes"])
    assert cli_main(["analyze", str(folder)]) == 3
    summary = " ".join(capsys.readouterr().out.split())
    assert "waited at least 0.01 s before the last recorded event" in summary, summary
    assert "victims: none" not in summary
    assert "ranks 0, 1, 3 wait" in summary


def test_copied_pipeline_dumps_name_the_stage_with_unknown_waits(tmp_path: Path) -> None:
    out = analyze([_copied("pp", tmp_path)]).to_dict()
    assert out["verdict"] == "hang" and out["culprit_ranks"] == [2]
    assert {(w["rank"], w["peer"]) for w in out["p2p_waits"]} >= {(1, 2), (3, 2)}
    assert all(w["waited_s"] is None and w["waited_at_least_s"] >= 0 for w in out["p2p_waits"])


def test_captured_at_takes_a_time_of_day(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--captured-at` with an ISO 8601 time (what `date -u -Iseconds` prints) or epoch
    seconds, as a person copying dumps knows it; a time without a zone is refused."""
    from datetime import UTC, datetime

    folder = _copied("hang", tmp_path)
    at_s = _latest_entry_ns("hang") // 10**9 + 30
    iso = datetime.fromtimestamp(at_s, UTC).isoformat()
    for given in (iso, str(at_s)):
        assert cli_main(["analyze", str(folder), "--json", f"--captured-at={given}"]) == 3
        out = json.loads(capsys.readouterr().out)
        assert 29 <= out["hang"]["waited_s"] < 31 and out["captured_from"] == ["option"]
    naive = datetime.fromtimestamp(at_s, UTC).replace(tzinfo=None).isoformat()
    assert cli_main(["analyze", str(folder), f"--captured-at={naive}"]) == 2
    assert "time zone" in capsys.readouterr().err


def test_in_place_says_the_files_mtime_is_the_capture_time(tmp_path: Path) -> None:
    """Only the caller can say a file was written in place (the probe's collector does):
    then its mtime counts."""
    folder = _copied("hang", tmp_path)
    last = _latest_entry_ns("hang")
    for rank in range(4):
        os.utime(folder / f"fr_nccl_rank_{rank}", ns=(last + 61 * 10**9,) * 2)
    assert analyze([folder]).to_dict()["hang"]["waited_s"] is None
    out = analyze([folder], in_place=True).to_dict()
    assert out["captured_from"] == ["mtime"] and 61 <= out["hang"]["waited_s"] < 62


def test_a_capture_time_before_the_dumps_own_events_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--captured-at 2026-01-01` on the real hang (dumps recorded after that instant) is an
    impossible capture time: a usage error naming both instants and the fix, never
    "verdict: ok" with exit 0 (what it said before: the ranks had then waited no time)."""
    from datetime import UTC, datetime

    folder = _copied("hang", tmp_path)
    last_s = _latest_entry_ns("hang") / 1e9
    assert datetime(2026, 1, 1, tzinfo=UTC).timestamp() < last_s
    given = "--captured-at=2026-01-01T00:00:00Z"
    for args in ([given], [given, "--json"]):
        assert cli_main(["analyze", str(folder), *args]) == 2
        captured = capsys.readouterr()
        assert "verdict" not in captured.out.replace('"verdict": null', "")
        [line] = captured.err.strip().splitlines()
        assert "--captured-at 2026-01-01T00:00:00Z is before the dumps' last recorded event" in line
        assert datetime.fromtimestamp(last_s, UTC).strftime("%Y-%m-%dT%H:%M:%S") in line
        assert "leave --captured-at out" in line
    # one second after the last event is still a capture time (a wait of about a second)
    after = f"--captured-at-ns={_latest_entry_ns('hang') + 10**9}"
    assert cli_main(["analyze", str(folder), "--json", after]) == 0
    capsys.readouterr()
