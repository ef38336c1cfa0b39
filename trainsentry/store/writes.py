"""Writing webhook receipts and alert occurrences: the one place that turns received alerts into
stored state changes. Runs inside the caller's transaction.

Replays are harmless: an occurrence is keyed by (fingerprint, startsAt) and only a real status
change adds an event. With several gateway replicas on PostgreSQL, existing rows are locked
(`FOR UPDATE`, in id order) before their status is compared, and a concurrent insert of the same
occurrence is detected by `ON CONFLICT DO NOTHING` and re-read, so each change is recorded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Alert, AlertChange, AlertStatus, ChangeKind, NotificationDraft
from trainsentry.store.schema import alert_events, alerts, notifications, webhook_receipts


@dataclass(slots=True)
class IncomingReceipt:
    """A validated webhook body, ready to be stored."""

    body_sha256: str
    body_text: str
    received_at: datetime
    receiver: str
    status: str
    group_key: str
    truncated_alerts: int
    external_url: str
    alerts: list[Alert]
    group_labels: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ReceiptOutcome:
    receipt_id: int
    times_received: int
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    changes: list[AlertChange] = field(default_factory=list)


def dialect_insert(conn: AsyncConnection, table: Table) -> Any:
    """The backend's INSERT construct (both offer ON CONFLICT)."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


async def _insert_receipt(conn: AsyncConnection, receipt: IncomingReceipt) -> tuple[int, int]:
    stmt = dialect_insert(conn, webhook_receipts).values(
        body_sha256=receipt.body_sha256,
        received_at=receipt.received_at,
        last_received_at=receipt.received_at,
        times_received=1,
        receiver=receipt.receiver,
        status=receipt.status,
        group_key=receipt.group_key,
        truncated_alerts=receipt.truncated_alerts,
        alert_count=len(receipt.alerts),
        external_url=receipt.external_url,
        body=receipt.body_text,
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[webhook_receipts.c.body_sha256],
        set_={
            "times_received": webhook_receipts.c.times_received + 1,
            "last_received_at": stmt.excluded.last_received_at,
        },
    ).returning(webhook_receipts.c.id, webhook_receipts.c.times_received)
    row = (await conn.execute(stmt)).one()
    return int(row.id), int(row.times_received)


@dataclass(slots=True)
class _Seen:
    """Everything a batch says about one occurrence, in arrival order."""

    alert: Alert  # the latest version received
    statuses: list[tuple[AlertStatus, int, datetime]]  # (status, receipt index, received_at)


async def _lock_existing(
    conn: AsyncConnection, keys: Sequence[tuple[str, datetime]]
) -> dict[tuple[str, datetime], tuple[int, str]]:
    """Existing occurrences among `keys` → (id, status), locked on PostgreSQL."""
    found: dict[tuple[str, datetime], tuple[int, str]] = {}
    wanted = set(keys)
    fingerprints = sorted({fp for fp, _ in keys})
    for start in range(0, len(fingerprints), 5000):
        query = (
            select(alerts.c.id, alerts.c.fingerprint, alerts.c.starts_at, alerts.c.status)
            .where(alerts.c.fingerprint.in_(fingerprints[start : start + 5000]))
            .order_by(alerts.c.id)
        )
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()
        for row in await conn.execute(query):
            key = (row.fingerprint, row.starts_at)
            if key in wanted:
                found[key] = (int(row.id), str(row.status))
    return found


def _occurrence_row(alert: Alert, receipt_id: int, at: datetime, status: str) -> dict[str, Any]:
    job = alert.job
    return {
        "fingerprint": alert.fingerprint,
        "starts_at": alert.starts_at,
        "alertname": alert.name,
        "status": status,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "ends_at": alert.ends_at,
        "generator_url": alert.generator_url,
        "job_namespace": job.namespace if job else alert.labels.get("namespace", ""),
        "job_name": job.name if job else "",
        "node": alert.node,
        "first_receipt_id": receipt_id,
        "created_at": at,
        "last_received_at": at,
        "resolved_at": (alert.ends_at or at) if status == AlertStatus.RESOLVED else None,
    }


async def _insert_new(
    conn: AsyncConnection, rows: list[dict[str, Any]]
) -> dict[tuple[str, datetime], int]:
    # executemany + RETURNING: SQLAlchemy batches it into multi-row INSERTs ("insertmanyvalues")
    # with one cached statement, instead of compiling a new statement per batch size.
    stmt = (
        dialect_insert(conn, alerts)
        .on_conflict_do_nothing(index_elements=[alerts.c.fingerprint, alerts.c.starts_at])
        .returning(alerts.c.id, alerts.c.fingerprint, alerts.c.starts_at)
    )
    result = await conn.execute(stmt, rows)
    return {(row.fingerprint, row.starts_at): int(row.id) for row in result}


async def record_receipts(
    conn: AsyncConnection, receipts: Sequence[IncomingReceipt]
) -> list[ReceiptOutcome]:
    """Stores receipts and their alerts; returns per receipt what changed. Caller commits."""
    outcomes: list[ReceiptOutcome] = []
    seen: dict[tuple[str, datetime], _Seen] = {}
    for index, receipt in enumerate(receipts):
        receipt_id, times = await _insert_receipt(conn, receipt)
        outcomes.append(ReceiptOutcome(receipt_id=receipt_id, times_received=times))
        for alert in receipt.alerts:
            key = (alert.fingerprint, alert.starts_at)
            entry = seen.get(key)
            if entry is None:
                seen[key] = _Seen(alert, [(alert.status, index, receipt.received_at)])
            else:
                entry.alert = alert
                entry.statuses.append((alert.status, index, receipt.received_at))
    if not seen:
        return outcomes

    keys = list(seen)
    existing = await _lock_existing(conn, keys)
    new_keys = [key for key in keys if key not in existing]
    if new_keys:
        rows = []
        for key in new_keys:
            entry = seen[key]
            status, index, at = entry.statuses[0]
            rows.append(_occurrence_row(entry.alert, outcomes[index].receipt_id, at, status))
            # the row is created with the first status; later statuses are applied below
        inserted = await _insert_new(conn, rows)
        lost_race = [key for key in new_keys if key not in inserted]
        if lost_race:  # another replica inserted them concurrently
            existing.update(await _lock_existing(conn, lost_race))
        for key, alert_id in inserted.items():
            status, index, at = seen[key].statuses[0]
            outcomes[index].new += 1
            outcomes[index].changes.append(
                AlertChange(alert_id, ChangeKind(status.value), seen[key].alert, at)
            )
            existing[key] = (alert_id, status.value)
    else:
        inserted = {}

    events: list[dict[str, Any]] = []
    seen_again: list[dict[str, Any]] = []
    status_changes: list[dict[str, Any]] = []
    for key, entry in seen.items():
        alert_id, current = existing[key]
        just_inserted = key in inserted
        statuses = entry.statuses[1:] if just_inserted else entry.statuses
        changed_at: datetime | None = None
        for status, index, at in statuses:
            if status.value == current:
                outcomes[index].unchanged += 1
                continue
            current = status.value
            changed_at = at
            outcomes[index].changed += 1
            outcomes[index].changes.append(
                AlertChange(alert_id, ChangeKind(status.value), entry.alert, at)
            )
        if just_inserted and len(entry.statuses) == 1:
            continue
        seen_again.append(
            {
                "b_id": alert_id,
                "b_ends_at": entry.alert.ends_at,
                "b_last": entry.statuses[-1][2],
                "b_annotations": dict(entry.alert.annotations),
            }
        )
        if changed_at is not None:
            resolved_at = (
                (entry.alert.ends_at or changed_at) if current == AlertStatus.RESOLVED else None
            )
            status_changes.append(
                {"b_id": alert_id, "b_status": current, "b_resolved": resolved_at}
            )
    for outcome in outcomes:
        for change in outcome.changes:
            events.append(
                {
                    "alert_id": change.alert_id,
                    "kind": change.kind.value,
                    "at": change.at,
                    "receipt_id": outcome.receipt_id,
                    "detail": None,
                }
            )
    if seen_again:
        await conn.execute(
            update(alerts)
            .where(alerts.c.id == bindparam("b_id"))
            .values(
                ends_at=bindparam("b_ends_at"),
                last_received_at=bindparam("b_last"),
                annotations=bindparam("b_annotations"),
            ),
            seen_again,
        )
    if status_changes:
        await conn.execute(
            update(alerts)
            .where(alerts.c.id == bindparam("b_id"))
            .values(status=bindparam("b_status"), resolved_at=bindparam("b_resolved")),
            status_changes,
        )
    if events:
        await conn.execute(alert_events.insert(), events)
    return outcomes


async def insert_notifications(
    conn: AsyncConnection, drafts: Sequence[NotificationDraft], now: datetime
) -> int:
    """Writes drafts to the outbox; a draft whose idempotency key exists is skipped."""
    if not drafts:
        return 0
    rows = [
        {
            "idempotency_key": draft.idempotency_key,
            "created_at": now,
            "channel": draft.channel,
            "kind": draft.kind,
            "priority": draft.priority.value,
            "alert_id": draft.alert_id,
            "group_key": draft.group_key,
            "reason": draft.reason,
            "payload": draft.payload,
            "status": "pending",
            "attempts": 0,
            # a held notification (e.g. a hang alert awaiting its diagnosis) waits until then
            "next_attempt_at": draft.extra.get("not_before", now),
        }
        for draft in drafts
    ]
    stmt = (
        dialect_insert(conn, notifications)
        .on_conflict_do_nothing(index_elements=[notifications.c.idempotency_key])
        .returning(notifications.c.id)
    )
    written = len((await conn.execute(stmt, rows)).all())
    return written


async def expire_stale(
    conn: AsyncConnection, now: datetime, quiet_for: float, limit: int = 1000
) -> list[AlertChange]:
    """Firing occurrences whose endsAt has passed and that no webhook mentioned for `quiet_for`
    seconds become resolved with an `expired` event (Alertmanager stopped sending them)."""
    from datetime import timedelta

    query = (
        select(alerts)
        .where(
            alerts.c.status == AlertStatus.FIRING.value,
            alerts.c.ends_at.is_not(None),
            alerts.c.ends_at < now,
            alerts.c.last_received_at < now - timedelta(seconds=quiet_for),
        )
        .order_by(alerts.c.id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    rows = (await conn.execute(query)).all()
    if not rows:
        return []
    await conn.execute(
        update(alerts)
        .where(alerts.c.id == bindparam("b_id"))
        .values(status=AlertStatus.RESOLVED.value, resolved_at=bindparam("b_resolved")),
        [{"b_id": row.id, "b_resolved": row.ends_at} for row in rows],
    )
    changes = [
        AlertChange(
            alert_id=int(row.id),
            kind=ChangeKind.EXPIRED,
            alert=Alert(
                fingerprint=row.fingerprint,
                status=AlertStatus.RESOLVED,
                labels=dict(row.labels),
                annotations=dict(row.annotations),
                starts_at=row.starts_at,
                ends_at=row.ends_at,
                generator_url=row.generator_url,
            ),
            at=now,
        )
        for row in rows
    ]
    await conn.execute(
        alert_events.insert(),
        [
            {
                "alert_id": c.alert_id,
                "kind": c.kind.value,
                "at": now,
                "receipt_id": None,
                "detail": {"reason": "endsAt passed, no webhook since"},
            }
            for c in changes
        ],
    )
    return changes
