"""The cordon recommendations' states (table `policy_state`, scope "cordon", one row per
node), the times of the cordon cards sent within the hour (key "~cards") and the lock row
that serialises every cordon decision across gateway replicas.

`lock_cordon` inserts the lock row if absent and locks it (`FOR UPDATE` on PostgreSQL;
SQLite's single writer serialises anyway) for the caller's transaction, so two replicas
checking the nodes, or two people pressing Approve on two cards at once, decide one after
the other: one recommendation per node, and the hourly limit counted over both.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import dialect_insert, is_sqlite
from trainsentry.store.policy_state import load_states, save_states
from trainsentry.store.schema import policy_state

SCOPE = "cordon"
LOCK_KEY = "~lock"  # not a node name (a node name is a DNS subdomain: no "~")
CARDS_KEY = "~cards"
MAX_NODES = 100_000
MAX_CARD_TIMES = 1000  # remediation.max_cards_per_hour is at most 1000


async def lock_cordon(conn: AsyncConnection, now: datetime) -> None:
    await conn.execute(
        dialect_insert(conn, policy_state)
        .values(scope=SCOPE, key=LOCK_KEY, state={}, updated_at=now, due_at=None)
        .on_conflict_do_nothing(index_elements=[policy_state.c.scope, policy_state.c.key])
    )
    query = select(policy_state.c.key).where(
        policy_state.c.scope == SCOPE, policy_state.c.key == LOCK_KEY
    )
    if not is_sqlite(conn):
        query = query.with_for_update()
    await conn.execute(query)


async def cordon_states(conn: AsyncConnection) -> dict[str, dict[str, Any]]:
    """node -> its stored state (the "~" rows, which are no node's, left out)."""
    query = (
        select(policy_state.c.key, policy_state.c.state)
        .where(policy_state.c.scope == SCOPE, policy_state.c.key.not_like("~%"))
        .limit(MAX_NODES)
    )
    return {row.key: dict(row.state) for row in await conn.execute(query)}


async def card_times(conn: AsyncConnection) -> list[datetime]:
    """When the cordon cards counted against the hourly cap were sent (as stored)."""
    state = (await load_states(conn, SCOPE, [CARDS_KEY])).get(CARDS_KEY) or {}
    times = state.get("at")
    if not isinstance(times, list):
        return []
    return [datetime.fromisoformat(str(at)) for at in times[-MAX_CARD_TIMES:]]


async def save_card_times(conn: AsyncConnection, times: Iterable[datetime], now: datetime) -> None:
    """Keeps these card times (the caller drops those older than the hour)."""
    kept = [at.isoformat() for at in sorted(times)][-MAX_CARD_TIMES:]
    await save_states(conn, SCOPE, {CARDS_KEY: ({"at": kept}, None)}, now)
