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


# What a fresh clone holds: nothing the README, the docs or the code point at lives outside
# the repository (`scripts/gpu/` are device harnesses that copy the reference NCCL harness
# from beside the checkout on purpose: scripts/gpu/README.md says so).
OUTSIDE = re.compile(r"\.\./shared|/work/shared|\bDESIGN\.md\b|parents\[\d\] / \"shared\"")
CHECKED = ("README.md", "pyproject.toml", "Dockerfile", "docs", "trainsentry", "tests", "bench",
           "charts", "rules", "scripts")  # fmt: skip


def test_no_link_leaves_the_repository() -> None:
    this = Path(__file__).resolve()
    found = []
    for name in CHECKED:
        root = ROOT / name
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in paths:
            if path == this or "gpu" in path.relative_to(ROOT).parts[:2]:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
    assert not found, f"references to files outside the repository: {found}"
    assert (ROOT / "docs" / "design.md").is_file()


def test_the_license_file_is_the_one_pyproject_names() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX" in text
