"""The store's schema (SQLAlchemy Core), the same on SQLite and PostgreSQL.

Tables:
- webhook_receipts: one row per distinct webhook body (replays bump `times_received`).
- alerts: one row per alert occurrence (fingerprint + startsAt), its labels and current state.
- alert_events: every state change of an occurrence (firing, resolved, expired, acked, ...).
- policy_inbox: alert events the intake stored and the alert policy has not yet handled,
  most urgent first.
- notifications: the durable outbox; a row exists before anything is sent.
- policy_state: small JSON state the alert policy keeps per fingerprint / job / escalation.
- report_runs: which report periods were sent (idempotent weekly reports).
- maintenance_windows: maintenance windows as requested, who made and who ended them.
- maintenance_mutes: alerts a window muted, with the notices they are owed at its end.
- oncall_overrides: run-time on-call overrides and swaps, with who added and removed them.
- console_revoked_sessions: console sessions signed out before their cookie expires.
- webhook_groups: per Alertmanager group, a digest of the content the intake last recorded,
  to recognise the group re-sent unchanged (store/resends.py).
- incidents: the unit of notification (one card, one page, one ack), the policy's state.
- incident_alerts: which incident each alert occurrence is in (exactly one).
- intake_journal: receipts answered before their alerts were recorded, waiting to be
  expanded into occurrences, events and inbox rows, oldest first (store/journal.py).

Bump SCHEMA_VERSION and add a step to `migrations.MIGRATIONS` for every change.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Sequence,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from trainsentry.store.dialect import is_sqlite

SCHEMA_VERSION = 15


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if is_sqlite(dialect) else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # SQLite may hand back text
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


Json = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets 64-bit ids.
Id = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", UTCDateTime, nullable=False),
)

webhook_receipts = Table(
    "webhook_receipts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("body_sha256", String(64), nullable=False, unique=True),
    Column("received_at", UTCDateTime, nullable=False),
    Column("last_received_at", UTCDateTime, nullable=False),
    Column("times_received", Integer, nullable=False, default=1),
    Column("receiver", Text, nullable=False, default=""),
    Column("status", String(16), nullable=False),
    Column("group_key", Text, nullable=False, default=""),
    Column("truncated_alerts", Integer, nullable=False, default=0),
    Column("alert_count", Integer, nullable=False),
    Column("external_url", Text, nullable=False, default=""),
    Column("body", Text, nullable=False),  # the body as received (UTF-8 JSON text)
)
# The retention purge (store/retention.py) finds old receipts by when a body last came.
Index("ix_webhook_receipts_last_received", webhook_receipts.c.last_received_at)

# Receipts answered before their alerts were recorded (store/journal.py): one row per
# arrival of a body whose alerts below the most urgent wait to be expanded, oldest first.
intake_journal = Table(
    "intake_journal",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("receipt_id", Id, ForeignKey("webhook_receipts.id"), nullable=False),
    Column("group_hash", String(64), nullable=False),  # store/writes.py group_row_key
    Column("alert_count", Integer, nullable=False),  # the alerts waiting
    Column("received_at", UTCDateTime, nullable=False),  # this arrival's time
)
Index("ix_intake_journal_group", intake_journal.c.group_hash)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("fingerprint", String(64), nullable=False),
    Column("starts_at", UTCDateTime, nullable=False),
    Column("alertname", Text, nullable=False, default=""),
    Column("status", String(16), nullable=False),
    Column("labels", Json, nullable=False),
    Column("annotations", Json, nullable=False),
    Column("ends_at", UTCDateTime, nullable=True),
    Column("generator_url", Text, nullable=False, default=""),
    Column("job_namespace", Text, nullable=False, default=""),
    Column("job_name", Text, nullable=False, default=""),
    Column("node", Text, nullable=False, default=""),
    Column("priority", String(2), nullable=True),
    Column("priority_reason", Text, nullable=True),
    Column("first_receipt_id", Id, ForeignKey("webhook_receipts.id"), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("last_received_at", UTCDateTime, nullable=False),
    Column("resolved_at", UTCDateTime, nullable=True),
    Column("acked_at", UTCDateTime, nullable=True),
    Column("acked_by", Text, nullable=True),
    Column("verdict", Json, nullable=True),
    # the node's place in the topology ({level: element}) when the policy planned it
    Column("topology", Json, nullable=True),
    UniqueConstraint("fingerprint", "starts_at", name="uq_alerts_occurrence"),
)
Index("ix_alerts_status_id", alerts.c.status, alerts.c.id)
Index("ix_alerts_job", alerts.c.job_name, alerts.c.id)
# The blast-radius count (store/policy_state.py, distinct_nodes) reads only this index.
Index(
    "ix_alerts_blast_nodes",
    alerts.c.job_name,
    alerts.c.alertname,
    alerts.c.starts_at,
    alerts.c.job_namespace,
    alerts.c.node,
)
Index("ix_alerts_created", alerts.c.created_at)
# A receipt's deletion clears (and on PostgreSQL checks) the references to it.
Index("ix_alerts_first_receipt", alerts.c.first_receipt_id)
# the firing alerts of the nodes under a topology element within a window (store/infra.py)
Index("ix_alerts_node_starts", alerts.c.node, alerts.c.starts_at)

alert_events = Table(
    "alert_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("alert_id", Id, ForeignKey("alerts.id"), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("receipt_id", Id, ForeignKey("webhook_receipts.id"), nullable=True),
    Column("detail", Json, nullable=True),
)
Index("ix_alert_events_alert", alert_events.c.alert_id, alert_events.c.id)
Index("ix_alert_events_at", alert_events.c.at)
Index("ix_alert_events_receipt", alert_events.c.receipt_id)

# Written with the events in the intake's transaction, deleted in the policy's transaction
# that wrote the event's notifications: an event is planned exactly once, after any crash.
# `urgency` (0 = the alert is labelled P0; store/inbox.py) orders the claims, so a P0 is not
# planned behind a backlog of lesser alerts.
policy_inbox = Table(
    "policy_inbox",
    metadata,
    Column("event_id", Id, ForeignKey("alert_events.id"), primary_key=True, autoincrement=False),
    Column("urgency", SmallInteger, nullable=False, server_default="2"),
    # The planning partition of the change's alert (store/inbox.py `partition_of`): on
    # PostgreSQL a replica claims only rows of partitions it holds an advisory lock on.
    Column("part", Integer, nullable=False, server_default="0"),
)
Index("ix_policy_inbox_claim", policy_inbox.c.urgency, policy_inbox.c.event_id)
Index("ix_policy_inbox_part", policy_inbox.c.part, policy_inbox.c.urgency, policy_inbox.c.event_id)

notifications = Table(
    "notifications",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("idempotency_key", String(200), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("channel", String(64), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("priority", String(2), nullable=False),
    Column("alert_id", Id, ForeignKey("alerts.id"), nullable=True),
    Column("group_key", Text, nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("payload", Json, nullable=False),
    # pending -> sending -> sent | pending (retry) | dead; a phone call whose escalation
    # stopped before it rang: cancelled (gateway/stages/services/paging.py)
    Column("status", String(16), nullable=False, default="pending"),
    Column("attempts", Integer, nullable=False, default=0),
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("claimed_by", Text, nullable=True),
    Column("claimed_until", UTCDateTime, nullable=True),
    Column("sent_at", UTCDateTime, nullable=True),
    Column("provider_id", Text, nullable=True),
    Column("last_error", Text, nullable=True),
    # since when the row's sends fail without a break (None once sent, or never failed); the
    # outbox gives up by this elapsed time, not by attempts (gateway/policy/outbox_retry.py)
    Column("failing_since", UTCDateTime, nullable=True),
    # the last manual re-send of a dead row (`trainsentry outbox retry`, the API): who, when
    Column("retried_by", Text, nullable=True),
    Column("retried_at", UTCDateTime, nullable=True),
)
Index("ix_notifications_due", notifications.c.status, notifications.c.next_attempt_at)
Index(
    "ix_notifications_order",
    notifications.c.channel,
    notifications.c.group_key,
    notifications.c.status,
    notifications.c.id,
)
Index("ix_notifications_alert", notifications.c.alert_id)
# The retention purge and the weekly report read notifications by when they were written.
Index("ix_notifications_created", notifications.c.created_at)

policy_state = Table(
    "policy_state",
    metadata,
    Column("scope", String(32), primary_key=True),
    Column("key", String(300), primary_key=True),
    Column("state", Json, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("due_at", UTCDateTime, nullable=True),
)
Index("ix_policy_state_due", policy_state.c.due_at)

report_runs = Table(
    "report_runs",
    metadata,
    Column("period_key", String(100), primary_key=True),
    Column("sent_at", UTCDateTime, nullable=False),
    Column("recipients", Json, nullable=False),
    Column("detail", Json, nullable=True),
)

# Feishu card callbacks already acted on, by Feishu's event id (store/callbacks.py): a replay
# is dropped by whichever replica it reaches. Rows are kept a day.
callback_events = Table(
    "callback_events",
    metadata,
    Column("event_id", String(128), primary_key=True),
    Column("received_at", UTCDateTime, nullable=False),
)
Index("ix_callback_events_received", callback_events.c.received_at)

# Maintenance windows (store/maintenance_windows.py, gateway/stages/services/maintenance.py):
# `request` is the validated request body, parsed again (maintenance/windows.py) by whichever
# replica reads it.
# `ended_at`/`ended_by`: ended early (DELETE); `announced_end`: the end of the stretch whose
# "ends soon" notice was written (once, by one replica).
maintenance_windows = Table(
    "maintenance_windows",
    metadata,
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

# One row per alert occurrence a window muted: `state` muted -> notified (still firing when
# the window ended: `drafts`, the notices held back, were written then) | resolved (ended
# while muted: nothing owed). `until`: when the ticker looks at it again (the stretch's end).
maintenance_mutes = Table(
    "maintenance_mutes",
    metadata,
    Column("alert_id", Id, ForeignKey("alerts.id"), primary_key=True, autoincrement=False),
    Column("window_id", String(40), nullable=False),
    Column("muted_at", UTCDateTime, nullable=False),
    Column("until", UTCDateTime, nullable=True),
    Column("state", String(16), nullable=False),
    Column("closed_at", UTCDateTime, nullable=True),
    Column("drafts", Json, nullable=False),
)
Index("ix_maintenance_mutes_due", maintenance_mutes.c.state, maintenance_mutes.c.until)
Index("ix_maintenance_mutes_window", maintenance_mutes.c.window_id, maintenance_mutes.c.state)

# Run-time on-call overrides and swaps (store/oncall_overrides.py): added and removed through
# the API or CLI, never deleted (who and when stay as the audit).
oncall_overrides = Table(
    "oncall_overrides",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("schedule", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # override | swap
    Column("who", String(64), nullable=False),
    Column("replaces", String(64), nullable=True),  # swaps: whose shifts `who` takes
    Column("starts_at", UTCDateTime, nullable=False),
    Column("ends_at", UTCDateTime, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("created_by", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("removed_by", Text, nullable=True),
    Column("removed_at", UTCDateTime, nullable=True),
)
Index("ix_oncall_overrides_schedule", oncall_overrides.c.schedule, oncall_overrides.c.ends_at)

# Console sessions ended by signing out (store/console_sessions.py): the session id of a
# cookie that is still signed and unexpired but must no longer sign anyone in, kept until the
# cookie would have expired (then deleted on the way).
console_revoked_sessions = Table(
    "console_revoked_sessions",
    metadata,
    Column("session_id", String(64), primary_key=True),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime, nullable=False),
)
Index("ix_console_revoked_sessions_expires", console_revoked_sessions.c.expires_at)

# The content of each Alertmanager group (by the SHA-256 of its `groupKey`) as the intake last
# recorded it, written in the same transaction as its alerts, events and policy inbox rows
# (store/resends.py): a byte-identical resend whose group still holds this digest, and whose
# alerts are still all firing, is answered without touching them. `digest` "" = the content
# is not known (a truncated webhook). The row goes with its receipt (retention).
webhook_groups = Table(
    "webhook_groups",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("digest", String(64), nullable=False),
    Column("receipt_id", Id, ForeignKey("webhook_receipts.id"), nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)
Index("ix_webhook_groups_receipt", webhook_groups.c.receipt_id)

# Incidents (store/incidents.py; the model: gateway/policy/incident.py): what one card speaks
# for, one escalation pages for and one ack covers. `state` is the policy's JSON; the other
# columns are what the console, the API and the ack read. `key` says what groups its alerts
# (the Alertmanager group, or job + alertname), `key_hash` indexes it: at most one open
# (firing) incident per key. `cause_alert_id`: the alert its card is about (chosen again
# when a better cause arrives, issue 37); `due_at`: a follow-up card waits until then.
incidents = Table(
    "incidents",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=False),
    Column("key_hash", String(64), nullable=False),
    Column("key", Text, nullable=False),
    Column("status", String(16), nullable=False),  # firing | resolved
    Column("priority", String(2), nullable=False),
    Column("job", Text, nullable=False, default=""),
    Column("cause", Text, nullable=False, default=""),  # alertname/component
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
# PostgreSQL hands out incident ids from this sequence (store/incidents.py reserve_ids); SQLite
# has no sequences (one writer: the next after the largest).
incident_ids = Sequence("incident_ids", metadata=metadata)
OPEN_INCIDENT = text("status = 'firing'")
Index(
    "uq_incidents_open_key",
    incidents.c.key_hash,
    unique=True,
    sqlite_where=OPEN_INCIDENT,
    postgresql_where=OPEN_INCIDENT,
)
Index("ix_incidents_due", incidents.c.due_at)
Index("ix_incidents_status", incidents.c.status, incidents.c.id)

# Which incident each alert occurrence is in: exactly one, from the policy's transaction that
# first planned it. `role`: cause (the alert the card is about) or member; `group_key`: the
# Alertmanager group it came in (an incident may later span several groups, issue 37).
incident_alerts = Table(
    "incident_alerts",
    metadata,
    Column("alert_id", Id, ForeignKey("alerts.id"), primary_key=True, autoincrement=False),
    Column("incident_id", Id, ForeignKey("incidents.id"), nullable=False),
    Column("role", String(16), nullable=False),
    Column("group_key", Text, nullable=False, default=""),
    Column("joined_at", UTCDateTime, nullable=False),
)
Index("ix_incident_alerts_incident", incident_alerts.c.incident_id)
