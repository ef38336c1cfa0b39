"""Export archive rows (same columns as the Feishu sheet) as CSV or XLSX, for places without Feishu.

XLSX needs `openpyxl` (small, pure Python); CSV needs nothing. The CLI command that reads
the store and calls `export_rows` belongs to the gateway CLI.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from trainsentry.notifiers.rows import COLUMNS

Format = Literal["csv", "xlsx"]
# Cells starting with these are formulas to a spreadsheet program; neutralise them.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _safe(cell: str) -> str:
    return "'" + cell if cell.startswith(_FORMULA_START) else cell


def rows_to_csv(rows: Iterable[Sequence[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_safe(cell) for cell in row])
    return out.getvalue()


def rows_to_xlsx(rows: Iterable[Sequence[str]], path: Path, sheet_title: str = "alerts") -> None:
    try:
        from openpyxl import Workbook  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RuntimeError("XLSX export needs openpyxl (pip install openpyxl); CSV works") from exc
    workbook = Workbook(write_only=True)
    sheet = workbook.create_sheet(sheet_title[:31])
    sheet.append(list(COLUMNS))
    for row in rows:
        sheet.append([_safe(cell) for cell in row])
    workbook.save(path)


def export_rows(rows: Iterable[Sequence[str]], path: Path, fmt: Format | None = None) -> Path:
    """Writes `rows` to `path` as CSV or XLSX (default: from the file suffix)."""
    fmt = fmt or ("xlsx" if path.suffix.lower() == ".xlsx" else "csv")
    if fmt == "xlsx":
        rows_to_xlsx(rows, path)
    else:
        path.write_text(rows_to_csv(rows), encoding="utf-8")
    return path
