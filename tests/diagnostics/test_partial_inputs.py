"""Missing and partial inputs are said, in the notes and in the human summary.

A rank that left no dump or log, and a Megatrace log whose last line was cut short (copied
while the job wrote it), on the Megatrace sample and on the TP/DP scenario's real dumps.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainsentry.cli import main as cli_main
from trainsentry.diagnostics import analyze


def test_megatrace_missing_rank_and_cut_last_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], megatrace_sample: Path
) -> None:
    for path in megatrace_sample.iterdir():
        if path.name != "rank_5.log":
            shutil.copy(path, tmp_path / path.name)
    log = tmp_path / "rank_3.log"
    log.write_text(log.read_text()[:-40])  # the last line loses its end and its newline
    report = analyze([tmp_path])
    out = report.to_dict()
    assert out["errors"] == []  # rank 3's log is still read, up to its last whole line
    assert out["verdict"] == "slow" and out["slow_ranks"][0]["rank"] == 2
    assert out["ranks_without_input"] == [5]
    assert any(n.startswith("rank(s) 5 left no readable Megatrace log") for n in out["notes"])
    assert any("rank_3.log" in n and "last line cut short" in n for n in out["notes"])
    cli_main(["analyze", str(tmp_path)])
    summary = " ".join(capsys.readouterr().out.split())
    assert "rank(s) 5 left no readable Megatrace log" in summary
    assert "last line cut short" in summary


@pytest.mark.torch
@pytest.mark.parametrize("variant", ["json", "pgcfg"])
def test_flight_recorder_rank_without_dump(
    fr_corpus: dict[str, Path], variant: str, tmp_path: Path
) -> None:
    """The TP/DP hang without rank 6's dump (a bystander): the hang still names rank 3, and
    rank 6 is said to have left no dump. Where the pg_config declares DP group {0,2,4,6},
    rank 6 is missing from its stuck all_reduce; whether it waits elsewhere is unknown (its
    dump was not read), so the verdict does not name it but says the waits lead to it;
    without a pg_config that group's membership is unknown and only rank 3 is named."""
    for path in (fr_corpus["tpdp"] / variant).iterdir():
        if path.name.split(".")[0] != "fr_rank_6":
            shutil.copy(path, tmp_path / path.name)
    out = analyze([tmp_path]).to_dict()
    assert out["verdict"] == "hang"
    assert out["root_cause_ranks"] == [3] and out["culprit_ranks"] == [3]
    assert out["unread_suspect_ranks"] == ([6] if variant == "pgcfg" else [])
    assert out["ranks_without_input"] == [6]
    assert any(
        n.startswith("rank(s) 6 left no readable Flight Recorder dump") for n in out["notes"]
    )
