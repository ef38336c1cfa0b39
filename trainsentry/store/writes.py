"""Writing webhook receipts and alert occurrences: the one place that turns received alerts into
stored state changes. Runs inside the caller's transaction. Every change is recorded as an
event and queued in the policy inbox, which the policy worker empties after the commit. Each
receipt's group keeps a digest of its content (`webhook_groups`, store/resends.py).

Replays are harmless: an occurrence is keyed by (fingerprint, startsAt) and only a real status
change adds an event. With several gateway replicas on PostgreSQL, existing rows are locked
(`FOR UPDATE`, in id order) before their status is compared, and a concurrent insert of the same
occurrence is detected by `ON CONFLICT DO NOTHING` and re-read, so each change is recorded once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Alert, AlertChange, AlertStatus, ChangeKind, NotificationDraft
from trainsentry.labels import NODE_LABELS, job_name_of, node_of
from trainsentry.store.bulk import (
    Encoder,
    Fetch,
    Steps,
    encoder,
    insert_returning_steps,
    insert_steps,
    run_steps,
    update_steps,
)
from trainsentry.store.dialect import is_sqlite
from trainsentry.store.inbox import partition_of, urgency
from trainsentry.store.schema import (
    alert_events,
    alerts,
)


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
    # What the group holds (gateway/stages/intake.py `content_digest`; "" = not known, e.g. a
    # truncated list), and whether every alert fires without endsAt, so that an unchanged
    # resend of it may be answered from the store alone (store/resends.py).
    content_digest: str = ""
    skippable: bool = False


@dataclass(slots=True)
class ReceiptOutcome:
    receipt_id: int
    times_received: int
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    changes: list[AlertChange] = field(default_factory=list)
    # an unchanged resend of its group, answered from the store without a write
    resend: bool = False
    # alerts journaled, recorded after the answer (store/journal.py); `new`, `changed` and
    # `unchanged` count the others
    queued: int = 0


_RECEIPT_COLUMNS = (
    "body_sha256",
    "received_at",
    "last_received_at",
    "times_received",
    "receiver",
    "status",
    "group_key",
    "truncated_alerts",
    "alert_count",
    "external_url",
    "body",
)
_RECEIPT_UPSERT = (
    "ON CONFLICT (body_sha256) DO UPDATE SET "
    "times_received = webhook_receipts.times_received + 1, "
    "last_received_at = excluded.last_received_at "
    "RETURNING id, times_received"
)


def _receipt_steps(receipt: IncomingReceipt, enc: Encoder) -> Steps[tuple[int, int]]:
    at = enc.time(receipt.received_at)
    row = (
        receipt.body_sha256,
        at,
        at,
        1,
        receipt.receiver,
        receipt.status,
        receipt.group_key,
        receipt.truncated_alerts,
        len(receipt.alerts),
        receipt.external_url,
        receipt.body_text,
    )
    ((receipt_id, times),) = yield from insert_steps(
        "webhook_receipts", _RECEIPT_COLUMNS, [row], tail=_RECEIPT_UPSERT
    )
    return int(receipt_id), int(times)


# An occurrence as the store keys it: (fingerprint, starts_at as the driver stores it).
Key = tuple[str, Any]


@dataclass(slots=True)
class _Seen:
    """Everything a batch says about one occurrence, in arrival order."""

    alert: Alert  # the latest version received
    statuses: list[tuple[AlertStatus, int, datetime]]  # (status, receipt index, received_at)


_EXISTING_SQL = "SELECT id, fingerprint, starts_at, status FROM alerts WHERE fingerprint IN ({})"
_EXISTING_PACKED_SQL = (
    "SELECT json_group_array(json_array(id, fingerprint, starts_at, status)) FROM alerts "
    "WHERE fingerprint IN ({})"
)


def _lock_existing_steps(
    keys: Sequence[Key], postgresql: bool
) -> Steps[dict[Key, tuple[int, str]]]:
    """Existing occurrences among `keys` → (id, status); on PostgreSQL locked in id order, on
    SQLite (the writer holds the database lock) read as one aggregate row (bulk.py)."""
    found: dict[Key, tuple[int, str]] = {}
    wanted = set(keys)
    fingerprints = sorted({fp for fp, _ in keys})
    for start in range(0, len(fingerprints), 5000):
        chunk = fingerprints[start : start + 5000]
        marks = ",".join("?" * len(chunk))
        if postgresql:
            rows = yield Fetch(_EXISTING_SQL.format(marks) + " ORDER BY id FOR UPDATE", chunk)
        else:
            ((packed,),) = yield Fetch(_EXISTING_PACKED_SQL.format(marks), chunk)
            rows = orjson.loads(packed)
        for alert_id, fingerprint, starts_at, status in rows:
            key = (fingerprint, starts_at)
            if key in wanted:
                found[key] = (int(alert_id), str(status))
    return found


_ALERT_COLUMNS = (
    "fingerprint",
    "starts_at",
    "alertname",
    "status",
    "labels",
    "annotations",
    "ends_at",
    "generator_url",
    "job_namespace",
    "job_name",
    "node",
    "first_receipt_id",
    "created_at",
    "last_received_at",
    "resolved_at",
)
_ALERT_CONFLICT = "ON CONFLICT (fingerprint, starts_at) DO NOTHING"


def _occurrence_row(
    alert: Alert,
    starts_at: Any,
    receipt_id: int,
    at: datetime,
    status: str,
    enc: Encoder,
    node_labels: tuple[str, ...],
) -> tuple[Any, ...]:
    """The new occurrence's row. Its `node` is resolved here, once, by the policy's
    `node_labels`: every reader of the store (the policy, cordon, the console, the blast
    radius) takes the node from this column, never again from the labels."""
    labels = alert.labels
    received = enc.time(at)
    resolved = enc.time(alert.ends_at or at) if status == AlertStatus.RESOLVED else None
    return (
        alert.fingerprint,
        starts_at,
        labels.get("alertname", ""),
        status,
        enc.json(labels),
        enc.json(alert.annotations),
        enc.time(alert.ends_at),
        alert.generator_url,
        labels.get("namespace", ""),
        job_name_of(labels),
        node_of(labels, node_labels),
        receipt_id,
        received,
        received,
        resolved,
    )


_CHANGE_KIND = {status: ChangeKind(status.value) for status in AlertStatus}


def group_row_key(group_key: str) -> str:
    """Pure: the `webhook_groups` key of a group: the SHA-256 of its `groupKey` (fixed size,
    whatever the key's length)."""
    return hashlib.sha256(group_key.encode()).hexdigest()


_GROUP_COLUMNS = ("key", "digest", "receipt_id", "updated_at")
_GROUP_UPSERT = (
    "ON CONFLICT (key) DO UPDATE SET digest = excluded.digest, "
    "receipt_id = excluded.receipt_id, updated_at = excluded.updated_at"
)


def _group_steps(
    receipts: Sequence[IncomingReceipt], outcomes: Sequence[ReceiptOutcome], enc: Encoder
) -> Steps[None]:
    """Each receipt's group now holds that receipt's content (store/resends.py); the last
    receipt of a group in the batch wins (its statuses were applied last). Rows go in key
    order, so PostgreSQL replicas writing the same groups lock them in one order."""
    latest: dict[str, tuple[Any, ...]] = {}
    for receipt, outcome in zip(receipts, outcomes, strict=True):
        key = group_row_key(receipt.group_key)
        at = enc.time(receipt.received_at)
        latest[key] = (key, receipt.content_digest, outcome.receipt_id, at)
    rows = [latest[key] for key in sorted(latest)]
    if rows:
        yield from insert_steps("webhook_groups", _GROUP_COLUMNS, rows, tail=_GROUP_UPSERT)


async def record_receipts(
    conn: AsyncConnection,
    receipts: Sequence[IncomingReceipt],
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> list[ReceiptOutcome]:
    """Stores receipts and their alerts; returns per receipt what changed. Caller commits.
    `node_labels`: the policy's, which name each new occurrence's node (`_occurrence_row`)."""
    return await run_steps(conn, record_receipts_steps(receipts, encoder(conn), node_labels))


def record_receipts_steps(
    receipts: Sequence[IncomingReceipt],
    enc: Encoder,
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> Steps[list[ReceiptOutcome]]:
    """`record_receipts` as statements (bulk.run_steps): on SQLite all of it runs on the
    driver's thread while the event loop goes on parsing webhooks. The receipts and their
    groups' digests (`store_receipts_steps`), then every alert of them (`expand_steps`)."""
    outcomes = yield from store_receipts_steps(receipts, enc)
    parts = [
        Expansion(outcome, receipt.received_at, receipt.alerts)
        for receipt, outcome in zip(receipts, outcomes, strict=True)
    ]
    yield from expand_steps(parts, enc, node_labels)
    return outcomes


def store_receipts_steps(
    receipts: Sequence[IncomingReceipt], enc: Encoder
) -> Steps[list[ReceiptOutcome]]:
    """The receipts (a body stored before counts one more receipt of it) and each one's group
    digest; an outcome per receipt, to count the changes its alerts make."""
    outcomes: list[ReceiptOutcome] = []
    for receipt in receipts:
        receipt_id, times = yield from _receipt_steps(receipt, enc)
        outcomes.append(ReceiptOutcome(receipt_id=receipt_id, times_received=times))
    # the digest goes with the changes its content makes (or with the journal row that
    # makes them, store/journal.py), never ahead of them
    yield from _group_steps(receipts, outcomes, enc)
    return outcomes


@dataclass(slots=True)
class Expansion:
    """Alerts of one stored receipt to record, received at `received_at`; what they change
    is counted in `outcome` (whose `receipt_id` is the receipt's)."""

    outcome: ReceiptOutcome
    received_at: datetime
    alerts: Sequence[Alert]


def expand_steps(
    parts: Sequence[Expansion], enc: Encoder, node_labels: tuple[str, ...] = NODE_LABELS
) -> Steps[None]:
    """Records the parts' alerts in the parts' order: each occurrence seen with its statuses
    in order; new occurrences inserted with their first status; every status after it
    applied; one event and one policy inbox row per change. Idempotent: a part recorded
    twice changes nothing the second time (only a real status change is an event)."""
    seen: dict[Key, _Seen] = {}
    for index, part in enumerate(parts):
        at = part.received_at
        for alert in part.alerts:
            key = (alert.fingerprint, enc.time(alert.starts_at))
            entry = seen.get(key)
            if entry is None:
                seen[key] = _Seen(alert, [(alert.status, index, at)])
            else:
                entry.alert = alert
                entry.statuses.append((alert.status, index, at))
    if not seen:
        return
    outcomes = [part.outcome for part in parts]
    existing = yield from _lock_existing_steps(list(seen), postgresql=not enc.sqlite)
    inserted = yield from _insert_occurrences_steps(seen, existing, outcomes, enc, node_labels)
    yield from _apply_statuses_steps(seen, existing, inserted, outcomes, enc)
    yield from _event_steps(outcomes, enc)


def _insert_occurrences_steps(
    seen: dict[Key, _Seen],
    existing: dict[Key, tuple[int, str]],
    outcomes: list[ReceiptOutcome],
    enc: Encoder,
    node_labels: tuple[str, ...],
) -> Steps[dict[Key, int]]:
    """Inserts the occurrences not in `existing`, each with its first status, and adds them
    to `existing` (also those another replica inserted meanwhile) and their change to the
    outcome of the receipt that brought them. Returns the ids of those inserted here."""
    new_keys = [key for key in seen if key not in existing]
    if not new_keys:
        return {}
    rows = []
    for key in new_keys:
        entry = seen[key]
        status, index, at = entry.statuses[0]
        receipt_id = outcomes[index].receipt_id
        row = _occurrence_row(entry.alert, key[1], receipt_id, at, status, enc, node_labels)
        rows.append(row)
        # the row is created with the first status; later statuses are applied after it
    returned = yield from insert_returning_steps(
        "alerts",
        _ALERT_COLUMNS,
        rows,
        returning=("id", "fingerprint", "starts_at"),
        conflict=_ALERT_CONFLICT,
        sqlite=enc.sqlite,
    )
    inserted = {(fp, starts_at): int(alert_id) for alert_id, fp, starts_at in returned}
    lost_race = [key for key in new_keys if key not in inserted]
    if lost_race:  # another replica inserted them concurrently
        existing.update((yield from _lock_existing_steps(lost_race, not enc.sqlite)))
    for key, alert_id in inserted.items():
        entry = seen[key]
        status, index, at = entry.statuses[0]
        outcomes[index].new += 1
        outcomes[index].changes.append(AlertChange(alert_id, _CHANGE_KIND[status], entry.alert, at))
        existing[key] = (alert_id, status.value)
    return inserted


def _apply_statuses_steps(
    seen: dict[Key, _Seen],
    existing: dict[Key, tuple[int, str]],
    inserted: dict[Key, int],
    outcomes: list[ReceiptOutcome],
    enc: Encoder,
) -> Steps[None]:
    """Each occurrence's statuses in order (after the first, for one just inserted): a
    status other than the one before it is a change of its receipt, the same one is counted
    unchanged; the row gets its last sight and, if it changed, its last status."""
    seen_again: list[tuple[Any, ...]] = []
    status_changes: list[tuple[Any, ...]] = []
    for key, entry in seen.items():
        alert_id, current = existing[key]
        just_inserted = key in inserted
        if just_inserted and len(entry.statuses) == 1:
            continue
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
                AlertChange(alert_id, _CHANGE_KIND[status], entry.alert, at)
            )
        seen_again.append(
            (
                enc.time(entry.alert.ends_at),
                enc.time(entry.statuses[-1][2]),
                enc.json(entry.alert.annotations),
                alert_id,
            )
        )
        if changed_at is not None:
            resolved_at = (
                (entry.alert.ends_at or changed_at) if current == AlertStatus.RESOLVED else None
            )
            status_changes.append((current, enc.time(resolved_at), alert_id))
    seen_columns = ("ends_at", "last_received_at", "annotations")
    yield from update_steps("alerts", seen_columns, "id", seen_again, sqlite=enc.sqlite)
    status_columns = ("status", "resolved_at")
    yield from update_steps("alerts", status_columns, "id", status_changes, sqlite=enc.sqlite)


def _event_steps(outcomes: list[ReceiptOutcome], enc: Encoder) -> Steps[None]:
    """One alert event per change, and one policy inbox row per event with the urgency and
    the planning partition of its alert: every change waits in the inbox until the policy
    has handled it."""
    # An occurrence's changes share its labels, hence one urgency and one partition
    # (store/inbox.py).
    events: list[tuple[Any, ...]] = []
    # alert id -> (urgency, planning partition) of its changes
    claim_keys: dict[int, tuple[int, int]] = {}
    for outcome in outcomes:
        for change in outcome.changes:
            events.append(
                (change.alert_id, change.kind.value, enc.time(change.at), outcome.receipt_id)
            )
            if change.alert_id not in claim_keys:
                labels = change.alert.labels
                claim_keys[change.alert_id] = (urgency(labels), partition_of(labels))
    if not events:
        return
    columns = ("alert_id", "kind", "at", "receipt_id")
    returned = yield from insert_returning_steps(
        "alert_events", columns, events, returning=("id", "alert_id"), sqlite=enc.sqlite
    )
    inbox = [(event_id, *claim_keys[alert_id]) for event_id, alert_id in returned]
    yield from insert_steps("policy_inbox", ("event_id", "urgency", "part"), inbox)


_NOTIFICATION_COLUMNS = (
    "idempotency_key",
    "created_at",
    "channel",
    "kind",
    "priority",
    "alert_id",
    "group_key",
    "reason",
    "payload",
    "status",
    "attempts",
    "next_attempt_at",
)


async def insert_notifications(
    conn: AsyncConnection, drafts: Sequence[NotificationDraft], now: datetime
) -> int:
    """Writes drafts to the outbox; a draft whose idempotency key exists is skipped.
    Returns the rows written."""
    return len(await insert_new_notifications(conn, drafts, now))


async def insert_new_notifications(
    conn: AsyncConnection, drafts: Sequence[NotificationDraft], now: datetime
) -> list[str]:
    """Writes drafts to the outbox; a draft whose idempotency key exists is skipped.
    Returns the idempotency keys of the rows written."""
    if not drafts:
        return []
    enc = encoder(conn)
    created = enc.time(now)
    rows = [
        (
            draft.idempotency_key,
            created,
            draft.channel,
            draft.kind,
            draft.priority.value,
            draft.alert_id,
            draft.group_key,
            draft.reason,
            enc.json(draft.payload),
            # "cancelled": recorded but never sent (the resolution of a page never sent)
            draft.extra.get("status", "pending"),
            0,
            # a held notification (e.g. a hang alert awaiting its diagnosis) waits until then
            enc.time(draft.extra.get("not_before", now)),
        )
        for draft in drafts
    ]
    returned = await run_steps(
        conn,
        insert_returning_steps(
            "notifications",
            _NOTIFICATION_COLUMNS,
            rows,
            returning=("idempotency_key",),
            conflict="ON CONFLICT (idempotency_key) DO NOTHING",
            sqlite=enc.sqlite,
        ),
    )
    return [row[0] for row in returned]


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
    if not is_sqlite(conn):
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
                resolved_node=row.node,  # as recorded when it was stored
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
