"""The gateway's own Prometheus metrics (one registry per app, so tests can run several), and
the policy's decision counters (`PolicyMetrics.observe`, called by the planning stage)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trainsentry.alerts import NotificationDraft
from trainsentry.gateway.policy.decide import ChangeResult, TickResult
from trainsentry.gateway.policy.storm import StormMessageKind
from trainsentry.store.retention import Purged, StoreSize

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class GatewayMetrics:
    """The gateway's metrics, one registry; each group is added by the method named for it."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._add_intake(self.registry)
        self._add_planning(self.registry)
        self._add_delivery(self.registry)
        self._add_routes(self.registry)
        self._add_store(self.registry)

    def _add_intake(self, r: CollectorRegistry) -> None:
        """Webhook intake (stages/intake.py, stages/truncated.py)."""
        self.receipts = Counter(
            "trainsentry_webhook_receipts_total",
            "Webhook requests by outcome (stored, replay, resend: an unchanged group re-sent, "
            "rejected, unauthorized, too_large, unavailable)",
            ["outcome"],
            registry=r,
        )
        self.alerts_stored = Counter(
            "trainsentry_alerts_stored_total", "New alert occurrences stored", registry=r
        )
        self.alert_changes = Counter(
            "trainsentry_alert_changes_total", "Alert state changes recorded", ["kind"], registry=r
        )
        self.duplicates = Counter(
            "trainsentry_alerts_duplicate_total",
            "Alerts received again without a change (Alertmanager repeats, retries, HA peers)",
            registry=r,
        )
        self.truncated = Counter(
            "trainsentry_webhook_truncated_alerts_total",
            "Alerts Alertmanager left out of webhooks (max_alerts); fetched from its API when "
            "TRAINSENTRY_ALERTMANAGER_URL is set",
            registry=r,
        )
        self.intake_latency = Histogram(
            "trainsentry_intake_latency_seconds",
            "Time from request to committed answer",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.journal_depth = Gauge(
            "trainsentry_intake_journal_depth",
            "Alerts of answered webhooks waiting in the intake journal to be recorded",
            registry=r,
        )
        self.journal_oldest_age = Gauge(
            "trainsentry_intake_journal_oldest_age_seconds",
            "How long the oldest webhook waiting in the intake journal has waited (0: none)",
            registry=r,
        )

    def _add_planning(self, r: CollectorRegistry) -> None:
        """The alert policy's inbox (stages/planning/)."""
        self.policy_inbox_depth = Gauge(
            "trainsentry_policy_inbox_depth",
            "Alert changes stored but not yet handled by the alert policy",
            registry=r,
        )
        self.policy_inbox_oldest_age = Gauge(
            "trainsentry_policy_inbox_oldest_age_seconds",
            "How long the oldest change waiting for the alert policy has waited, by the "
            "urgency it is planned with (the alert's priority label; unlabelled counts as P2)",
            ["urgency"],
            registry=r,
        )
        self.policy_planned = Counter(
            "trainsentry_policy_planned_total",
            "Alert changes handled by the alert policy (classified, deduplicated, routed)",
            registry=r,
        )
        self.policy_batches = Counter(
            "trainsentry_policy_batches_total",
            "Planning transactions this gateway committed (with PostgreSQL replicas: how a "
            "storm's batches split between them)",
            registry=r,
        )
        self.policy_failed = Counter(
            "trainsentry_policy_failed_total",
            "Alert changes the alert policy failed on repeatedly and set aside: stored, but "
            "not notified (the gateway log has each one with its traceback)",
            registry=r,
        )

    def _add_delivery(self, r: CollectorRegistry) -> None:
        """The outbox and the channels' sends (stages/outbox.py)."""
        self.outbox_depth = Gauge(
            "trainsentry_outbox_depth",
            "Notifications not yet sent",
            ["channel", "status"],
            registry=r,
        )
        self.outbox_oldest_age = Gauge(
            "trainsentry_outbox_oldest_pending_age_seconds",
            "Age of the oldest notification not yet sent (pending or mid-send), by its priority "
            "(0 when none)",
            ["priority"],
            registry=r,
        )
        self.sends = Counter(
            "trainsentry_notifications_sent_total",
            "Channel sends by outcome (sent, retry, rate_limited, dead)",
            ["channel", "outcome"],
            registry=r,
        )
        self.send_latency = Histogram(
            "trainsentry_channel_send_seconds",
            "Time a channel took to accept a notification",
            ["channel"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _add_routes(self, r: CollectorRegistry) -> None:
        """Where cards go: Feishu callbacks, TrainingJobs' own routes."""
        # Feishu card callbacks mounted without an encrypt key (assemble.create_app)
        self.feishu_callbacks_unsigned = Gauge(
            "trainsentry_feishu_callbacks_unsigned",
            "1 when Feishu card callbacks are accepted without an encrypt key: unsigned, "
            "proven by the static verification token alone (docs/channels.md); else 0",
            registry=r,
        )
        # TrainingJobs' own alert routes (stages/services/job_alerting.py)
        self.job_alerting_not_ready = Gauge(
            "trainsentry_job_alerting_not_ready",
            "TrainingJobs whose spec.alerting cannot be followed (condition AlertingReady=False)",
            registry=r,
        )
        self.job_route_fallbacks = Counter(
            "trainsentry_job_route_fallbacks_total",
            "Cards sent to the gateway's own Feishu route because a TrainingJob's own chat or "
            "bot failed, by reason",
            ["reason"],
            registry=r,
        )

    def _add_store(self, r: CollectorRegistry) -> None:
        """The store's size and the retention purge (gateway/stages/services/retention.py)."""
        self.store_size = Gauge(
            "trainsentry_store_size_bytes",
            "Size of the store: the SQLite file with its WAL and shared-memory files, or "
            "pg_database_size on PostgreSQL",
            ["backend"],
            registry=r,
        )
        self.store_volume_free = Gauge(
            "trainsentry_store_volume_free_bytes",
            "Bytes the gateway may still write on the volume of its SQLite store (absent on "
            "PostgreSQL)",
            ["volume"],
            registry=r,
        )
        self.store_volume_size = Gauge(
            "trainsentry_store_volume_size_bytes",
            "Size of the volume of the SQLite store (absent on PostgreSQL)",
            ["volume"],
            registry=r,
        )
        self.purged = Counter(
            "trainsentry_store_purged_rows_total",
            "Rows the retention deleted from the store, by table",
            ["table"],
            registry=r,
        )

    def record_store_size(self, size: StoreSize) -> None:
        backend = "postgresql" if size.volume is None else "sqlite"
        self.store_size.labels(backend).set(size.bytes)
        if size.volume is not None and size.volume_free_bytes is not None:
            self.store_volume_free.labels(size.volume).set(size.volume_free_bytes)
        if size.volume is not None and size.volume_size_bytes is not None:
            self.store_volume_size.labels(size.volume).set(size.volume_size_bytes)

    def record_purged(self, done: Purged) -> None:
        for table in ("receipts", "alerts", "alert_events", "notifications", "callback_events"):
            count = getattr(done, table)
            if count:
                self.purged.labels(table).inc(count)


class PolicyMetrics:
    """Counters for the policy's decisions (issue 3, part 6). One instance per registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        kwargs: dict[str, Any] = {} if registry is None else {"registry": registry}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.classified = Counter(
            "trainsentry_alerts_classified_total",
            "Alert changes classified, by priority.",
            ["priority"],
            **kwargs,
        )
        self.notices = Counter(
            "trainsentry_policy_notices_total",
            "Alert notices the policy decided to announce (before storm collapse), by kind.",
            ["notice"],
            **kwargs,
        )
        self.suppressed = Counter(
            "trainsentry_notifications_suppressed_total",
            "Alert changes not announced, by reason (repeat, stale, flapping, held, "
            "resolve-unseen, storm).",
            ["reason"],
            **kwargs,
        )
        self.storms = Counter(
            "trainsentry_storms_total",
            "Alert storms announced (per job): entered, with an incident folded into them.",
            **kwargs,
        )
        self.storm_messages = Counter(
            "trainsentry_storm_messages_total",
            "Storm messages produced, by kind.",
            ["kind"],
            **kwargs,
        )
        self.drafts = Counter(
            "trainsentry_notifications_drafted_total",
            "Notification drafts produced for the outbox, by channel and kind.",
            ["channel", "kind"],
            **kwargs,
        )
        self.unconfigured = Counter(
            "trainsentry_route_unconfigured_total",
            "Notifications routed to a channel this gateway has no notifier for.",
            ["channel"],
            **kwargs,
        )

    def _child(self, counter: Counter, *values: str) -> Any:
        # prometheus_client's labels() costs more than the policy's own work per alert
        key = (id(counter), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*values)
        return child

    def observe_drafts(
        self, drafts: Sequence[NotificationDraft], unconfigured: Sequence[str] = ()
    ) -> None:
        """Drafts made apart from a change's result (a batch's incidents, decide.flush)."""
        for draft in drafts:
            self._child(self.drafts, draft.channel, draft.kind).inc()
        for channel in unconfigured:
            self._child(self.unconfigured, channel).inc()

    def observe(self, result: ChangeResult | TickResult) -> None:
        child = self._child
        if isinstance(result, ChangeResult):
            child(self.classified, result.classification.priority.value).inc()
        for decision in result.decisions:
            if decision.notice is not None:
                child(self.notices, decision.notice.value).inc()
            elif decision.suppressed is not None:
                child(self.suppressed, decision.suppressed.value).inc()
        if result.collapsed:
            child(self.suppressed, "storm").inc(result.collapsed)
        if isinstance(result, ChangeResult) and result.infra_folded:
            child(self.suppressed, "infrastructure").inc(result.infra_folded)
        for message in result.storm_messages:
            child(self.storm_messages, message.kind.value).inc()
            if message.kind is StormMessageKind.STARTED:
                self.storms.inc()
        for draft in result.drafts:
            child(self.drafts, draft.channel, draft.kind).inc()
        for channel in result.unconfigured:
            child(self.unconfigured, channel).inc()
