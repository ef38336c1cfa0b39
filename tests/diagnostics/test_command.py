"""`trainsentry analyze`: arguments, exit codes, JSON and the human summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsentry.cli import main
from trainsentry.diagnostics import analyze
from trainsentry.diagnostics.analyze_command import DESCRIPTION, EXIT_HANG, EXIT_OK, EXIT_SLOW
from trainsentry.diagnostics.synthetic import write_dumps


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["analyze", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "Exit codes" in out and "verdict hang" in out
    assert "3  verdict hang" in DESCRIPTION


def test_bad_topology_is_a_usage_error(tmp_path: Path) -> None:
    write_dumps(tmp_path, 4, 10)
    assert main(["analyze", str(tmp_path), "--topology", "2,x"]) == 2


def test_missing_input_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(tmp_path / "nope"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] is None and "no input files" in out["error"]


def test_json_report_for_a_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dumps(tmp_path, 16, 12, "hang", culprit=9)
    assert main(["analyze", str(tmp_path), "--json", "--format", "fr"]) == EXIT_HANG
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "hang"
    assert out["hang"]["missing_ranks"] == [9]
    assert out["hang"]["root_cause_ranks"] == [9]
    assert out["hang"]["communicator"] == "0"
    assert out["mismatches"] == [] and out["slow_ranks"] == [] and out["gaps"] == []
    assert len(out["inputs"]) == 16 and all(i["ok"] for i in out["inputs"])


def test_human_summary_for_slow_and_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dumps(tmp_path / "slow", 8, 40, "slow", culprit=5)
    assert main(["analyze", str(tmp_path / "slow")]) == EXIT_SLOW
    out = capsys.readouterr().out
    assert "verdict: slow" in out and "slow ranks" in out
    write_dumps(tmp_path / "ok", 8, 40, "ok")
    assert main(["analyze", str(tmp_path / "ok")]) == EXIT_OK
    assert "verdict: ok" in capsys.readouterr().out


def test_progress_callback_counts_files(tmp_path: Path) -> None:
    write_dumps(tmp_path, 40, 5)
    (tmp_path / "notes.txt").write_text("not a trace")
    calls: list[tuple[int, int]] = []
    report = analyze([tmp_path], progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (40, 41)  # the unrecognised file is counted in the total
    assert [e.path for e in report.errors] == [str(tmp_path / "notes.txt")]


def test_large_input_shows_progress_without_breaking_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_dumps(tmp_path, 40, 5)
    assert main(["analyze", str(tmp_path), "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["verdict"] == "ok"


def test_world_of_unknown_size_is_said_and_the_topology_settles_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gloo-style dumps (no usable pg_config, no all_gather) of ranks 0-2; rank 3 never
    arrived and left no dump. Alone they cannot name it; with the topology (world 4) they do."""
    import os
    import pickle

    from trainsentry.diagnostics.synthetic import make_dump

    for rank in range(3):
        dump = make_dump(rank, 4, 12, "hang", culprit=3)
        dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        for entry in dump["entries"]:
            entry["profiling_name"] = "gloo:all_reduce"
            entry["output_sizes"] = entry["input_sizes"]
        path = tmp_path / f"fr_rank_{rank}.pkl"
        path.write_bytes(pickle.dumps(dump))
        os.utime(path, ns=(dump["dump_time_ns"], dump["dump_time_ns"]))
    assert main(["analyze", str(tmp_path)]) == EXIT_HANG
    out = " ".join(capsys.readouterr().out.split())
    assert "missing ranks: unknown (group membership unknown" in out
    assert "any rank from 3 on" in out
    assert main(["analyze", str(tmp_path), "--topology", "1,1,4", "--json"]) == EXIT_HANG
    out = json.loads(capsys.readouterr().out)
    hang = out["hang"]
    # Rank 3 left no dump: the others wait on it, but whether it waits on someone is
    # unknown, so the verdict does not name it; it is said instead.
    assert hang["missing_ranks"] == [3] and hang["root_cause_ranks"] == []
    assert out["culprit_ranks"] == [] and out["unread_suspect_ranks"] == [3]
    assert hang["membership_known"] is True


# ------------------------------------------------------------------ a new user's mistakes


def test_format_that_does_not_fit_the_file_names_the_file_and_what_was_expected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `--format ras` on a pickle answered "'utf-8' codec can't decode byte 0x80";
    `--format fr` on RAS text "cannot tell the rank from the file name"."""
    from tests.support.nccl_artifacts import nccl_dir

    pickle_dump = nccl_dir() / "hang" / "watchdog" / "fr_nccl_rank_0"
    ras_text = nccl_dir() / "ras" / "hang.txt"
    for fmt, path, expected, found in (
        ("ras", pickle_dump, "NCCL RAS", "Flight Recorder"),
        ("fr", ras_text, "Flight Recorder", "NCCL RAS"),
        ("megatrace", ras_text, "Megatrace", "NCCL RAS"),
    ):
        assert main(["analyze", str(path), "--format", fmt]) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert str(path) in err and expected in err and found in err, err
        assert "codec" not in err and "cannot tell the rank" not in err


def test_topology_that_does_not_fit_the_job_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before: `--topology 3,3,3` (27 ranks) on a 4-rank job was accepted silently."""
    from tests.support.nccl_artifacts import nccl_dir

    dumps = nccl_dir() / "hang" / "watchdog"
    assert main(["analyze", str(dumps), "--topology", "3,3,3"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "27 ranks" in err and "4" in err and "--topology" in err
    assert main(["analyze", str(dumps), "--topology", "1,1,4", "--json"]) == EXIT_HANG
    capsys.readouterr()


def test_slow_rank_table_names_its_communicators(capsys: pytest.CaptureFixture[str]) -> None:
    """The real stuck-GPU dumps flag rank 3 as late too; its table's communicators column
    showed "0" (the default group's name, read as a count): now the group is described."""
    from tests.support.nccl_artifacts import nccl_dir

    main(["analyze", str(nccl_dir() / "compute_timing" / "watchdog")])
    out = capsys.readouterr().out
    assert "slow ranks" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("│ 3"))
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[-1] == "default_pg", cells
