"""Retention: deleting finished rows from the store, one bounded batch per transaction, and
measuring how big the store is. The gateway's retention stage (gateway/stages/services/retention.py)
calls these in a loop; docs/gateway.md ("Retention") states what is kept.

Invariants kept here:
- Only finished rows go. An alert only when it is resolved and neither received, resolved nor
  acknowledged since the cut, none of its events waits in the policy inbox, none of its
  notifications is pending or being sent and no maintenance window still holds its notices
  back; it goes with all its events, notifications, (closed) mutes and its place in its
  incident (a resolved incident left without alerts goes too), in one transaction.
  A notification only when it is sent, dead or cancelled. A receipt only when no webhook
  brought its body since the cut and no intake journal row waits for it (references to it
  are cleared first, and the group digest it set goes with it).
- A batch looks at most at `limit` rows of the kind it purges, the next ones by time through
  a time index (keyset: the next batch starts after the last row looked at), and deletes at
  most those (an alert's batch: up to `limit` alerts plus their events and notifications),
  so the write lock it takes is short and the intake waits at most one batch, however many
  rows must stay.
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

from sqlalchemy import Select, Table, bindparam, delete, exists, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trainsentry.store.dialect import is_sqlite
from trainsentry.store.engine import sqlite_path
from trainsentry.store.maintenance_windows import MUTED
from trainsentry.store.outbox import CANCELLED, DEAD, SENT
from trainsentry.store.schema import (
    alert_events,
    alerts,
    callback_events,
    incident_alerts,
    incidents,
    intake_journal,
    maintenance_mutes,
    notifications,
    policy_inbox,
    webhook_groups,
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
        if is_sqlite(conn):
            # pysqlite's commit()/rollback() end this transaction (see engine.migrate).
            await conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield conn


def _unindexed(column: Any) -> Any:
    """`column` as an expression no index serves, for the conditions checked on the rows a
    batch already picked by id: a planner misled by stale statistics (PostgreSQL right after
    a bulk load, SQLite without any) would otherwise read every resolved alert or finished
    notification through the status index to intersect it with those ids."""
    return column.concat("")


def _postgresql(conn: AsyncConnection) -> bool:
    return not is_sqlite(conn)


def _ids(rows: Any) -> list[int]:
    return [int(row[0]) for row in rows]


# Where the next batch of one run starts: the (time, id) of the last row the batch looked at.
After = tuple[datetime, int]


@dataclass(frozen=True, slots=True)
class Batch:
    """What one batch did: the rows it deleted, how many rows of its kind it looked at (at
    most its limit; fewer: the kind is done for this run), and where the next one starts."""

    purged: Purged
    examined: int
    after: After | None = None


def next_by_time(
    table: Table, column: Any, before: datetime, after: After | None, limit: int
) -> Select[Any]:
    """The next `limit` rows of `table` by (`column`, id) older than `before`, after `after`:
    a range of the time index, in its order, whatever else the rows hold. Later conditions
    are checked on these rows only, so a batch reads at most `limit` rows however many old
    rows must stay (firing alerts, pending notifications)."""
    query = select(table.c.id, column).where(column < before)
    if after is not None:
        at, last_id = after
        query = query.where(
            tuple_(column, table.c.id)
            > tuple_(
                bindparam(None, at, type_=column.type),
                bindparam(None, last_id, type_=table.c.id.type),
            )
        )
    return query.order_by(column, table.c.id).limit(limit)


async def _next_rows(
    conn: AsyncConnection,
    table: Table,
    column: Any,
    before: datetime,
    after: After | None,
    limit: int,
) -> tuple[list[int], After | None]:
    rows = (await conn.execute(next_by_time(table, column, before, after, limit))).all()
    last = (rows[-1][1], int(rows[-1][0])) if rows else None
    return [int(row[0]) for row in rows], last


def old_receipts(before: datetime, limit: int) -> Select[Any]:
    """The first `limit` receipts whose body no webhook brought since `before` and that no
    intake journal row waits for (store/journal.py: its alerts are recorded from it)."""
    waiting = exists().where(intake_journal.c.receipt_id == webhook_receipts.c.id)
    return (
        select(webhook_receipts.c.id)
        .where(webhook_receipts.c.last_received_at < before, ~waiting)
        .order_by(webhook_receipts.c.last_received_at)
        .limit(limit)
    )


async def purge_receipts(
    conn: AsyncConnection, before: datetime, limit: int, after: After | None = None
) -> Batch:
    """Deletes up to `limit` receipts whose body no webhook brought since `before`; the
    alerts and events that named them keep their rows, without the reference. (Every old
    receipt goes, so no cursor: `after` is not used.)"""
    query = old_receipts(before, limit)
    if _postgresql(conn):
        query = query.with_for_update(skip_locked=True)
    ids = _ids(await conn.execute(query))
    if not ids:
        return Batch(Purged(), 0)
    await conn.execute(
        update(alerts).where(alerts.c.first_receipt_id.in_(ids)).values(first_receipt_id=None)
    )
    await conn.execute(
        update(alert_events).where(alert_events.c.receipt_id.in_(ids)).values(receipt_id=None)
    )
    # a group's digest goes with the receipt that set it: the group's next webhook is
    # recorded in full (store/resends.py)
    await conn.execute(delete(webhook_groups).where(webhook_groups.c.receipt_id.in_(ids)))
    result = await conn.execute(delete(webhook_receipts).where(webhook_receipts.c.id.in_(ids)))
    return Batch(Purged(receipts=result.rowcount), len(ids))


def _unfinished_notification(alert_id: Any) -> Any:
    return exists().where(
        notifications.c.alert_id == alert_id,
        notifications.c.status.not_in(FINISHED_NOTIFICATIONS),
    )


def _waiting_in_inbox(alert_id: Any) -> Any:
    return exists().where(
        alert_events.c.alert_id == alert_id, policy_inbox.c.event_id == alert_events.c.id
    )


def _held_by_a_window(alert_id: Any) -> Any:
    """A maintenance window muted the alert and still owes its notices
    (store/maintenance_windows.py)."""
    return exists().where(
        maintenance_mutes.c.alert_id == alert_id, maintenance_mutes.c.state == MUTED
    )


def _old(column: Any, before: datetime) -> Any:
    return column.is_(None) | (column < before)


def finished_alerts(ids: Sequence[int], before: datetime) -> Select[Any]:
    """Among `ids`: the finished alerts (module docstring) last touched before `before`."""
    return select(alerts.c.id).where(
        alerts.c.id.in_(ids),
        _unindexed(alerts.c.status) == RESOLVED,
        alerts.c.last_received_at < before,
        _old(alerts.c.resolved_at, before),
        _old(alerts.c.acked_at, before),
        ~_unfinished_notification(alerts.c.id),
        ~_waiting_in_inbox(alerts.c.id),
        ~_held_by_a_window(alerts.c.id),
    )


async def purge_alerts(
    conn: AsyncConnection, before: datetime, limit: int, after: After | None = None
) -> Batch:
    """Looks at the next `limit` alerts created before `before` (after `after`) and deletes
    the finished ones (module docstring) with their events and notifications."""
    # created before the cut is implied by last received before it, and indexed
    examined, last = await _next_rows(conn, alerts, alerts.c.created_at, before, after, limit)
    if not examined:
        return Batch(Purged(), 0)
    query = finished_alerts(examined, before)
    if _postgresql(conn):
        query = query.with_for_update(of=alerts, skip_locked=True)
    ids = _ids(await conn.execute(query))
    # Read again now that the alerts are locked (a fresh snapshot on PostgreSQL): a
    # notification re-queued or an event queued in between keeps its alert.
    kept = await _still_busy(conn, ids) if ids else set()
    ids = [alert_id for alert_id in ids if alert_id not in kept]
    if not ids:
        return Batch(Purged(), len(examined), last)
    gone_notifications = await conn.execute(
        delete(notifications).where(notifications.c.alert_id.in_(ids))
    )
    await conn.execute(delete(maintenance_mutes).where(maintenance_mutes.c.alert_id.in_(ids)))
    await _forget_members(conn, ids)
    gone_events = await conn.execute(delete(alert_events).where(alert_events.c.alert_id.in_(ids)))
    gone_alerts = await conn.execute(delete(alerts).where(alerts.c.id.in_(ids)))
    purged = Purged(
        alerts=gone_alerts.rowcount,
        alert_events=gone_events.rowcount,
        notifications=gone_notifications.rowcount,
    )
    return Batch(purged, len(examined), last)


async def _forget_members(conn: AsyncConnection, ids: Sequence[int]) -> None:
    """The purged alerts leave their incidents; an incident left resolved and without
    alerts goes too (an open one stays: its other alerts still fire)."""
    of = select(incident_alerts.c.incident_id).where(incident_alerts.c.alert_id.in_(ids))
    touched = _ids(await conn.execute(of.distinct()))
    await conn.execute(delete(incident_alerts).where(incident_alerts.c.alert_id.in_(ids)))
    if touched:
        members = select(incident_alerts.c.alert_id).where(
            incident_alerts.c.incident_id == incidents.c.id
        )
        await conn.execute(
            delete(incidents).where(
                incidents.c.id.in_(touched), incidents.c.status == RESOLVED, ~exists(members)
            )
        )


async def _still_busy(conn: AsyncConnection, ids: Sequence[int]) -> set[int]:
    """Among locked alerts `ids`: those with a notification not finished (the notifications
    are locked too, so none changes before the commit), an event in the inbox, or a window's
    mute still open."""
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
    muted = select(maintenance_mutes.c.alert_id).where(
        maintenance_mutes.c.alert_id.in_(ids), maintenance_mutes.c.state == MUTED
    )
    if _postgresql(conn):
        muted = muted.with_for_update()
    busy.update(_ids(await conn.execute(muted)))
    return busy


async def purge_notifications(
    conn: AsyncConnection, before: datetime, limit: int, after: After | None = None
) -> Batch:
    """Looks at the next `limit` notifications written before `before` (after `after`) and
    deletes those sent, dead or cancelled (pending and leased ones are never touched)."""
    examined, last = await _next_rows(
        conn, notifications, notifications.c.created_at, before, after, limit
    )
    if not examined:
        return Batch(Purged(), 0)
    query = select(notifications.c.id).where(
        notifications.c.id.in_(examined),
        _unindexed(notifications.c.status).in_(FINISHED_NOTIFICATIONS),
    )
    if _postgresql(conn):
        query = query.with_for_update(skip_locked=True)
    ids = _ids(await conn.execute(query))
    if not ids:
        return Batch(Purged(), len(examined), last)
    # the status is checked again by the delete itself: a dead row re-queued in between stays
    result = await conn.execute(
        delete(notifications).where(
            notifications.c.id.in_(ids), notifications.c.status.in_(FINISHED_NOTIFICATIONS)
        )
    )
    return Batch(Purged(notifications=result.rowcount), len(examined), last)


def old_callback_events(before: datetime, limit: int) -> Select[Any]:
    """The first `limit` card-callback event ids recorded before `before`."""
    return (
        select(callback_events.c.event_id)
        .where(callback_events.c.received_at < before)
        .order_by(callback_events.c.received_at)
        .limit(limit)
    )


async def purge_callback_events(
    conn: AsyncConnection, before: datetime, limit: int, after: After | None = None
) -> Batch:
    """Deletes up to `limit` card-callback event ids recorded before `before` (all old ones
    go: `after` is not used)."""
    query = old_callback_events(before, limit)
    if _postgresql(conn):
        query = query.with_for_update(skip_locked=True)
    ids = [str(row[0]) for row in await conn.execute(query)]
    if not ids:
        return Batch(Purged(), 0)
    result = await conn.execute(delete(callback_events).where(callback_events.c.event_id.in_(ids)))
    return Batch(Purged(callback_events=result.rowcount), len(ids))


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
    if is_sqlite(engine):
        path = sqlite_path(engine.url.render_as_string(hide_password=True))
        # a thread: a stat of a volume that hangs (NFS) must not stop the event loop
        return None if path is None else await asyncio.to_thread(sqlite_size, path)
    async with engine.connect() as conn:
        size = (await conn.execute(text("SELECT pg_database_size(current_database())"))).scalar()
    return StoreSize(bytes=int(size or 0))
