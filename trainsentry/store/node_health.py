"""What node health is computed from: the stored alert occurrences of nodes within a horizon
(gateway/policy/health.py scores them, pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import Alert, AlertStatus
from trainsentry.store.schema import alerts

# The newest occurrences read at most (a bound on one request's work).
MAX_OCCURRENCES = 100_000


@dataclass(frozen=True, slots=True)
class NodeOccurrence:
    fingerprint: str
    node: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime

    def alert(self) -> Alert:
        """The occurrence as a firing alert (when it fired is what counts), its node the one
        the store resolved (cordon and the nodes API score these)."""
        return Alert(
            self.fingerprint,
            AlertStatus.FIRING,
            self.labels,
            self.annotations,
            self.starts_at,
            None,
            resolved_node=self.node,
        )


async def node_occurrences(
    conn: AsyncConnection, since: datetime, limit: int = MAX_OCCURRENCES
) -> list[NodeOccurrence]:
    """Occurrences of alerts naming a node that started at or after `since`, newest first
    (at most `limit`)."""
    query = (
        select(
            alerts.c.fingerprint,
            alerts.c.node,
            alerts.c.labels,
            alerts.c.annotations,
            alerts.c.starts_at,
        )
        .where(alerts.c.node != "", alerts.c.starts_at >= since)
        .order_by(alerts.c.starts_at.desc(), alerts.c.id.desc())
        .limit(limit)
    )
    return [
        NodeOccurrence(
            row.fingerprint, row.node, dict(row.labels), dict(row.annotations), row.starts_at
        )
        for row in await conn.execute(query)
    ]
