"""Unchanged resends: recognising an Alertmanager group re-sent as it was, without a write.

Alertmanager re-sends every alert of a group each `repeat_interval` (and a peer of an HA pair,
or a retry, sends the same notification again). The intake keeps, per group (`groupKey`), a
digest of the content it last recorded (`webhook_groups`), written by `record_receipts`
(store/writes.py) in the same transaction as the alerts, their events and their policy inbox
rows.

`known_resend` answers a webhook from the store alone when all of these hold:
- the body is byte-identical to a stored receipt (so the body itself is kept already);
- the group's row holds this body's content digest (nothing newer was recorded for the
  group; a late replay of an older body is recorded as before);
- the content is skippable (`IncomingReceipt.skippable`: the whole list, every alert firing
  without endsAt), and every one of its occurrences is stored and firing now (so neither an
  expiry, nor another group, nor the retention changed them since).
Then recording the body would add no occurrence, no event and no inbox row, and write back
what the rows hold (the digest covers endsAt and annotations): skipping it loses nothing.
What it would still have written are counters: the receipt's `times_received` and
`last_received_at`, which the caller adds up (`ReceiptTouch`) and writes later with the next
intake transaction (`touch_receipts_steps`), and the alerts' `last_received_at`, which only the
stale-alert sweep reads, and only for alerts with an endsAt.

Invariant: a group's digest is only ever written together with the changes its content
made (never ahead of them), so a digest found in the store means those changes are stored
and queued (planned after any restart): a resend answered from it cannot lose one.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from trainsentry.alerts import Alert, AlertStatus
from trainsentry.store.bulk import (
    Encoder,
    ExecuteMany,
    Fetch,
    Steps,
    encoder,
    run_steps,
)
from trainsentry.store.writes import IncomingReceipt, group_row_key

_OCCURRENCE = operator.itemgetter(0, 1)


def content_digest(alerts: Sequence[Alert]) -> str:
    """Pure: a digest of what a webhook says about its alerts — each one's fingerprint,
    startsAt, status, endsAt, labels, annotations and generatorURL, times as stored (UTC,
    milliseconds). The alerts' order does not count, except among repeats of one occurrence
    (the store applies those in order). Two bodies with one digest record the same."""
    items = sorted(
        (
            (
                alert.fingerprint,
                alert.starts_at,
                alert.status.value,
                alert.ends_at,
                alert.labels,
                alert.annotations,
                alert.generator_url,
            )
            for alert in alerts
        ),
        key=_OCCURRENCE,  # stable: repeats of an occurrence keep their order
    )
    # orjson writes aware datetimes as RFC 3339 (UTC here) and sorts every mapping's keys
    encoded = orjson.dumps(items, default=dict, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(encoded).hexdigest()


def skippable(alerts: Sequence[Alert], truncated: int) -> bool:
    """Pure: whether a resend of this content may be answered without a write when its group
    is unchanged: the whole list (not truncated), every alert firing without endsAt (as
    Alertmanager sends a firing alert). The stale-alert sweep never looks at such alerts, so
    not advancing their `last_received_at` changes nothing (docs/gateway.md)."""
    return (
        truncated == 0
        and bool(alerts)
        and all(a.status is AlertStatus.FIRING and a.ends_at is None for a in alerts)
    )


@dataclass(frozen=True, slots=True)
class ResendProbe:
    """What `known_resend` needs of a body: which group, what content, which bytes, and its
    occurrences (distinct (fingerprint, startsAt), sorted). Small: the intake keeps one per
    body it saw lately, so a resend of that body needs no parse (gateway/stages/intake.py)."""

    group_key: str
    content_digest: str
    body_sha256: str
    occurrences: tuple[tuple[str, datetime], ...]
    alerts: int  # the body's alerts (repeats of an occurrence included)


# Bodies with more occurrences are recorded as any other (SQLite binds at most 32,766 values).
MAX_OCCURRENCES = 10_000


def resend_probe(receipt: IncomingReceipt) -> ResendProbe | None:
    """Pure: the probe of a parsed body, or None when it can never be answered from the store
    (not skippable, or over MAX_OCCURRENCES occurrences)."""
    if not receipt.skippable or not receipt.content_digest:
        return None
    occurrences = sorted({(alert.fingerprint, alert.starts_at) for alert in receipt.alerts})
    if len(occurrences) > MAX_OCCURRENCES:
        return None
    return ResendProbe(
        receipt.group_key,
        receipt.content_digest,
        receipt.body_sha256,
        tuple(occurrences),
        len(receipt.alerts),
    )


@dataclass(frozen=True, slots=True)
class KnownReceipt:
    """A stored receipt an unchanged resend repeats."""

    receipt_id: int
    times_received: int  # as stored (without counts not yet written)


# One statement, so the check is one round trip (one hop to SQLite's thread): the receipt,
# its group's digest, and how many of the body's occurrences are stored and firing (each
# (fingerprint, startsAt) is unique, so all are when the count is the number of occurrences).
# Each occurrence's status is looked up on its own (a correlated subquery, which neither
# planner flattens into a join) through the unique index: joined, SQLite read every firing
# alert through the status index, and PostgreSQL hashed the whole table whenever it believed
# it small (after a burst of new alerts), so a resend cost more with every alert stored.
# tests/store/test_resends.py reads both plans.
_KNOWN = (
    "SELECT r.id, r.times_received, g.digest, (SELECT count(*) FROM {} WHERE "
    "(SELECT a.status FROM alerts a WHERE a.fingerprint = k.fingerprint "
    "AND a.starts_at = k.starts_at) = 'firing') FROM webhook_receipts r "
    "LEFT JOIN webhook_groups g ON g.key = ? WHERE r.body_sha256 = ?"
)
# the body's occurrences as a table k(fingerprint, starts_at)
_OCCURRENCES_SQLITE = "(SELECT column1 AS fingerprint, column2 AS starts_at FROM (VALUES {})) AS k"
_OCCURRENCES_POSTGRESQL = "unnest(?::text[], ?::timestamptz[]) AS k(fingerprint, starts_at)"


def known_resend_sql(probe: ResendProbe, enc: Encoder) -> tuple[str, list[Any]]:
    """Pure: the statement `known_resend` runs for `probe`, with its parameters."""
    params: list[Any] = []
    if enc.sqlite:
        occurrences = _OCCURRENCES_SQLITE.format(",".join(["(?,?)"] * len(probe.occurrences)))
        for fingerprint, starts_at in probe.occurrences:
            params += (fingerprint, enc.time(starts_at))
    else:
        occurrences = _OCCURRENCES_POSTGRESQL
        params.append([fingerprint for fingerprint, _ in probe.occurrences])
        params.append([enc.time(starts_at) for _, starts_at in probe.occurrences])
    params += (group_row_key(probe.group_key), probe.body_sha256)
    return _KNOWN.format(occurrences), params


def known_resend_steps(probe: ResendProbe, enc: Encoder) -> Steps[KnownReceipt | None]:
    """`known_resend` as one statement (a read)."""
    rows = yield Fetch(*known_resend_sql(probe, enc))
    if not rows:
        return None  # not a stored body
    receipt_id, times, digest, firing_now = rows[0]
    if digest != probe.content_digest or int(firing_now) != len(probe.occurrences):
        return None
    return KnownReceipt(int(receipt_id), int(times))


async def known_resend(conn: AsyncConnection, probe: ResendProbe) -> KnownReceipt | None:
    """The stored receipt a body repeats when it is an unchanged resend of its group that
    needs no write (module docstring), else None. A read only, of committed rows (on disk):
    `conn` need not be in a transaction (`open_reader`)."""
    return await run_steps(conn, known_resend_steps(probe, encoder(conn)))


async def open_reader(engine: AsyncEngine) -> AsyncConnection:
    """A connection for `known_resend`, held open by the intake (checking a connection out of
    the pool and back cost more than the read itself: about 0.3 ms on SQLite, a round trip
    more on PostgreSQL). Autocommit: it holds no transaction, hence no snapshot, between
    reads. One read at a time on it (the caller serialises)."""
    conn = await engine.connect()
    try:
        return await conn.execution_options(isolation_level="AUTOCOMMIT")
    except BaseException:
        await conn.close()
        raise


@dataclass(slots=True)
class ReceiptTouch:
    """Resends of one stored receipt answered without a write, not yet counted in it."""

    count: int
    last_at: datetime


_TOUCH = (
    "UPDATE webhook_receipts SET times_received = times_received + ?, "
    "last_received_at = CASE WHEN last_received_at < ? THEN ? ELSE last_received_at END "
    "WHERE id = ?"
)


def touch_receipts_steps(touches: Mapping[int, ReceiptTouch], enc: Encoder) -> Steps[None]:
    """Adds resends answered from the store to their receipts' `times_received` and
    `last_received_at` (a receipt the retention deleted meanwhile is simply not there)."""
    rows = []
    for receipt_id in sorted(touches):
        touch = touches[receipt_id]
        at = enc.time(touch.last_at)
        rows.append((touch.count, at, at, receipt_id))
    if rows:
        yield ExecuteMany(_TOUCH, rows)


async def touch_receipts(conn: AsyncConnection, touches: Mapping[int, ReceiptTouch]) -> None:
    """`touch_receipts_steps` in the caller's transaction."""
    await run_steps(conn, touch_receipts_steps(touches, encoder(conn)))
