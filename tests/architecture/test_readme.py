"""The README's benchmark table is a summary of docs/benchmarks.md: each row names a benchmark
in bench/, and every number in its figure and baseline is one the lab notes measured."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"\d[\d,.]*\d|\d")


def _rows() -> list[list[str]]:
    section = (ROOT / "README.md").read_text().split("\n## Benchmarks\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.append(cells)
    return rows


def test_every_row_names_a_benchmark_of_bench() -> None:
    rows = _rows()
    assert len(rows) >= 10, "the README's benchmark table was not found"
    for name, *_ in rows:
        script = name.strip("`").split()[0]
        assert (ROOT / "bench" / script).is_file(), f"README names {script}, not in bench/"


def test_every_figure_of_the_table_is_in_the_lab_notes() -> None:
    notes = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [
        f"{row[0]}: {number}"
        for row in _rows()
        for number in NUMBER.findall(row[1] + " " + row[2])
        if number not in notes
    ]
    assert not missing, f"README figures not in docs/benchmarks.md: {missing}"
