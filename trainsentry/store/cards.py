"""Where an alert's or an incident's cards went: the outbox rows of its notices, read for
its ack and for the redraw of its card.

An ack is shown where the cards were (gateway/stages/services/ack.py): the same channels, the same
TrainingJob route (`job_route` of a `feishu_job` card), and on the Feishu card already in the
chat (its `provider_id`, the message_id the Feishu app answered) when there is one. An
incident's cards share one outbox group (`incident:<id>`): `group_cards` reads them.
Read only, inside the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import notifications

#: At most this many of an alert's card rows are read (newest first); an alert re-notified
#: more often than that has its newest cards considered.
MAX_CARD_ROWS = 200


@dataclass(frozen=True, slots=True)
class CardRow:
    """One notification row of an alert's own notices (kind `alert`)."""

    id: int
    channel: str
    status: str  # pending | sending | sent | dead | cancelled (store/outbox.py)
    sent_at: datetime | None
    provider_id: str | None  # the channel's id of what it sent (Feishu: the message_id)
    job_route: dict[str, Any] | None  # the payload's `job_route` (feishu_job cards)
    payload: dict[str, Any] | None = None  # the whole payload (what the card showed)


async def alert_cards(
    conn: AsyncConnection, alert_id: int, kinds: tuple[str, ...] = ("alert",)
) -> list[CardRow]:
    """The rows of `alert_id`'s notices of `kinds`, newest first (at most MAX_CARD_ROWS)."""
    return await _cards(
        conn, (notifications.c.alert_id == alert_id, notifications.c.kind.in_(kinds))
    )


async def group_cards(
    conn: AsyncConnection, group_key: str, kinds: tuple[str, ...] = ("alert", "ack")
) -> list[CardRow]:
    """The rows of one outbox group's notices of `kinds` (an incident's cards, its redraws
    and acks), newest first (at most MAX_CARD_ROWS)."""
    return await _cards(
        conn, (notifications.c.group_key == group_key, notifications.c.kind.in_(kinds))
    )


async def _cards(conn: AsyncConnection, where: tuple[Any, ...]) -> list[CardRow]:
    query = (
        select(
            notifications.c.id,
            notifications.c.channel,
            notifications.c.status,
            notifications.c.sent_at,
            notifications.c.provider_id,
            notifications.c.payload,
        )
        .where(*where)
        .order_by(notifications.c.id.desc())
        .limit(MAX_CARD_ROWS)
    )
    found: list[CardRow] = []
    for row in await conn.execute(query):
        payload = row.payload if isinstance(row.payload, dict) else {}
        route = payload.get("job_route")
        found.append(
            CardRow(
                id=int(row.id),
                channel=str(row.channel),
                status=str(row.status),
                sent_at=row.sent_at,
                provider_id=str(row.provider_id) if row.provider_id else None,
                job_route=dict(route) if isinstance(route, dict) else None,
                payload=payload,
            )
        )
    return found
