"""Console sessions ended by signing out (table `console_revoked_sessions`), so a copy of
the session cookie (a signed, unexpired value) no longer signs anyone in, on any replica and
after a restart.

A session id is recorded with the expiry of its cookie; rows whose cookie has expired are
deleted on the way (the cookie is refused by its signed expiry from then on).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.dialect import dialect_insert
from trainsentry.store.schema import console_revoked_sessions as revoked


async def revoke_session(
    conn: AsyncConnection, session_id: str, expires_at: datetime, now: datetime
) -> None:
    """Records `session_id` (at most 64 characters) as ended at `now`, in the caller's
    transaction; revoking one twice is one row."""
    await conn.execute(delete(revoked).where(revoked.c.expires_at < now))
    await conn.execute(
        dialect_insert(conn, revoked)
        .values(session_id=session_id, expires_at=expires_at, revoked_at=now)
        .on_conflict_do_nothing(index_elements=[revoked.c.session_id])
    )


async def session_revoked(conn: AsyncConnection, session_id: str) -> bool:
    """The session was signed out (one primary-key lookup)."""
    found = await conn.execute(
        select(revoked.c.session_id).where(revoked.c.session_id == session_id)
    )
    return found.first() is not None
