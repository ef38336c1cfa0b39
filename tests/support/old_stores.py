"""Stores as earlier schema versions left them, for upgrade tests."""

from __future__ import annotations

from sqlalchemy import Index, MetaData, Table, UniqueConstraint
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.support.webhook_factory import BASE_TIME
from trainsentry.store.migrations import MIGRATIONS
from trainsentry.store.schema import (
    callback_events,
    console_revoked_sessions,
    incident_alerts,
    incidents,
    intake_journal,
    maintenance_mutes,
    maintenance_windows,
    metadata,
    oncall_overrides,
    policy_inbox,
    schema_version,
    webhook_groups,
)

# Tables that later versions added.
ADDED_TABLES = {
    2: (policy_inbox,),
    5: (callback_events,),
    6: (maintenance_windows, maintenance_mutes),
    10: (oncall_overrides,),
    11: (console_revoked_sessions,),
    12: (webhook_groups,),
    13: (incidents, incident_alerts),
    14: (intake_journal,),
}
# Columns that later versions added to tables version 1 created: {version: {table: names}}.
ADDED_COLUMNS: dict[int, dict[str, tuple[str, ...]]] = {
    4: {"notifications": ("failing_since", "retried_by", "retried_at")},
    9: {"alerts": ("topology",)},
}
# Indexes that later versions added to tables version 1 created.
ADDED_INDEXES: dict[int, tuple[str, ...]] = {
    7: (
        "ix_webhook_receipts_last_received",
        "ix_alerts_first_receipt",
        "ix_alert_events_receipt",
        "ix_notifications_created",
    ),
    8: ("ix_alerts_blast_nodes",),
    9: ("ix_alerts_node_starts",),
}
# Indexes that later versions dropped: {version: {index: (table, columns)}}.
DROPPED_INDEXES = {8: {"ix_alerts_blast": ("alerts", ("job_name", "alertname", "starts_at"))}}


def version_1_tables() -> list[Table]:
    """Version 1's tables as it created them: today's, less the tables and columns that
    later versions added (their indexes included)."""
    later = {
        table: set(names) for added in ADDED_COLUMNS.values() for table, names in added.items()
    }
    later_indexes = {name for names in ADDED_INDEXES.values() for name in names}
    old = MetaData()
    tables = []
    for table in metadata.sorted_tables:
        if any(table in added for added in ADDED_TABLES.values()):
            continue
        drop = later.get(table.name, set())
        dropped = [
            (name, columns)
            for dropped_at in DROPPED_INDEXES.values()
            for name, (owner, columns) in dropped_at.items()
            if owner == table.name
        ]
        if not drop and not dropped and not any(i.name in later_indexes for i in table.indexes):
            tables.append(table.to_metadata(old))
            continue
        if not drop:  # the table as it is (constraints included), less later indexes
            copy = table.to_metadata(old)
            copy.indexes -= {i for i in copy.indexes if i.name in later_indexes}
        else:
            copy = Table(table.name, old, *(c._copy() for c in table.columns if c.name not in drop))
            for constraint in table.constraints:
                if isinstance(constraint, UniqueConstraint):
                    names = [c.name for c in constraint.columns]
                    copy.append_constraint(UniqueConstraint(*names, name=constraint.name))
            for index in table.indexes:
                if index.name in later_indexes:
                    continue
                if not any(c.name in drop for c in index.columns):
                    Index(index.name, *(copy.c[c.name] for c in index.columns))
        for name, columns in dropped:
            Index(name, *(copy.c[c] for c in columns))
        tables.append(copy)
    return tables


async def create_version_2_schema(conn: AsyncConnection) -> None:
    """In `conn`'s transaction: the schema as version 2 left it (the inbox without its
    urgency column, the outbox without version 4's columns)."""
    v1_tables = version_1_tables()
    await conn.run_sync(lambda sync: v1_tables[0].metadata.create_all(sync))
    for step in MIGRATIONS[2]:
        assert not isinstance(step, str)
        await conn.run_sync(step)
    await conn.execute(schema_version.insert().values(version=2, applied_at=BASE_TIME))


async def create_version_3_schema(conn: AsyncConnection) -> None:
    """In `conn`'s transaction: the schema as version 3 left it (the outbox without
    version 4's columns)."""
    await create_version_2_schema(conn)
    for step in MIGRATIONS[3]:
        assert isinstance(step, str)
        await conn.exec_driver_sql(step)
    await conn.execute(schema_version.insert().values(version=3, applied_at=BASE_TIME))
