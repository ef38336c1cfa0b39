"""The policy inbox: alert changes the intake committed and the alert policy has not handled.

The intake adds a row per recorded event in its transaction; the policy worker claims rows,
runs the policy and deletes them in one transaction, so each change is planned exactly once
whatever crashes in between. On PostgreSQL claimed rows are locked with SKIP LOCKED: replicas
share the inbox instead of waiting for each other.

Claims take the most urgent changes first: by the alert's `priority` label (every trainsentry
rule sets one), P0 before P1 and so on, then in event order. A P0 that arrives behind a storm
of 20,000 lesser alerts is planned in the next batch instead of after the backlog. All changes
of one fingerprint share its labels, hence one urgency, so each alert's changes are still
planned in the order they happened. The label is only a hint for the order: the policy's
classification still decides the priority (an XID in an unlabelled alert is P0 all the same,
just not planned early).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import (
    Alert,
    AlertChange,
    AlertStatus,
    ChangeKind,
    Priority,
    parse_priority,
)
from trainsentry.store.bulk import decode_json, decode_time, fetch
from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import alert_events, policy_inbox

# An alert's urgency is the level of its `priority` label (Priority.level: P0 = 0).
# Alerts without a readable label wait behind P0 and P1, ahead of P3.
UNLABELLED_URGENCY = Priority.P2.level


def urgency(labels: Mapping[str, str]) -> int:
    """The claim order of an alert's changes: 0 (labelled P0) to 3 (P3)."""
    label = labels.get("priority")
    parsed = parse_priority(label) if label is not None else None
    return parsed.level if parsed is not None else UNLABELLED_URGENCY


@dataclass(frozen=True, slots=True)
class Claimed:
    event_ids: list[int]
    changes: list[AlertChange]


# The change's Alertmanager group: the groupKey of the webhook that carried it (none for an
# expiry); incidents group by it (gateway/policy/incident.py).
_SELECT = (
    "SELECT i.event_id, e.kind, e.at, a.id, a.fingerprint, a.labels, a.annotations, "
    "a.starts_at, a.ends_at, a.generator_url, a.node, r.group_key "
    "FROM policy_inbox i JOIN alert_events e ON e.id = i.event_id "
    "JOIN alerts a ON a.id = e.alert_id "
    "LEFT JOIN webhook_receipts r ON r.id = e.receipt_id "
)
_ORDER = "ORDER BY i.urgency, i.event_id LIMIT ?"
# SQLite: one gateway, one policy transaction at a time (gateway/stages/planning/
# worker.py), batches in order.
_CLAIM_SQLITE = _SELECT + _ORDER
# PostgreSQL replicas claim side by side, skipping rows another replica holds. A change whose
# fingerprint has an earlier change still in the inbox (held by another replica, or not yet
# planned) waits, so no replica plans an alert's resolve before another has planned its firing.
_CLAIM_POSTGRESQL = (
    _SELECT + "WHERE NOT EXISTS (SELECT 1 FROM policy_inbox i2 "
    "JOIN alert_events e2 ON e2.id = i2.event_id JOIN alerts a2 ON a2.id = e2.alert_id "
    "WHERE a2.fingerprint = a.fingerprint AND i2.event_id < i.event_id) "
    + _ORDER
    + " FOR UPDATE OF i SKIP LOCKED"
)


async def claim_inbox(conn: AsyncConnection, limit: int) -> Claimed:
    """The `limit` most urgent waiting changes (oldest first within an urgency), locked for
    this transaction. On PostgreSQL at most the oldest waiting change per fingerprint."""
    sql = _CLAIM_SQLITE if is_sqlite(conn) else _CLAIM_POSTGRESQL
    # Read through the driver (bulk.decode_*): this runs once per alert change.
    rows = await fetch(conn, sql, (limit,))
    event_ids: list[int] = []
    changes: list[AlertChange] = []
    for row in rows:
        event_id, kind_text, at, alert_id, fp, labels, notes, starts, ends, url, node, group = row
        kind = ChangeKind(kind_text)
        # The occurrence as stored now; its status is the one this change moved it to.
        status = AlertStatus.FIRING if kind is ChangeKind.FIRING else AlertStatus.RESOLVED
        alert = Alert(
            fingerprint=fp,
            status=status,
            labels=decode_json(labels),
            annotations=decode_json(notes),
            starts_at=decode_time(starts),
            ends_at=decode_time(ends) if ends is not None else None,
            generator_url=url,
            resolved_node=node,  # as the store resolved it (store/writes.py)
        )
        event_ids.append(int(event_id))
        change = AlertChange(int(alert_id), kind, alert, decode_time(at), group or "")
        changes.append(change)
    return Claimed(event_ids, changes)


async def clear_inbox(conn: AsyncConnection, event_ids: list[int]) -> None:
    for start in range(0, len(event_ids), 5000):
        chunk = event_ids[start : start + 5000]
        marks = ",".join("?" * len(chunk))
        await fetch(conn, f"DELETE FROM policy_inbox WHERE event_id IN ({marks})", chunk)


async def inbox_holds(conn: AsyncConnection, count: int) -> bool:
    """Whether at least `count` changes wait for the policy (reads at most `count` rows)."""
    sql = "SELECT count(*) FROM (SELECT 1 FROM policy_inbox LIMIT ?) AS waiting"
    ((found,),) = await fetch(conn, sql, (count,))
    return int(found) >= count


@dataclass(frozen=True, slots=True)
class Waiting:
    """The changes of one urgency waiting for the policy."""

    urgency: int
    count: int
    oldest_at: datetime  # when the intake stored the oldest of them


async def inbox_waiting(conn: AsyncConnection) -> list[Waiting]:
    """What waits in the inbox, per urgency (only urgencies with waiting changes)."""
    query = (
        select(policy_inbox.c.urgency, func.count(), func.min(alert_events.c.at))
        .select_from(policy_inbox.join(alert_events, alert_events.c.id == policy_inbox.c.event_id))
        .group_by(policy_inbox.c.urgency)
        .order_by(policy_inbox.c.urgency)
    )
    return [Waiting(int(u), int(n), at) for u, n, at in await conn.execute(query)]
