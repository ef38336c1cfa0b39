"""The `report_runs` table: which report was sent for which audience and period.

A run *claims* a period by writing its row with `detail.state = "sending"` (the primary
key makes two concurrent runs collide; the loser skips); after the mail went out the row
becomes `"sent"`; a failed send withdraws the claim (or restores the previous row). A
claim older than `STALE_CLAIM` (a run that died mid-send) may be taken over. The sending
itself is reports/delivery.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import report_runs

STALE_CLAIM = timedelta(minutes=30)
SENDING, SENT = "sending", "sent"


async def last_sent_week(conn: AsyncConnection, audience: str, tz: str) -> date | None:
    """First day of the newest week already sent to `audience` in zone `tz`."""
    prefix = f"weekly/{audience}/week:"
    rows = await conn.execute(
        select(report_runs.c.period_key, report_runs.c.detail).where(
            report_runs.c.period_key.startswith(prefix, autoescape=True)
        )
    )
    newest: date | None = None
    for row in rows:
        day, _, zone_name = row.period_key.removeprefix(prefix).partition(":")
        if zone_name != tz or (row.detail or {}).get("state") != SENT:
            continue
        try:
            first = date.fromisoformat(day)
        except ValueError:
            continue
        newest = first if newest is None or first > newest else newest
    return newest


async def claim(
    engine: AsyncEngine, key: str, now: datetime, recipients: Sequence[str], *, force: bool
) -> tuple[bool, dict[str, Any] | None, str]:
    """(claimed, previous row to restore on failure, why not)."""
    try:
        return await _claim(engine, key, now, recipients, force=force)
    except OperationalError as exc:
        # SQLite: a concurrent run wrote first and our snapshot is stale (SQLITE_BUSY).
        if is_sqlite(engine) and "locked" in str(exc):
            return False, None, "another run is sending it"
        raise


async def _claim(
    engine: AsyncEngine, key: str, now: datetime, recipients: Sequence[str], *, force: bool
) -> tuple[bool, dict[str, Any] | None, str]:
    async with engine.begin() as conn:
        row = (
            await conn.execute(select(report_runs).where(report_runs.c.period_key == key))
        ).first()
        previous = None if row is None else dict(row._mapping)
        if previous is not None and not force:
            state = (previous["detail"] or {}).get("state", SENT)
            if state == SENT:
                return False, None, f"already sent at {previous['sent_at'].isoformat()}"
            if now - previous["sent_at"] < STALE_CLAIM:
                return False, None, "another run is sending it"
        if previous is not None:
            await conn.execute(delete(report_runs).where(report_runs.c.period_key == key))
        sends = int(((previous or {}).get("detail") or {}).get("sends", 0))
        try:
            await conn.execute(
                insert(report_runs).values(
                    period_key=key,
                    sent_at=now,
                    recipients=list(recipients),
                    detail={"state": SENDING, "sends": sends, "forced": force},
                )
            )
        except IntegrityError:
            return False, None, "another run is sending it"
    return True, previous, ""


async def release(engine: AsyncEngine, key: str, previous: dict[str, Any] | None) -> None:
    async with engine.begin() as conn:
        await conn.execute(delete(report_runs).where(report_runs.c.period_key == key))
        if previous is not None:
            await conn.execute(insert(report_runs).values(**previous))


async def mark_sent(
    engine: AsyncEngine, key: str, at: datetime, recipients: Sequence[str], detail: dict[str, Any]
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            update(report_runs)
            .where(report_runs.c.period_key == key)
            .values(sent_at=at, recipients=list(recipients), detail=detail)
        )
