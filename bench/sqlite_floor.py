"""SQLite's own cost for what the intake stores: the floor under any gateway on this store.

The intake commits, per webhook, its receipt (with the body) and per alert an occurrence row,
an event and a policy-inbox row. Here plain `sqlite3` writes exactly those rows into the
gateway's schema, WAL and `synchronous=FULL` as the gateway runs it, one transaction per group
commit. Every row is built before the clock starts and events and inbox rows are made by
`INSERT … SELECT` inside SQLite, so the time is the database engine's alone: no validation, no
HTTP, no Python per row. SQLite has one writer at a time, so no number of threads or processes
stores faster than this on the same machine.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.labels import NODE_LABELS
from trainsentry.store.bulk import Encoder
from trainsentry.store.engine import create_engine, migrate
from trainsentry.store.writes import _ALERT_COLUMNS, _RECEIPT_COLUMNS, _occurrence_row

GROUP_COMMIT = 16  # webhooks per intake transaction (the benchmark's 16 concurrent clients)


async def _create_schema(path: Path) -> None:
    engine = create_engine(f"sqlite:///{path}")
    await migrate(engine)
    await engine.dispose()


def _receipt_row(body: bytes, index: int, received: str, alerts: int) -> tuple[Any, ...]:
    sha = f"{index:064x}"
    return (sha, received, received, 1, "bench", "firing", "bench", 0, alerts, "", body.decode())


def engine_seconds(path: Path, bodies: list[bytes]) -> float:
    """Seconds for SQLite alone to commit the rows the intake writes for `bodies`."""
    asyncio.run(_create_schema(path))
    enc = Encoder("sqlite")
    receipts = [parse_webhook(body) for body in bodies]
    batches = []
    for start in range(0, len(receipts), GROUP_COMMIT):
        group = receipts[start : start + GROUP_COMMIT]
        heads = [
            _receipt_row(bodies[start + i], start + i, enc.time(r.received_at), len(r.alerts))
            for i, r in enumerate(group)
        ]
        rows = [  # a fresh file: the receipts get ids 1, 2, ... in order
            _occurrence_row(
                a, enc.time(a.starts_at), start + i + 1, r.received_at, "firing", enc, NODE_LABELS
            )
            for i, r in enumerate(group)
            for a in r.alerts
        ]
        batches.append((heads, rows))
    receipt_sql = (
        f"INSERT INTO webhook_receipts ({','.join(_RECEIPT_COLUMNS)}) "
        f"VALUES ({','.join('?' * len(_RECEIPT_COLUMNS))})"
    )
    alert_sql = (
        f"INSERT INTO alerts ({','.join(_ALERT_COLUMNS)}) "
        f"VALUES ({','.join('?' * len(_ALERT_COLUMNS))})"
    )
    events_sql = (
        "INSERT INTO alert_events (alert_id, kind, at, receipt_id) "
        "SELECT id, status, created_at, first_receipt_id FROM alerts WHERE id > ?"
    )
    inbox_sql = (
        "INSERT INTO policy_inbox (event_id, urgency) SELECT id, 2 FROM alert_events WHERE id > ?"
    )
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    started = time.perf_counter()
    for heads, rows in batches:
        db.execute("BEGIN")
        db.executemany(receipt_sql, heads)
        (last_alert,) = db.execute("SELECT coalesce(max(id), 0) FROM alerts").fetchone()
        (last_event,) = db.execute("SELECT coalesce(max(id), 0) FROM alert_events").fetchone()
        db.executemany(alert_sql, rows)
        db.execute(events_sql, (last_alert,))
        db.execute(inbox_sql, (last_event,))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - started
    stored = db.execute("SELECT count(*) FROM policy_inbox").fetchone()[0]
    db.close()
    expected = sum(len(rows) for _, rows in batches)
    if stored != expected:
        raise RuntimeError(f"floor stored {stored} inbox rows, expected {expected}")
    return elapsed
