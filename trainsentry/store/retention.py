"""Retention: deleting finished rows from the store, one bounded batch per transaction, and
measuring how big the store is. The gateway's retention stage (gateway/stages/retention.py)
calls these in a loop; docs/gateway.md ("Retention") states what is kept.

Invariants kept here:
- Only finished rows go. An alert only when it is resolved and neither received, resolved nor
  acknowledged since the cut, none of its events waits in the policy inbox and none of its
  notifications is pending or being sent; it goes with all its events and notifications, in
  one transaction. A notification only when it is sent, dead or cancelled. A receipt only when
  no webhook brought its body since the cut (references to it are cleared first).
- A batch deletes at most `limit` rows of the kind it purges (an alert's batch: `limit` alerts
  plus their events and notifications), so the write lock it takes is short and the intake
  waits at most one batch.
- Races: on PostgreSQL the candidates are locked `FOR UPDATE SKIP LOCKED` (rows another
  transaction holds are left for the next round), which also stops anyone inserting an event
  or a notification for a locked alert; whether each locked alert may still go is then read
  again, with its notifications locked, so a change committed in between keeps it. Two
  replicas purging at once take disjoint rows. On SQLite a batch is one `BEGIN IMMEDIATE`
  transaction: it holds the write lock from its first read to its commit.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, delete, exists, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trainsentry.store.engine import sqlite_path
from trainsentry.store.outbox import CANCELLED, DEAD, SENT
from trainsentry.store.schema import (
    alert_events,
    alerts,
    callback_events,
    notifications,
    policy_inbox,
    webhook_receipts,
)

FINISHED_NOTIFICATIONS = (SENT, DEAD, CANCELLED)
RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Purged:
    """Rows one batch deleted, by table."""

    receipts: int = 0
    alerts: int = 0
    alert_events: int = 0
    notifications: int = 0
    callback_events: int = 0

    def total(self) -> int:
        return (
            self.receipts
            + self.alerts
            + self.alert_events
            + self.notifications
            + self.callback_events
        )


@asynccontextmanager
async def batch_transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One purge batch's transaction; on SQLite it takes the write lock at once (BEGIN
    IMMEDIATE), so what it reads cannot change before it deletes."""
    async with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            # pysqlite's commit()/rollback() end this transaction (see engine.migrate).
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield conn


def _unindexed(column: Any) -> Any:
    """`column` as an expression no index serves: SQLite's planner (no statistics) would
    otherwise read every finished row through the status index and sort them, under the
    write lock, instead of reading only the old ones through the time index."""
    return column.concat("")


def _postgresql(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "postgresql"


def _ids(rows: Any) -> list[int]:
    return [int(row[0]) for row in rows]


def old_receipts(before: datetime, limit: int) -> Select[Any]:
    """The first `limit` receipts whose body no webhook brought since `before`."""
    return (
        select(webhook_receipts.c.id)
        .where(webhook_receipts.c.last_received_at < before)
        .order_by(webhook_receipts.c.last_received_at)
        .limit(limit)
    )


async def purge_receipts(conn: AsyncConnection, before: datetime, limit: int) -> Purged:
    """Deletes up to `limit` receipts whose body no webhook brought since `before`; the
    alerts and events that named them keep their rows, without the reference."""
    query = old_receipts(before, limit)
    if _postgresql(conn):
        query = query.with_for_update(skip_locked=True)
    ids = _ids(await conn.execute(query))
    if not ids:
        return Purged()
    await conn.execute(
        update(alerts).where(alerts.c.first_receipt_id.in_(ids)).values(first_receipt_id=None)
    )
    await conn.execute(
        update(alert_events).where(alert_events.c.receipt_id.in_(ids)).values(receipt_id=None)
    )
    result = await conn.execute(delete(webhook_receipts).where(webhook_receipts.c.id.in_(ids)))
    return Purged(receipts=result.rowcount)


def _unfinished_notification(alert_id: Any) -> Any:
    return exists().where(
        notifications.c.alert_id == alert_id,
        notifications.c.status.not_in(FINISHED_NOTIFICATIONS),
    )


def _waiting_in_inbox(alert_id: Any) -> Any:
    return exists().where(
        alert_events.c.alert_id == alert_id, policy_inbox.c.event_id == alert_events.c.id
    )


def _old(column: Any, before: datetime) -> Any:
    return column.is_(None) | (column < before)


def old_alerts(before: datetime, limit: int) -> Select[Any]:
    """The first `limit` finished alerts (module docstring) last touched before `before`."""
    return (
        select(alerts.c.id)
        .where(
            # created before the cut (implied by the next line, and indexed): only the old
            # alerts are read, however many recent ones the store holds
            alerts.c.created_at < before,
            _unindexed(alerts.c.status) == RESOLVED,
            alerts.c.last_received_at < before,
            _old(alerts.c.resolved_at, before),
            _old(alerts.c.acked_at, before),
            ~_unfinished_notification(alerts.c.id),
            ~_waiting_in_inbox(alerts.c.id),
        )
        .order_by(alerts.c.created_at)
        .limit(limit)
    )


async def purge_alerts(conn: AsyncConnection, before: datetime, limit: int) -> Purged:
    """Deletes up to `limit` finished alerts (module docstring) with their events and
    notifications."""
    query = old_alerts(before, limit)
    if _postgresql(conn):
        query = query.with_for_update(of=alerts, skip_locked=True)
    ids = _ids(await conn.execute(query))
    if not ids:
        return Purged()
    # Read again now that the alerts are locked (a fresh snapshot on PostgreSQL): a
    # notification re-queued or an event queued in between keeps its alert.
    kept = await _still_busy(conn, ids)
    ids = [alert_id for alert_id in ids if alert_id not in kept]
    if not ids:
        return Purged()
    gone_notifications = await conn.execute(
        delete(notifications).where(notifications.c.alert_id.in_(ids))
    )
    gone_events = await conn.execute(delete(alert_events).where(alert_events.c.alert_id.in_(ids)))
    gone_alerts = await conn.execute(delete(alerts).where(alerts.c.id.in_(ids)))
    return Purged(
        alerts=gone_alerts.rowcount,
        alert_events=gone_events.rowcount,
        notifications=gone_notifications.rowcount,
    )


async def _still_busy(conn: AsyncConnection, ids: Sequence[int]) -> set[int]:
    """Among locked alerts `ids`: those with a notification not finished (the notifications
    are locked too, so none changes before the commit) or an event in the inbox."""
    query = select(notifications.c.alert_id, notifications.c.status).where(
        notifications.c.alert_id.in_(ids)
    )
    if _postgresql(conn):
        query = query.with_for_update()
    busy = {
        int(alert_id)
        for alert_id, status in await conn.execute(query)
        if status not in FINISHED_NOTIFICATIONS
    }
    waiting = select(alert_events.c.alert_id).where(
        alert_events.c.alert_id.in_(ids), alert_events.c.id == policy_inbox.c.event_id
    )
    busy.update(_ids(await conn.execute(waiting)))
    return busy


def old_notifications(before: datetime, limit: int) -> Select[Any]:
    """The first `limit` sent, dead or cancelled notifications written before `before`."""
    return (
        select(notifications.c.id)
        .where(
            notifications.c.created_at < before,
            _unindexed(notifications.c.status).in_(FINISHED_NOTIFICATIONS),
        )
        .order_by(notifications.c.created_at)
        .limit(limit)
    )


async def purge_notifications(conn: AsyncConnection, before: datetime, limit: int) -> Purged:
    """Deletes up to `limit` notifications written before `before` that are sent, dead or
    cancelled (pending and leased ones are never touched)."""
    query = old_notifications(before, limit)
    if _postgresql(conn):
        query = query.with_for_update(skip_locked=True)
    ids = _ids(await conn.execute(query))
    if not ids:
        return Purged()
    # the status is checked again by the delete itself: a dead row re-queued in between stays
    result = await conn.execute(
        delete(notifications).where(
            notifications.c.id.in_(ids), notifications.c.status.in_(FINISHED_NOTIFICATIONS)
        )
    )
    return Purged(notifications=result.rowcount)


def old_callback_events(before: datetime, limit: int) -> Select[Any]:
    """The first `limit` card-callback event ids recorded before `before`."""
    return (
        select(callback_events.c.event_id)
        .where(callback_events.c.received_at < before)
        .order_by(callback_events.c.received_at)
        .limit(limit)
    )


async def purge_callback_events(conn: AsyncConnection, before: datetime, limit: int) -> Purged:
    """Deletes up to `limit` card-callback event ids recorded before `before`."""
    query = old_callback_events(before, limit)
    if _postgresql(conn):
        query = query.with_for_update(skip_locked=True)
    ids = [str(row[0]) for row in await conn.execute(query)]
    if not ids:
        return Purged()
    result = await conn.execute(delete(callback_events).where(callback_events.c.event_id.in_(ids)))
    return Purged(callback_events=result.rowcount)


# ---------------------------------------------------------------- size


@dataclass(frozen=True, slots=True)
class StoreSize:
    """How big the store is: its bytes (SQLite: the file with its WAL and shared-memory
    files; PostgreSQL: pg_database_size), and for SQLite the volume it lives on."""

    bytes: int
    volume: str | None = None  # the SQLite file's directory
    volume_free_bytes: int | None = None  # what an unprivileged process may still write
    volume_size_bytes: int | None = None


def sqlite_size(path: os.PathLike[str] | str) -> StoreSize:
    """The size of a SQLite store at `path` and of the volume under it (0 bytes when the
    file is not there yet)."""
    database = os.fspath(path)
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with suppress(FileNotFoundError):
            total += os.stat(database + suffix).st_size
    directory = os.path.dirname(database) or "."
    stats = os.statvfs(directory)
    return StoreSize(
        bytes=total,
        volume=directory,
        volume_free_bytes=stats.f_bavail * stats.f_frsize,
        volume_size_bytes=stats.f_blocks * stats.f_frsize,
    )


async def store_size(engine: AsyncEngine) -> StoreSize | None:
    """The store's size (see StoreSize); None for an in-memory SQLite store."""
    if engine.dialect.name == "sqlite":
        path = sqlite_path(engine.url.render_as_string(hide_password=True))
        # a thread: a stat of a volume that hangs (NFS) must not stop the event loop
        return None if path is None else await asyncio.to_thread(sqlite_size, path)
    async with engine.connect() as conn:
        size = (await conn.execute(text("SELECT pg_database_size(current_database())"))).scalar()
    return StoreSize(bytes=int(size or 0))
