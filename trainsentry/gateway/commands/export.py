"""`trainsentry export`: the archive rows (the Feishu sheet's columns) as CSV or XLSX."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

HELP = "export stored alert occurrences as CSV/XLSX rows (the sheet archive's columns)"
DESCRIPTION = """\
Writes one row per stored alert occurrence, with the same columns as the Feishu spreadsheet
archive (see docs/channels.md), for places without Feishu. The format follows the file suffix
(.csv or .xlsx).

It only reads the store: a SQLite file that does not exist (a wrong --db) is refused, never
created empty.

Exit codes: 0 written, 1 the store could not be read, 2 bad arguments (also: no store at
--db, a database URL no driver takes, an --out that is not .csv or .xlsx, an output file
that cannot be written where given).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", required=True, metavar="URL", help="the gateway's store URL")
    parser.add_argument("--out", required=True, type=Path, help="file to write (.csv or .xlsx)")
    parser.add_argument("--since", metavar="ISO8601", help="only occurrences started since then")


def run(args: argparse.Namespace) -> int:
    import asyncio
    from datetime import UTC, datetime

    from trainsentry.store.errors import StoreMissing, StoreUrlError

    if args.out.suffix.lower() not in (".csv", ".xlsx"):
        print(
            f"trainsentry export: --out {args.out}: the format follows the suffix, "
            "and export writes .csv or .xlsx (e.g. --out alerts.csv)",
            file=sys.stderr,
        )
        return 2
    since = None
    if args.since:
        try:
            since = datetime.fromisoformat(args.since)
        except ValueError:
            print(f"--since is not an ISO 8601 time: {args.since!r}")
            return 2
        since = since if since.tzinfo else since.replace(tzinfo=UTC)
    try:
        count = asyncio.run(export_alert_rows(args.db, args.out, since))
    except (StoreMissing, StoreUrlError) as exc:  # no store at --db (never created), a bad URL
        print(f"trainsentry export: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        print(f"trainsentry export: cannot write {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"export failed: {type(exc).__name__}: {exc}")
        return 1
    print(f"wrote {count} rows to {args.out}")
    return 0


async def export_alert_rows(db_url: str, out: Path, since: datetime | None = None) -> int:
    """Writes every stored occurrence (optionally since a time) as archive rows; returns the
    number of rows. StoreMissing when there is no store at `db_url`."""
    from trainsentry.notifiers.export import export_rows
    from trainsentry.notifiers.rows import row_from_alert
    from trainsentry.store.queries import load_occurrences_for_export

    rows: list[list[str]] = [  # export_rows writes the header
        row_from_alert(
            o.alert,
            alert_id=o.alert_id,
            priority=o.priority,
            reason=o.reason,
            acked_by=o.acked_by,
            incident_priority=o.incident_priority,
        )
        for o in await load_occurrences_for_export(db_url, since)
    ]
    export_rows(rows, out)
    return len(rows)
