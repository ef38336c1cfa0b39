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

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.bulk import encoder, insert_rows
from trainsentry.store.schema import alerts, policy_state


async def load_states(
    conn: AsyncConnection, scope: str, keys: Iterable[str]
) -> dict[str, dict[str, Any]]:
    wanted = sorted(set(keys))
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(wanted), 5000):
        query = (
            select(policy_state.c.key, policy_state.c.state)
            .where(
                policy_state.c.scope == scope, policy_state.c.key.in_(wanted[start : start + 5000])
            )
            .order_by(policy_state.c.key)
        )
        if conn.dialect.name == "postgresql":
            query = query.with_for_update()
        for row in await conn.execute(query):
            found[row.key] = dict(row.state)
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
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return {row.key: dict(row.state) for row in await conn.execute(query)}


async def distinct_nodes(
    conn: AsyncConnection,
    pairs: Sequence[tuple[str, str, str]],
    since: datetime,
) -> dict[tuple[str, str, str], int]:
    """For each (job_namespace, job_name, alertname): distinct nodes with an occurrence that
    started at or after `since` (the blast-radius window)."""
    counts: dict[tuple[str, str, str], int] = {}
    for namespace, name, alertname in sorted(set(pairs)):
        if not name:
            counts[(namespace, name, alertname)] = 1
            continue
        query = select(func.count(func.distinct(alerts.c.node))).where(
            and_(
                alerts.c.job_name == name,
                alerts.c.job_namespace == namespace,
                alerts.c.alertname == alertname,
                alerts.c.starts_at >= since,
                alerts.c.node != "",
            )
        )
        counts[(namespace, name, alertname)] = int((await conn.execute(query)).scalar() or 0)
    return counts


def window_start(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)
