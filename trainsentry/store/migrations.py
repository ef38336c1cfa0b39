"""Versioned DDL steps: MIGRATIONS[n] upgrades a database from version n-1 to n.

Version 1 is created from `schema.metadata` directly, so it has no steps. A step is SQL text
or a function of the (synchronous) connection, e.g. creating a table as that version defined
it (not from `schema.py`, which later versions change), so the same DDL works on every
backend. Bump `schema.SCHEMA_VERSION` with each new entry; tests check both stay in step and
that an upgraded database matches a new one.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import (
    Id,
    Json,
    UTCDateTime,
    alert_events,
    alerts,
    webhook_receipts,
)

Step = str | Callable[[Connection], None]


def _create_policy_inbox_v2(conn: Connection) -> None:
    # The table as version 2 had it; version 3 adds to it.
    Table(
        "policy_inbox",
        MetaData(),
        Column(
            "event_id", Id, ForeignKey(alert_events.c.id), primary_key=True, autoincrement=False
        ),
    ).create(conn)


def _add_delivery_columns_v4(conn: Connection) -> None:
    # Each backend's own spelling of a timezone-aware timestamp (as create_all writes it).
    stamp = conn.dialect.type_compiler_instance.process(DateTime(timezone=True))
    for column, sql_type in (
        ("failing_since", stamp),
        ("retried_by", "TEXT"),
        ("retried_at", stamp),
    ):
        conn.exec_driver_sql(f"ALTER TABLE notifications ADD COLUMN {column} {sql_type}")


def _create_callback_events_v5(conn: Connection) -> None:
    # The table as version 5 defines it.
    table = Table(
        "callback_events",
        MetaData(),
        Column("event_id", String(128), primary_key=True),
        Column("received_at", UTCDateTime, nullable=False),
    )
    Index("ix_callback_events_received", table.c.received_at)
    table.create(conn)


def _create_maintenance_v6(conn: Connection) -> None:
    # The tables as version 6 defines them.
    meta = MetaData()
    windows = Table(
        "maintenance_windows",
        meta,
        Column("id", String(40), primary_key=True),
        Column("created_at", UTCDateTime, nullable=False),
        Column("created_by", Text, nullable=False, default=""),
        Column("reason", Text, nullable=False, default=""),
        Column("request", Json, nullable=False),
        Column("starts_at", UTCDateTime, nullable=True),
        Column("ends_at", UTCDateTime, nullable=True),
        Column("ended_at", UTCDateTime, nullable=True),
        Column("ended_by", Text, nullable=True),
        Column("announced_end", UTCDateTime, nullable=True),
    )
    mutes = Table(
        "maintenance_mutes",
        meta,
        Column("alert_id", Id, ForeignKey(alerts.c.id), primary_key=True, autoincrement=False),
        Column("window_id", String(40), nullable=False),
        Column("muted_at", UTCDateTime, nullable=False),
        Column("until", UTCDateTime, nullable=True),
        Column("state", String(16), nullable=False),
        Column("closed_at", UTCDateTime, nullable=True),
        Column("drafts", Json, nullable=False),
    )
    Index("ix_maintenance_mutes_due", mutes.c.state, mutes.c.until)
    Index("ix_maintenance_mutes_window", mutes.c.window_id, mutes.c.state)
    windows.create(conn)
    mutes.create(conn)


def _add_alert_topology_v9(conn: Connection) -> None:
    sql_type = "JSON" if is_sqlite(conn) else "JSONB"
    conn.exec_driver_sql(f"ALTER TABLE alerts ADD COLUMN topology {sql_type}")
    conn.exec_driver_sql("CREATE INDEX ix_alerts_node_starts ON alerts (node, starts_at)")


def _create_oncall_overrides_v10(conn: Connection) -> None:
    # The table as version 10 defines it.
    table = Table(
        "oncall_overrides",
        MetaData(),
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("schedule", String(64), nullable=False),
        Column("kind", String(16), nullable=False),
        Column("who", String(64), nullable=False),
        Column("replaces", String(64), nullable=True),
        Column("starts_at", UTCDateTime, nullable=False),
        Column("ends_at", UTCDateTime, nullable=False),
        Column("reason", Text, nullable=False, default=""),
        Column("created_by", Text, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("removed_by", Text, nullable=True),
        Column("removed_at", UTCDateTime, nullable=True),
    )
    Index("ix_oncall_overrides_schedule", table.c.schedule, table.c.ends_at)
    table.create(conn)


def _create_console_revoked_sessions_v11(conn: Connection) -> None:
    # The table as version 11 defines it.
    table = Table(
        "console_revoked_sessions",
        MetaData(),
        Column("session_id", String(64), primary_key=True),
        Column("expires_at", UTCDateTime, nullable=False),
        Column("revoked_at", UTCDateTime, nullable=False),
    )
    Index("ix_console_revoked_sessions_expires", table.c.expires_at)
    table.create(conn)


def _create_webhook_groups_v12(conn: Connection) -> None:
    # The table as version 12 defines it.
    table = Table(
        "webhook_groups",
        MetaData(),
        Column("key", String(64), primary_key=True),
        Column("digest", String(64), nullable=False),
        Column("receipt_id", Id, ForeignKey(webhook_receipts.c.id), nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
    )
    Index("ix_webhook_groups_receipt", table.c.receipt_id)
    table.create(conn)


def _create_incidents_v13(conn: Connection) -> None:
    # The tables as version 13 defines them.
    meta = MetaData()
    incidents = Table(
        "incidents",
        meta,
        Column("id", Id, primary_key=True, autoincrement=False),
        Column("key_hash", String(64), nullable=False),
        Column("key", Text, nullable=False),
        Column("status", String(16), nullable=False),
        Column("priority", String(2), nullable=False),
        Column("job", Text, nullable=False, default=""),
        Column("cause", Text, nullable=False, default=""),
        Column("cause_alert_id", Id, nullable=True),
        Column("alerts_total", Integer, nullable=False, default=0),
        Column("alerts_firing", Integer, nullable=False, default=0),
        Column("opened_at", UTCDateTime, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
        Column("resolved_at", UTCDateTime, nullable=True),
        Column("acked_at", UTCDateTime, nullable=True),
        Column("acked_by", Text, nullable=True),
        Column("due_at", UTCDateTime, nullable=True),
        Column("state", Json, nullable=False),
    )
    is_open = text("status = 'firing'")
    Index(
        "uq_incidents_open_key",
        incidents.c.key_hash,
        unique=True,
        sqlite_where=is_open,
        postgresql_where=is_open,
    )
    Index("ix_incidents_due", incidents.c.due_at)
    Index("ix_incidents_status", incidents.c.status, incidents.c.id)
    members = Table(
        "incident_alerts",
        meta,
        Column("alert_id", Id, ForeignKey(alerts.c.id), primary_key=True, autoincrement=False),
        Column("incident_id", Id, ForeignKey(incidents.c.id), nullable=False),
        Column("role", String(16), nullable=False),
        Column("group_key", Text, nullable=False, default=""),
        Column("joined_at", UTCDateTime, nullable=False),
    )
    Index("ix_incident_alerts_incident", members.c.incident_id)
    incidents.create(conn)
    members.create(conn)
    if not is_sqlite(conn):
        conn.exec_driver_sql("CREATE SEQUENCE incident_ids")


def _create_intake_journal_v14(conn: Connection) -> None:
    # The table as version 14 defines it.
    table = Table(
        "intake_journal",
        MetaData(),
        Column("id", Id, primary_key=True, autoincrement=True),
        Column("receipt_id", Id, ForeignKey(webhook_receipts.c.id), nullable=False),
        Column("group_hash", String(64), nullable=False),
        Column("alert_count", Integer, nullable=False),
        Column("received_at", UTCDateTime, nullable=False),
    )
    Index("ix_intake_journal_group", table.c.group_hash)
    table.create(conn)


MIGRATIONS: dict[int, list[Step]] = {
    1: [],
    # 2: the policy runs after the intake's commit, from a durable inbox of events
    2: [_create_policy_inbox_v2],
    # 3: the inbox is claimed most urgent first (a P0 is not planned behind a storm)
    3: [
        "ALTER TABLE policy_inbox ADD COLUMN urgency SMALLINT NOT NULL DEFAULT 2",
        "CREATE INDEX ix_policy_inbox_claim ON policy_inbox (urgency, event_id)",
    ],
    # 4: the outbox gives up by elapsed time (failing_since); dead rows can be re-sent, and
    # who did it is kept (retried_by, retried_at)
    4: [_add_delivery_columns_v4],
    # 5: Feishu card callbacks are acted on once, whichever replica a replay reaches
    5: [_create_callback_events_v5],
    # 6: maintenance windows, and the alerts they muted (issue 21)
    6: [_create_maintenance_v6],
    # 7: the retention purge (store/retention.py) finds old rows and clears references by index
    7: [
        "CREATE INDEX ix_webhook_receipts_last_received ON webhook_receipts (last_received_at)",
        "CREATE INDEX ix_alerts_first_receipt ON alerts (first_receipt_id)",
        "CREATE INDEX ix_alert_events_receipt ON alert_events (receipt_id)",
        "CREATE INDEX ix_notifications_created ON notifications (created_at)",
    ],
    # 8: the blast-radius count reads a covering index, not every alert row of the job
    8: [
        "CREATE INDEX ix_alerts_blast_nodes ON alerts "
        "(job_name, alertname, starts_at, job_namespace, node)",
        "DROP INDEX ix_alerts_blast",
    ],
    # 9: an alert's place in the topology (docs/infrastructure.md), and an index to find the
    # recent alerts of a set of nodes
    9: [_add_alert_topology_v9],
    # 10: run-time on-call overrides and swaps, with who added and removed them
    10: [_create_oncall_overrides_v10],
    # 11: signing out of the console ends the session for every copy of its cookie
    11: [_create_console_revoked_sessions_v11],
    # 12: each Alertmanager group's last content, to recognise an unchanged resend (issue 34)
    12: [_create_webhook_groups_v12],
    # 13: incidents, the unit of notification, and which incident each alert is in (issue 34)
    13: [_create_incidents_v13],
    # 14: journal-first intake: a receipt is answered once stored, its alerts recorded after
    # (issue 46)
    14: [_create_intake_journal_v14],
    # 15: the inbox is partitioned by job (or node), so PostgreSQL replicas plan a storm's
    # partitions side by side (store/inbox.py; issue 46)
    15: [
        "ALTER TABLE policy_inbox ADD COLUMN part INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX ix_policy_inbox_part ON policy_inbox (part, urgency, event_id)",
    ],
}
