"""The store's part in topology and infrastructure incidents: an alert's place is recorded
when the policy plans it, and the firing alerts of a set of nodes are read back (what the
infrastructure incident logic counts, gateway/policy/infra.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import alerts

# At most this many node names per query (a bound on the IN list) and rows read per batch.
_NODES_PER_QUERY = 1000
MAX_RECENT_ROWS = 20_000


async def set_places(
    conn: AsyncConnection, places: Sequence[tuple[int, Mapping[str, str]]]
) -> None:
    """Records (alert_id, {level: element}) for alerts whose node has a place."""
    latest = {alert_id: dict(place) for alert_id, place in places if place}
    if not latest:
        return
    await conn.execute(
        alerts.update()
        .where(alerts.c.id == bindparam("alert_id"))
        .values(topology=bindparam("place")),
        [{"alert_id": alert_id, "place": place} for alert_id, place in sorted(latest.items())],
    )


@dataclass(frozen=True, slots=True)
class RecentAlert:
    """A firing occurrence on one of the asked nodes, as the incident logic needs it."""

    alert_id: int
    node: str
    job_namespace: str
    job_name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime


async def recent_on_nodes(
    conn: AsyncConnection, nodes: Collection[str], since: datetime
) -> list[RecentAlert]:
    """Firing occurrences that started at or after `since` on any of `nodes` (at most
    MAX_RECENT_ROWS, the newest kept)."""
    wanted = sorted(set(nodes))
    found: list[RecentAlert] = []
    for start in range(0, len(wanted), _NODES_PER_QUERY):
        query = (
            select(
                alerts.c.id,
                alerts.c.node,
                alerts.c.job_namespace,
                alerts.c.job_name,
                alerts.c.labels,
                alerts.c.annotations,
                alerts.c.starts_at,
            )
            .where(
                alerts.c.node.in_(wanted[start : start + _NODES_PER_QUERY]),
                alerts.c.starts_at >= since,
                alerts.c.status == "firing",
            )
            .order_by(alerts.c.id.desc())
            .limit(MAX_RECENT_ROWS - len(found))
        )
        for row in await conn.execute(query):
            found.append(
                RecentAlert(
                    alert_id=int(row.id),
                    node=row.node,
                    job_namespace=row.job_namespace,
                    job_name=row.job_name,
                    labels=dict(row.labels),
                    annotations=dict(row.annotations),
                    starts_at=row.starts_at,
                )
            )
        if len(found) >= MAX_RECENT_ROWS:
            break
    return found
