"""What one call of the policy drafts (pure): the routed channels of each notice, its
payload and idempotency key. `Drafts` gathers them as decide.py's steps run; `flush`
drafts what the changed incidents owe (incident_cards.py), once per call or batch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert, JobRef, NotificationDraft, Priority
from trainsentry.gateway.policy import infra_hold
from trainsentry.gateway.policy.dedup import Decision
from trainsentry.gateway.policy.incident import FIRING, RESOLVED, IncidentBook
from trainsentry.gateway.policy.incident_cards import headline, incident_drafts
from trainsentry.gateway.policy.infra import INFRA_KIND, InfraFold, InfraMessage
from trainsentry.gateway.policy.infra_payload import InfraMessageKind
from trainsentry.gateway.policy.payload_build import (
    ALERT_KIND,
    STORM_KIND,
    idempotency_key,
    storm_payload,
)
from trainsentry.gateway.policy.route import JobRoute, escalation_for, routed, routed_apart
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.storm import StormMessage
from trainsentry.notifiers.payload_contract import JobRoutePayload


@dataclass(slots=True)
class Drafts:
    """What one call of the policy drafts, gathered as its steps run: routing, payloads and
    idempotency keys of storm, infrastructure and incident notices."""

    policy: Policy
    channels: Collection[str] | None
    drafts: list[NotificationDraft] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    messages: list[StormMessage] = field(default_factory=list)
    collapsed: int = 0
    unconfigured: list[str] = field(default_factory=list)
    # TrainingJobs' own routes (spec.alerting), by job; each applies to its own job's alerts
    job_routes: Mapping[JobRef, JobRoute] = field(default_factory=dict)
    job_extra: JobRoutePayload | None = None  # of the last `_route`
    place: Mapping[str, str] | None = None  # the alert's node's place in the topology
    infra: InfraFold | None = None  # set when the alert's node has a place
    infra_folded: int = 0
    incidents: IncidentBook | None = None  # the incidents of the call (or of the batch)
    group_key: str = ""  # the Alertmanager group of the change (AlertChange.group_key)
    updatable: Collection[str] = ()  # channels that update a card in place (Feishu app)
    # keys of the elements whose infrastructure incident is open (infra_hold.release)
    infra_open: Collection[str] = ()

    def _route(
        self, priority: Priority, labels: Mapping[str, str], *, paging: bool
    ) -> tuple[tuple[str, ...], str]:
        decision, self.job_extra = routed(
            priority,
            labels,
            self.policy,
            configured=self.channels,
            job_routes=self.job_routes,
            paging=paging,
        )
        self.unconfigured.extend(decision.unconfigured)
        return decision.channels, decision.route_id

    def routed_apart(self, alert: Alert) -> bool:
        """`incident.OwnRoute`: whether the alert's job (or namespace) has a route of its own
        (route.py `routed_apart`)."""
        return routed_apart(
            alert.labels, self.policy, configured=self.channels, job_routes=self.job_routes
        )

    def _pager(self, priority: Priority, labels: Mapping[str, str]) -> str | None:
        """Who a page of `priority` routed by `labels` calls: its job's roster
        (`roster:<job>`), else the escalation policy its route follows (`policy:<name>`,
        "" for the default layers); None when the route has no paging channel."""
        decision, extra = routed(
            priority, labels, self.policy, configured=self.channels, job_routes=self.job_routes
        )
        if not set(decision.channels) & set(self.policy.routing.paging_channels):
            return None
        if extra is not None and extra.get("roster"):
            return f"roster:{extra.get('job', '')}"
        return f"policy:{escalation_for(decision.route_id, priority, self.policy)}"

    def pages_apart(
        self, priority: Priority, labels: Mapping[str, str], incident: Mapping[str, str]
    ) -> bool:
        """`infra.PagesApart`: whether a page of `priority` about the job of `labels` calls
        other people than the infrastructure incident's page (routed by `incident`): its
        job's roster, or another escalation policy. A job of the gateway's own route calls
        whom the incident's page calls: no second page."""
        mine = self._pager(priority, labels)
        return mine is not None and mine != self._pager(priority, incident)

    def incident_route(
        self, priority: Priority, labels: Mapping[str, str], paging: bool
    ) -> tuple[tuple[str, ...], str, dict[str, Any]]:
        """`incident.Router`: an incident's channels, route id and route payload fields."""
        channels, route_id = self._route(priority, labels, paging=paging)
        extra: dict[str, Any] = {"job_route": self.job_extra} if self.job_extra is not None else {}
        return channels, route_id, extra

    def flush(self, now: datetime) -> None:
        """Drafts what the changed incidents owe their channels (incident.py)."""
        book = self.incidents
        if book is None:
            return
        for state in sorted(book.changed.values(), key=lambda s: s.id):
            due = state.due_at is not None and state.due_at <= now
            if not state.dirty and not due and not state.unknown:
                continue
            if book.settle(state, now):  # unknown resolutions confirmed (incident.py)
                headline(state, RESOLVED, {})
                state.trigger = state.trigger or f"settled:{now.isoformat()}"
            if infra_hold.release(state, now, self.infra_open):  # else it waits (until due)
                self.drafts.extend(
                    incident_drafts(
                        state,
                        self.policy,
                        now,
                        route=self.incident_route,
                        updatable=self.updatable,
                        paging_channels=self.policy.routing.paging_channels,
                        kind=ALERT_KIND,
                    )
                )
            confirm = book.next_confirmation(state)
            if confirm is not None and state.status == FIRING:
                state.due_at = min(confirm, state.due_at) if state.due_at else confirm

    def infra_messages(self, messages: Iterable[InfraMessage]) -> None:
        for message in messages:
            channels, route_id = self._route(
                message.priority, message.labels, paging=message.paging
            )
            extra = {"job_route": self.job_extra} if self.job_extra is not None else {}
            if message.kind is InfraMessageKind.JOB_PAGE:  # its notice told the chats
                channels = tuple(c for c in channels if c in self.policy.routing.paging_channels)
            for channel in channels:
                payload = dict(message.payload, route=route_id, **extra)
                self.drafts.append(
                    NotificationDraft(
                        channel=channel,
                        kind=INFRA_KIND,
                        priority=message.priority,
                        idempotency_key=idempotency_key(*message.ident, channel),
                        payload=payload,
                        alert_id=message.alert_id,
                        group_key=f"infra:{message.key}",
                        reason=payload["reason"],
                    )
                )

    def storm_messages(self, messages: Iterable[StormMessage]) -> None:
        for message in messages:
            self.messages.append(message)
            channels, route_id = self._route(message.priority, message.labels, paging=False)
            payload = storm_payload(message, self.policy, route_id=route_id)
            if self.job_extra is not None:
                payload["job_route"] = self.job_extra
            for channel in channels:
                self.drafts.append(
                    NotificationDraft(
                        channel=channel,
                        kind=STORM_KIND,
                        priority=message.priority,
                        idempotency_key=idempotency_key(
                            STORM_KIND,
                            message.kind.value,
                            message.job,
                            message.episode,
                            str(message.seq),
                            channel,
                        ),
                        payload=dict(payload),
                        group_key=f"storm:{message.job}",
                        reason=payload["reason"],
                    )
                )
