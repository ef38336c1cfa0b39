"""The intake journal: webhooks answered once their receipt is stored, recorded right after.

Journal-first intake (issue 46). While the gateway is busy, the intake's transaction stores
each webhook's receipt (its body as received, with its group's digest) and a journal row,
commits (on disk: SQLite `synchronous=FULL`), and answers; the expander
(gateway/stages/expansion.py) then records the journaled alerts — occurrences, events, policy
inbox rows — from the stored receipt, in bounded transactions. So the guarantee of a 200 is
"on disk, and recorded and planned after any restart", not "in the alerts table at once".

What waits: per arrival of a body (a replay is a new arrival), its alerts other than the
urgent ones (`is_urgent`: the `priority` label as the policy inbox reads it, P0 or P1;
unlabelled alerts count as P2 there and here). A body's urgent alerts are recorded in the
answered transaction itself, so a P0 or P1 behind a storm is in the inbox, most urgent first,
when its 200 is sent, exactly as without the journal. An alert's repeats carry the same
labels, hence the same urgency: every status of one occurrence takes the same path, in order.

Invariants:
- Exactly once: a row's alerts are recorded and the row deleted in one transaction; recording
  is idempotent anyway (store/writes.py `expand_steps`: only a real status change is an event).
- In order: rows are expanded oldest first, one expander at a time (on PostgreSQL a
  transaction-scoped advisory lock; on SQLite the gateway's one process). The intake records
  a group's alerts in its own transaction only when the group has no row waiting
  (`groups_waiting`), so a group's webhooks are applied in the order they arrived.
- A group's digest (store/resends.py) is written with the receipt, in the transaction that
  records its changes or journals them; the journal is expanded before anything later of the
  group is recorded, so a digest found means its changes are stored or queued ahead of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Alert, Priority
from trainsentry.labels import NODE_LABELS
from trainsentry.store.bulk import (
    Encoder,
    Fetch,
    Steps,
    decode_time,
    encoder,
    fetch,
    insert_steps,
    run_steps,
)
from trainsentry.store.inbox import urgency
from trainsentry.store.writes import (
    Expansion,
    IncomingReceipt,
    ReceiptOutcome,
    expand_steps,
    group_row_key,
    store_receipts_steps,
)

# Alerts of this urgency or more urgent are never journaled (store/inbox.py `urgency`).
URGENT_LEVEL = Priority.P1.level
# One expander at a time across PostgreSQL replicas (the migration lock is 7412001).
_EXPANDER_LOCK = 7412002

_COLUMNS = ("receipt_id", "group_hash", "alert_count", "received_at")


def is_urgent(alert: Alert) -> bool:
    """Pure: whether the intake records `alert` before its answer whatever the load."""
    return urgency(alert.labels) <= URGENT_LEVEL


def deferred(alerts: Sequence[Alert]) -> list[Alert]:
    """Pure: the alerts of a body that a journal row of it stands for, in body order."""
    return [alert for alert in alerts if not is_urgent(alert)]


async def journal_receipts(
    conn: AsyncConnection,
    receipts: Sequence[IncomingReceipt],
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> list[ReceiptOutcome]:
    """Stores the receipts, records their urgent alerts, journals the rest (one row per
    receipt that has any; `ReceiptOutcome.queued`). Caller commits."""
    steps = journal_receipts_steps(receipts, encoder(conn), node_labels)
    return await run_steps(conn, steps)


def journal_receipts_steps(
    receipts: Sequence[IncomingReceipt],
    enc: Encoder,
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> Steps[list[ReceiptOutcome]]:
    """`journal_receipts` as statements (bulk.run_steps)."""
    outcomes = yield from store_receipts_steps(receipts, enc)
    now: list[Expansion] = []
    rows = []
    for receipt, outcome in zip(receipts, outcomes, strict=True):
        urgent = [alert for alert in receipt.alerts if is_urgent(alert)]
        if urgent:
            now.append(Expansion(outcome, receipt.received_at, urgent))
        outcome.queued = len(receipt.alerts) - len(urgent)
        if outcome.queued:
            group = group_row_key(receipt.group_key)
            at = enc.time(receipt.received_at)
            rows.append((outcome.receipt_id, group, outcome.queued, at))
    yield from expand_steps(now, enc, node_labels)
    if rows:
        yield from insert_steps("intake_journal", _COLUMNS, rows)
    return outcomes


async def groups_waiting(conn: AsyncConnection, group_keys: Sequence[str]) -> bool:
    """Whether any of these Alertmanager groups (`groupKey`s) has a journal row waiting: then
    their webhooks must be journaled behind it, not recorded ahead of it."""
    hashes = sorted({group_row_key(key) for key in group_keys})
    if not hashes:
        return False
    marks = ",".join("?" * len(hashes))
    sql = f"SELECT 1 FROM intake_journal WHERE group_hash IN ({marks}) LIMIT 1"
    return bool(await fetch(conn, sql, hashes))


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal row: the deferred alerts (`deferred`) of receipt `receipt_id`'s body, as
    they arrived at `received_at`."""

    id: int
    receipt_id: int
    alert_count: int
    received_at: datetime


_CLAIM = "SELECT id, receipt_id, alert_count, received_at FROM intake_journal ORDER BY id LIMIT ?"


async def claim_journal(conn: AsyncConnection, rows: int) -> list[JournalEntry] | None:
    """The oldest `rows` journal rows, for this transaction to expand; None on PostgreSQL
    while another replica's expander holds the journal (it expands them)."""
    if not encoder(conn).sqlite:
        ((taken,),) = await fetch(conn, f"SELECT pg_try_advisory_xact_lock({_EXPANDER_LOCK})")
        if not taken:
            return None
    found = await fetch(conn, _CLAIM, (rows,))
    return [
        JournalEntry(int(row_id), int(receipt_id), int(count), decode_time(at))
        for row_id, receipt_id, count, at in found
    ]


async def receipt_bodies(conn: AsyncConnection, receipt_ids: Sequence[int]) -> dict[int, str]:
    """The stored bodies of these receipts (to expand journal rows after a restart)."""
    wanted = sorted(set(receipt_ids))
    if not wanted:
        return {}
    marks = ",".join("?" * len(wanted))
    sql = f"SELECT id, body FROM webhook_receipts WHERE id IN ({marks})"
    return {int(receipt_id): str(body) for receipt_id, body in await fetch(conn, sql, wanted)}


async def expand_journal(
    conn: AsyncConnection,
    entries: Sequence[tuple[JournalEntry, Sequence[Alert]]],
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> tuple[list[ReceiptOutcome], int]:
    """Records each claimed entry's alerts (its receipt's `deferred` alerts; none for a body
    that can no longer be read) and deletes the entries, in the caller's transaction. Returns
    an outcome per entry (`times_received` 0: not an arrival) and the alerts still waiting."""
    steps = expand_journal_steps(entries, encoder(conn), node_labels)
    return await run_steps(conn, steps)


_LEFT = "SELECT coalesce(sum(alert_count), 0) FROM intake_journal"


def expand_journal_steps(
    entries: Sequence[tuple[JournalEntry, Sequence[Alert]]],
    enc: Encoder,
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> Steps[tuple[list[ReceiptOutcome], int]]:
    """`expand_journal` as statements (bulk.run_steps)."""
    parts = [
        Expansion(ReceiptOutcome(entry.receipt_id, 0), entry.received_at, alerts)
        for entry, alerts in entries
    ]
    yield from expand_steps(parts, enc, node_labels)
    ids = [entry.id for entry, _ in entries]
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        marks = ",".join("?" * len(chunk))
        yield Fetch(f"DELETE FROM intake_journal WHERE id IN ({marks})", chunk)
    ((left,),) = yield Fetch(_LEFT)
    return [part.outcome for part in parts], int(left)


@dataclass(frozen=True, slots=True)
class JournalWaiting:
    """What waits in the journal."""

    rows: int
    alerts: int
    oldest_at: datetime | None  # when the oldest waiting webhook arrived


async def journal_waiting(conn: AsyncConnection) -> JournalWaiting:
    """Rows and alerts waiting in the journal, and the oldest arrival among them."""
    sql = "SELECT count(*), coalesce(sum(alert_count), 0), min(received_at) FROM intake_journal"
    ((rows, alerts, oldest),) = await fetch(conn, sql)
    return JournalWaiting(int(rows), int(alerts), decode_time(oldest) if oldest else None)
