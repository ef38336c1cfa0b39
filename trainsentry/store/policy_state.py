"""Small JSON states the alert policy keeps between webhooks (per fingerprint, per job, ...).

Rows are locked (`FOR UPDATE`) when loaded for a decision on PostgreSQL, so two gateway
replicas deciding about the same fingerprint or job serialise instead of losing an update.
`due_at` marks when a state's timer fires (a held resolution, a storm summary); the ticker
picks due rows with `SKIP LOCKED`, so each timer fires on one replica.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.bulk import decode_json, encoder, fetch, insert_rows
from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import policy_state

_LOAD_SQL = "SELECT key, state FROM policy_state WHERE scope = ? AND key IN ({}) ORDER BY key"


async def load_states(
    conn: AsyncConnection, scope: str, keys: Iterable[str]
) -> dict[str, dict[str, Any]]:
    wanted = sorted(set(keys))
    found: dict[str, dict[str, Any]] = {}
    # Through the driver (bulk.fetch): this runs for every batch the policy plans.
    lock = "" if is_sqlite(conn) else " FOR UPDATE"
    for start in range(0, len(wanted), 5000):
        chunk = wanted[start : start + 5000]
        sql = _LOAD_SQL.format(",".join("?" * len(chunk))) + lock
        for key, state in await fetch(conn, sql, [scope, *chunk]):
            found[key] = dict(decode_json(state))
    return found


_STATE_COLUMNS = ("scope", "key", "state", "updated_at", "due_at")
_STATE_UPSERT = (
    "ON CONFLICT (scope, key) DO UPDATE SET state = excluded.state, "
    "updated_at = excluded.updated_at, due_at = excluded.due_at"
)


async def save_states(
    conn: AsyncConnection,
    scope: str,
    states: Mapping[str, tuple[dict[str, Any], datetime | None]],
    now: datetime,
) -> None:
    """Upserts `key -> (state, due_at)`."""
    if not states:
        return
    enc = encoder(conn)
    updated_at = enc.time(now)
    rows = [
        (scope, key, enc.json(state), updated_at, enc.time(due_at))
        for key, (state, due_at) in sorted(states.items())
    ]
    await insert_rows(conn, policy_state, _STATE_COLUMNS, rows, tail=_STATE_UPSERT)


async def claim_due(
    conn: AsyncConnection, scope: str, now: datetime, limit: int = 500
) -> dict[str, dict[str, Any]]:
    """States of `scope` whose timer is due, locked for this transaction (skipping rows another
    replica holds)."""
    query = (
        select(policy_state.c.key, policy_state.c.state)
        .where(policy_state.c.scope == scope, policy_state.c.due_at <= now)
        .order_by(policy_state.c.due_at)
        .limit(limit)
    )
    if not is_sqlite(conn):
        query = query.with_for_update(skip_locked=True)
    return {row.key: dict(row.state) for row in await conn.execute(query)}


# One statement per batch for every (namespace, job, alertname) of the batch: each count is a
# subquery that reads only the covering index ix_alerts_blast_nodes (schema version 8), not
# the alert rows (a 20-job storm: 20 queries of ~1.8 ms each per batch before, one hop now).
_COUNT_NODES = (
    "SELECT CAST(? AS INTEGER), (SELECT count(DISTINCT node) FROM alerts WHERE job_name = ? "
    "AND alertname = ? AND starts_at >= ? AND job_namespace = ? AND node <> '')"
)
_PAIRS_PER_STATEMENT = 100


async def distinct_nodes(
    conn: AsyncConnection,
    pairs: Sequence[tuple[str, str, str]],
    since: datetime,
) -> dict[tuple[str, str, str], int]:
    """For each (job_namespace, job_name, alertname): distinct nodes with an occurrence that
    started at or after `since` (the blast-radius window). Without a job name: 1."""
    wanted = sorted(set(pairs))
    counts = {pair: 1 for pair in wanted if not pair[1]}
    named = [pair for pair in wanted if pair[1]]
    at = encoder(conn).time(since)
    for start in range(0, len(named), _PAIRS_PER_STATEMENT):
        chunk = named[start : start + _PAIRS_PER_STATEMENT]
        sql = " UNION ALL ".join([_COUNT_NODES] * len(chunk))
        params: list[Any] = []
        for index, (namespace, name, alertname) in enumerate(chunk):
            params += [index, name, alertname, at, namespace]
        for index, found in await fetch(conn, sql, params):
            counts[chunk[int(index)]] = int(found or 0)
    return counts


def window_start(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)
