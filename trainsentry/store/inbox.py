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

**Partitions** (PostgreSQL replicas, issue 46). Each row carries its alert's planning
partition (`partition_of`): the alert's job (`alerts.job_key`: its TrainingJob, else its
scrape job), else, for a cluster-wide alert, its node, else "cluster". Why the job: the
state a change's planning loads and locks (`FOR UPDATE`) is keyed by it — the job's storm
state (one per `job_key`), its incidents (grouped per job and alertname, or per
Alertmanager group, which the shipped route cuts by `trainingjob`), its failure-domain
entry (`job=`) — besides the fingerprint's own state, which any key derived from the labels
keeps in one partition. A cluster-wide alert has no job; its incident and failure domain
are its node's. So two replicas planning different partitions rarely wait for each other's
row locks, where two claiming a storm's rows side by side (250 rows spread over every job)
each locked every job's storm state and ran one after the other.

A claim first looks at the head of the inbox (the `4 * limit` most urgent rows), takes a
transaction-scoped advisory lock (`pg_try_advisory_xact_lock`) on its partitions in the
order of their most urgent row, skipping those another replica holds, until the partitions
held have `limit` rows there, and claims only rows of those, most urgent first. Invariants:
- a partition is planned by one replica at a time (the lock lasts the planning transaction);
- a P0 waits for another replica's partition at most one batch: it heads the inbox, so the
  next claim after that batch's commit (by any replica) takes its partition first;
- the partition is a hint for who plans what, never for correctness: row locks still guard
  every state, a hash collision only merges two partitions, and rows written before the
  column (version 15) are all partition 0.
SQLite (one process, one policy transaction at a time) ignores the column.
"""

from __future__ import annotations

import zlib
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
    job_key,
    parse_priority,
)
from trainsentry.labels import node_of
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


# The advisory-lock class of planning partitions (the migration lock is 7412001, the
# expander's 7412002).
_PARTITION_LOCK = 7412003


def partition_key(labels: Mapping[str, str]) -> str:
    """Pure: the planning partition an alert's changes go to: its job's `job_key`, else
    "node:<node>" for a cluster-wide alert on a node, else "cluster" (module docstring)."""
    key = job_key(labels)
    if key == "cluster" and (node := node_of(labels)):
        return f"node:{node}"
    return key


def partition_of(labels: Mapping[str, str]) -> int:
    """Pure: `partition_key` as the inbox stores it, a signed 32-bit hash (the advisory
    lock's key). Stable across processes and versions (CRC-32)."""
    return zlib.crc32(partition_key(labels).encode("utf-8")) - 2**31


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
# PostgreSQL: the partitions at the head of the inbox, most urgent first, with their rows
# there (`claim_inbox`).
_HEAD_POSTGRESQL = (
    "SELECT part, count(*) FROM (SELECT part, urgency, event_id FROM policy_inbox "
    "ORDER BY urgency, event_id LIMIT ?) AS head GROUP BY part "
    "ORDER BY min(urgency), min(event_id)"
)
# Tries the locks of several partitions in one round trip (their numbers inlined: integers
# the head query returned); answers the partitions taken.
_TRY_PARTITIONS = (
    "SELECT p FROM (VALUES {}) AS candidate(p) "
    f"WHERE pg_try_advisory_xact_lock({_PARTITION_LOCK}, p)"
)
# How far down the inbox a claim looks for partitions, in batches.
_HEAD_BATCHES = 4
# PostgreSQL replicas claim side by side, each in the partitions it holds, skipping rows
# another replica holds. A change whose fingerprint has an earlier change still in the inbox
# (held by another replica, or not yet planned) waits, so no replica plans an alert's resolve
# before another has planned its firing.
_CLAIM_POSTGRESQL = (
    _SELECT + "WHERE i.part IN ({}) AND NOT EXISTS (SELECT 1 FROM policy_inbox i2 "
    "JOIN alert_events e2 ON e2.id = i2.event_id JOIN alerts a2 ON a2.id = e2.alert_id "
    "WHERE a2.fingerprint = a.fingerprint AND i2.event_id < i.event_id) "
    + _ORDER
    + " FOR UPDATE OF i SKIP LOCKED"
)


async def _hold_partitions(conn: AsyncConnection, limit: int) -> list[int]:
    """The partitions this transaction now holds (advisory locks), taken at the head of the
    inbox in the order of their most urgent row until they have `limit` rows there; those
    another replica holds are skipped. Each round trip tries the fewest next partitions
    that would complete the batch (a storm of single-alert partitions, a node each, takes
    one or two, not one per partition)."""
    head = [
        (int(p), int(n)) for p, n in await fetch(conn, _HEAD_POSTGRESQL, (_HEAD_BATCHES * limit,))
    ]
    held: list[int] = []
    rows_held = 0
    rows_of = dict(head)
    start = 0
    while start < len(head) and rows_held < limit:
        end, wanted = start, 0
        while end < len(head) and rows_held + wanted < limit:
            wanted += head[end][1]
            end += 1
        values = ",".join(f"({part})" for part, _ in head[start:end])
        for (part,) in await fetch(conn, _TRY_PARTITIONS.format(values)):
            held.append(int(part))
            rows_held += rows_of[int(part)]
        start = end
    return held


async def claim_inbox(conn: AsyncConnection, limit: int) -> Claimed:
    """The `limit` most urgent waiting changes (oldest first within an urgency), locked for
    this transaction. On PostgreSQL only changes of the partitions this transaction holds
    (`_hold_partitions`), and at most the oldest waiting change per fingerprint."""
    if is_sqlite(conn):
        sql = _CLAIM_SQLITE
    else:
        held = await _hold_partitions(conn, limit)
        if not held:
            return Claimed([], [])
        sql = _CLAIM_POSTGRESQL.format(",".join(str(part) for part in held))
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
