"""The outbox table's SQL: claiming due rows, writing send outcomes, leases, cancellations.

The sending loop (gateway/stages/outbox.py) decides what to send and how to back off; this
module only reads and writes the `notifications` table, inside the caller's transaction.

Invariants kept here:
- A row is claimed (status `sending`, `claimed_by`, `claimed_until`) before it is sent; on
  PostgreSQL the due rows are selected `FOR UPDATE SKIP LOCKED`, so with several replicas
  each row is claimed by exactly one of them.
- Order per (channel, group_key): a row is due only when no older row of its group is still
  pending or being sent.
- Outcomes are written only for rows the writer still owns (`claimed_by`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row, bindparam, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import notifications

PENDING, SENDING, SENT, DEAD = "pending", "sending", "sent", "dead"
UNSENT = frozenset({PENDING, SENDING})  # written, not yet sent: what the outbox ages count
# A notification withdrawn before it went out (a stopped escalation's call): final, no failure.
CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """What happened to one claimed row; written back in bulk by `record_outcomes`."""

    id: int
    status: str
    attempts: int
    sent_at: datetime | None = None
    provider_id: str | None = None
    last_error: str | None = None
    next_attempt_at: datetime | None = None
    # the failing streak's start (None: sent, cancelled, or only rate-limited so far)
    failing_since: datetime | None = None


async def next_due_at(conn: AsyncConnection, channel: str | None = None) -> datetime | None:
    """When the earliest pending row (of `channel`, if given) becomes due (None when
    nothing is pending)."""
    query = select(func.min(notifications.c.next_attempt_at)).where(
        notifications.c.status == PENDING
    )
    if channel is not None:
        query = query.where(notifications.c.channel == channel)
    value = (await conn.execute(query)).scalar()
    return value if isinstance(value, datetime) else None


async def busy_count(conn: AsyncConnection, now: datetime) -> int:
    """Rows being sent, plus pending rows already due."""
    return int(
        (
            await conn.execute(
                select(func.count()).where(
                    (notifications.c.status == SENDING)
                    | (
                        (notifications.c.status == PENDING)
                        & (notifications.c.next_attempt_at <= now)
                    )
                )
            )
        ).scalar()
        or 0
    )


async def sending_claimers(conn: AsyncConnection, host: str) -> list[str] | None:
    """The worker ids (`host:pid:nonce`) holding rows `sending` that were claimed from `host`;
    None on SQLite, where one gateway owns the store (every claimer is an earlier run of it)."""
    if is_sqlite(conn):
        return None
    rows = await conn.execute(
        select(notifications.c.claimed_by)
        .where(
            notifications.c.status == SENDING,
            notifications.c.claimed_by.like(f"{host}:%"),
        )
        .distinct()
    )
    return [str(c) for c in rows.scalars() if c is not None]


async def release_leases(
    conn: AsyncConnection, worker_id: str, claimers: Sequence[str] | None
) -> int:
    """Rows `sending` under one of `claimers` (None: under anyone but `worker_id`, for SQLite,
    where one gateway owns the store) are pending again, at once."""
    query = update(notifications).where(
        notifications.c.status == SENDING, notifications.c.claimed_by != worker_id
    )
    if claimers is not None:
        if not claimers:
            return 0
        query = query.where(notifications.c.claimed_by.in_(list(claimers)))
    result = await conn.execute(query.values(status=PENDING, claimed_by=None, claimed_until=None))
    return int(result.rowcount or 0)


async def recover_expired_leases(conn: AsyncConnection, now: datetime) -> int:
    """Rows whose lease ran out (their sender crashed) are pending and due again."""
    result = await conn.execute(
        update(notifications)
        .where(notifications.c.status == SENDING, notifications.c.claimed_until < now)
        .values(status=PENDING, claimed_by=None, claimed_until=None, next_attempt_at=now)
    )
    return int(result.rowcount or 0)


async def claim_notifications(
    conn: AsyncConnection,
    channel: str,
    *,
    limit: int,
    now: datetime,
    worker_id: str,
    lease_until: datetime,
) -> list[Row[Any]]:
    """Claims up to `limit` due rows of `channel`: most urgent priority first ("P0" < "P1" <
    ... as text), then oldest; at most the oldest open row of each group. The claimed rows
    (all columns) are returned."""
    # Due only as the oldest open row of its group. A correlated min() rather than NOT
    # EXISTS: PostgreSQL plans the NOT EXISTS as an anti join that, on a table whose
    # statistics lag a burst, scans the whole group index per row (168 ms for 1,000 pending
    # rows, per claim); the min() is one index-only probe per row (2 ms).
    older = notifications.alias("older")
    oldest_open = (
        select(func.min(older.c.id))
        .where(
            older.c.channel == notifications.c.channel,
            older.c.group_key == notifications.c.group_key,
            older.c.status.in_((PENDING, SENDING)),
        )
        .scalar_subquery()
    )
    is_due = (
        notifications.c.status == PENDING,
        notifications.c.channel == channel,
        notifications.c.next_attempt_at <= now,
        notifications.c.id == oldest_open,
    )
    due = (
        select(notifications.c.id)
        .where(*is_due)
        # a rate-limited channel's backlog of P3 cards must not hold back a P0
        .order_by(notifications.c.priority, notifications.c.id)
        .limit(limit)
    )
    if not is_sqlite(conn):
        due = due.with_for_update(skip_locked=True, of=notifications)
    # Ids first, then the update: as a subquery of the UPDATE, PostgreSQL may run
    # the LIMIT ... SKIP LOCKED select more than once and claim past the limit.
    ids = (await conn.execute(due)).scalars().all()
    if not ids:
        return []
    # The update checks again that each row is still due. SQLite locks nothing while the
    # select runs (pysqlite begins the transaction at the update), so another claimer of the
    # channel (its loop beside `Outbox.drain`) may have claimed, tried and rescheduled a row
    # in between: `pending` again, but its retry not due (or an older row of its group
    # reopened). On PostgreSQL the selected rows are locked meanwhile (FOR UPDATE).
    stmt = (
        update(notifications)
        .where(notifications.c.id.in_(ids), *is_due)
        .values(status=SENDING, claimed_by=worker_id, claimed_until=lease_until)
        .returning(*notifications.c)
    )
    return list((await conn.execute(stmt)).all())


async def record_outcomes(
    conn: AsyncConnection,
    worker_id: str,
    outcomes: Sequence[SendOutcome],
    now: datetime,
    *,
    withdrawn_mark: str | None = None,
) -> list[int]:
    """Writes the outcomes of claimed rows in one statement (only rows `worker_id` owns).

    A row to be tried again whose payload got `withdrawn_mark` while it was being sent
    (`cancel_calls`: its escalation stopped) ends `cancelled` instead, with the mark's reason
    as its error, in this same transaction: no channel rings it again, whether or not it
    reads the mark. Returns those rows' ids."""
    if not outcomes:
        return []
    stmt = (
        update(notifications)
        .where(
            notifications.c.id == bindparam("b_id"),
            notifications.c.claimed_by == worker_id,
        )
        .values(
            status=bindparam("b_status"),
            attempts=bindparam("b_attempts"),
            sent_at=bindparam("b_sent_at"),
            provider_id=bindparam("b_provider_id"),
            # a success keeps the last error, for the record of why it took several tries
            last_error=func.coalesce(bindparam("b_last_error"), notifications.c.last_error),
            next_attempt_at=bindparam("b_next"),
            failing_since=bindparam("b_failing_since"),
            claimed_by=None,
            claimed_until=None,
        )
    )
    params = [
        {
            "b_id": o.id,
            "b_status": o.status,
            "b_attempts": o.attempts,
            "b_sent_at": o.sent_at,
            "b_provider_id": o.provider_id,
            "b_last_error": o.last_error,
            "b_next": o.next_attempt_at or now,
            "b_failing_since": o.failing_since,
        }
        for o in outcomes
    ]
    await conn.execute(stmt, params)
    retries = [o.id for o in outcomes if o.status == PENDING]
    if withdrawn_mark is None or not retries:
        return []
    return await _withdraw_marked(conn, retries, withdrawn_mark)


async def _withdraw_marked(conn: AsyncConnection, ids: Sequence[int], mark: str) -> list[int]:
    """Rows among `ids` pending with `payload[mark]` set become `cancelled`. Run after the
    outcomes' update, which holds the rows (PostgreSQL) or the write lock (SQLite) until the
    commit, so a stop committing in between cannot slip past."""
    rows = await conn.execute(
        select(notifications.c.id, notifications.c.payload).where(
            notifications.c.id.in_(list(ids)), notifications.c.status == PENDING
        )
    )
    withdrawn = {int(r.id): str(r.payload[mark]) for r in rows if r.payload.get(mark)}
    for row_id, why in withdrawn.items():
        await conn.execute(
            update(notifications)
            .where(notifications.c.id == row_id)
            .values(status=CANCELLED, last_error=why[:2000])
        )
    return sorted(withdrawn)


async def renew_leases(
    conn: AsyncConnection, worker_id: str, ids: Sequence[int], until: datetime
) -> set[int]:
    """Extends the lease of the rows among `ids` that `worker_id` still holds (status
    `sending`, claimed by it) to `until`; returns those ids. A row missing from the answer
    was taken back (its lease ran out and another replica claimed it): never send it."""
    held: set[int] = set()
    for start in range(0, len(ids), 1000):
        result = await conn.execute(
            update(notifications)
            .where(
                notifications.c.id.in_(ids[start : start + 1000]),
                notifications.c.status == SENDING,
                notifications.c.claimed_by == worker_id,
            )
            .values(claimed_until=until)
            .returning(notifications.c.id)
        )
        held.update(int(i) for i in result.scalars())
    return held


async def requeue_dead(
    conn: AsyncConnection,
    *,
    ids: Sequence[int] | None,
    channel: str | None,
    created_since: datetime | None,
    by: str,
    now: datetime,
) -> list[int]:
    """Dead rows matching every filter given (`ids`, `channel`, created at or after
    `created_since`; none given: every dead row) are pending and due now, with a new failing
    streak; who asked and when is kept in `retried_by`/`retried_at`. Returns their ids."""
    query = update(notifications).where(notifications.c.status == DEAD)
    if ids is not None:
        query = query.where(notifications.c.id.in_(list(ids)))
    if channel is not None:
        query = query.where(notifications.c.channel == channel)
    if created_since is not None:
        query = query.where(notifications.c.created_at >= created_since)
    result = await conn.execute(
        query.values(
            status=PENDING,
            next_attempt_at=now,
            failing_since=None,
            claimed_by=None,
            claimed_until=None,
            retried_by=by,
            retried_at=now,
        ).returning(notifications.c.id)
    )
    return sorted(int(i) for i in result.scalars())


async def cancel_calls(
    conn: AsyncConnection,
    channel: str,
    kind: str,
    alert_ids: Sequence[int],
    why: str,
    mark: str,
) -> None:
    """Rows of `kind` on `channel` for `alert_ids` that have not gone out never will: pending
    ones become `cancelled` (reason `why`); one being sent right now keeps its status (the
    outbox records that attempt) and gets `payload[mark] = why`: should that attempt end in a
    retry, `record_outcomes` writes it `cancelled` instead."""
    for start in range(0, len(alert_ids), 1000):
        pending = notifications.c.status == PENDING
        stmt = (
            update(notifications)
            .where(
                notifications.c.channel == channel,
                notifications.c.kind == kind,
                notifications.c.alert_id.in_(alert_ids[start : start + 1000]),
                notifications.c.status.in_((PENDING, SENDING)),
            )
            .values(
                status=case((pending, CANCELLED), else_=notifications.c.status),
                last_error=case((pending, why), else_=notifications.c.last_error),
            )
            .returning(notifications.c.id, notifications.c.payload)
        )
        for row in (await conn.execute(stmt)).all():
            await conn.execute(
                update(notifications)
                .where(notifications.c.id == row.id)
                .values(payload={**row.payload, mark: why})
            )
