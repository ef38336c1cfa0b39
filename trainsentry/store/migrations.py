"""Versioned DDL steps: MIGRATIONS[n] upgrades a database from version n-1 to n.

Version 1 is created from `schema.metadata` directly, so it has no steps. A step is SQL text
or a function of the (synchronous) connection, e.g. creating a table from its definition in
`schema.py` so an upgraded database matches a new one on every backend. Bump
`schema.SCHEMA_VERSION` with each new entry; a test checks both stay in step.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

from trainsentry.store.schema import policy_inbox

Step = str | Callable[[Connection], None]


def _create_policy_inbox(conn: Connection) -> None:
    policy_inbox.create(conn)


MIGRATIONS: dict[int, list[Step]] = {
    1: [],
    # 2: the policy runs after the intake's commit, from a durable inbox of events
    2: [_create_policy_inbox],
}
