"""Acknowledging an alert: one behaviour behind the API, the CLI and the Feishu card button.

An ack acknowledges the alert's incident (gateway/policy/incident.py): all its alerts, once
(a second ack changes nothing). It records who and when, with an optional comment (kept in
the alerts' `acked` events and shown on the redrawn card), stops the incident's phone
escalation everywhere, and queues an `ack` notification so the chat cards show who took it:
where the incident's cards went (`ack_routes`): the same channels, a TrainingJob's own route
(`feishu_job`, its `job_route`), and on a Feishu app card already sent, that card redrawn in
place (its message_id; Feishu updates cards for 14 days) rather than a new one posted. The
redrawn card is the incident's last card (its counts and nodes) with who acknowledged it.
An alert in no incident (stored before incidents were kept) is acknowledged alone.
"Escalate now" (`escalate_now`) calls the next step of a running escalation at once, and
records who asked in the alert's history (an `escalated` event).
With a duration and an Alertmanager configured, it also silences the incident in
Alertmanager (after the ack is committed: a slow Alertmanager never delays the ack):
stages/services/silences.py says what the silences match.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.gateway.access import VIA_TEXT
from trainsentry.gateway.policy.payload_build import idempotency_key
from trainsentry.gateway.policy.route import CHANNEL_KINDS, JOB_CHANNEL
from trainsentry.gateway.stages.services.ackers import Ackers
from trainsentry.gateway.stages.services.paging import Paging
from trainsentry.gateway.stages.services.silences import (
    create_silences,
    silence_states,
    silence_targets,
)
from trainsentry.labels import NODE_LABELS
from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import OutboundNotification
from trainsentry.notifiers.payload_contract import NotificationPayload
from trainsentry.store import alert_state
from trainsentry.store.cards import CardRow, alert_cards, group_cards
from trainsentry.store.console_incidents import incident_alert
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.incidents import StoredIncident, acknowledge_incident, incident_of_alert
from trainsentry.store.writes import insert_notifications

log = logging.getLogger("trainsentry.ack")

# Where an ack can be shown: the chat channels (route.py's `feishu` kind), a TrainingJob's own
# Feishu route and the console.
CHAT_CHANNELS = frozenset({*CHANNEL_KINDS["feishu"], JOB_CHANNEL, "console"})
# Channels that redraw the card they sent (a payload's `message_id`, FeishuAppNotifier).
REDRAWN_CHANNELS = frozenset({"feishu_app", JOB_CHANNEL})
# Feishu updates a card for 14 days after it was sent (im/v1/messages PATCH); an older card
# gets a new one. The hour of margin covers the time the ack waits in the outbox.
CARD_UPDATE_WINDOW = timedelta(days=14) - timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class AckRoute:
    """One `ack` notification: its channel, the card it redraws, the job route it takes."""

    channel: str
    message_id: str | None = None
    job_route: dict[str, Any] | None = None


def ack_routes(cards: list[CardRow], channels: Collection[str], now: datetime) -> list[AckRoute]:
    """Pure: where an alert's ack is shown, given its card rows (`store/cards.py`, newest
    first) and this gateway's ack channels (`channels`, configured CHAT_CHANNELS).

    - The ack goes the way the alert's cards went: to each ack channel that has a card of
      the alert not cancelled (a `feishu_job` card's `job_route` kept, its owners not
      mentioned again), and to the console. So a TrainingJob's alert is acked in the job's
      chat or bot, never in the global chats its route replaced.
    - On `feishu_app` and `feishu_job`, the newest card sent with a provider id less than
      CARD_UPDATE_WINDOW ago is redrawn (`message_id`); otherwise a new card is posted.
    - An alert with no card rows at all (none planned, or purged by retention) is acked
      on every ack channel but `feishu_job` (which needs a job's route).
    """
    wanted = sorted(set(channels) & CHAT_CHANNELS)
    if not cards:
        return [AckRoute(name) for name in wanted if name != JOB_CHANNEL]
    shown = [c for c in cards if c.channel in wanted and c.status != "cancelled"]
    routes: list[AckRoute] = []
    for name in wanted:
        mine = [c for c in shown if c.channel == name]
        if not mine and name != "console":
            continue
        route = None
        if name == JOB_CHANNEL:
            route = next((c.job_route for c in mine if c.job_route), None)
            if route is None:
                continue  # a job card without its route cannot be sent again
        message_id = None
        if name in REDRAWN_CHANNELS:
            message_id = next(
                (
                    c.provider_id
                    for c in mine
                    if c.status == "sent"
                    and c.provider_id
                    and c.sent_at is not None
                    and now - c.sent_at < CARD_UPDATE_WINDOW
                ),
                None,
            )
        job_route = {**route, "owners": []} if route is not None else None
        routes.append(AckRoute(name, message_id, job_route))
    return routes


@dataclass(frozen=True, slots=True)
class AckResult:
    alert_id: int
    acked_by: str
    acked_at: datetime
    already_acked: bool
    escalation_stopped: bool
    status: str
    silence_id: str | None = None  # the first of `silence_ids`
    silence_error: str | None = None
    comment: str | None = None
    # what the chat channels render for the ack (the card redrawn with who acknowledged)
    payload: dict[str, Any] = field(default_factory=dict, compare=False)
    incident_id: int | None = None  # the incident acknowledged (None: the alert alone)
    alerts_acked: int = 1  # the alerts this ack acknowledged (0: all were already)
    silence_ids: tuple[str, ...] = ()  # one per alertname of the incident

    def to_json(self) -> dict[str, Any]:
        return {
            "alert_id": self.alert_id,
            "incident_id": self.incident_id,
            "alerts_acked": self.alerts_acked,
            "acked_by": self.acked_by,
            "acked_at": self.acked_at.isoformat(),
            "already_acked": self.already_acked,
            "escalation_stopped": self.escalation_stopped,
            "status": self.status,
            "silence_id": self.silence_id,
            "silence_ids": list(self.silence_ids),
            "silence_error": self.silence_error,
            "comment": self.comment,
        }


@dataclass(frozen=True, slots=True)
class EscalateResult:
    """ "Escalate now": who asked, when, and who is being called."""

    alert_id: int
    by: str
    at: datetime
    calls: tuple[dict[str, Any], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "alert_id": self.alert_id,
            "escalated_by": self.by,
            "at": self.at.isoformat(),
            "calls": list(self.calls),
        }


class EscalationRefused(Exception):
    """ "Escalate now" cannot be done: `status` 404 (no alert) or 409 (nothing to escalate)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


async def job_notices(conn: Connection, state: Mapping[str, Any]) -> list[CardRow]:
    """The cards that told a job of its incident when the incident had none of its own: a
    job's own incident folded into an infrastructure incident (infra.py: its job's notice
    and page, outbox group `infra:<element>`), newest first; never the infrastructure
    incident's own cards nor another job's, so a team's ack is shown where its job was told.
    Empty for the cluster's incidents (realm "") and incidents of no element."""
    element, job = state.get("infra"), state.get("job")
    if not element or not job or not state.get("realm"):
        return []
    rows = await group_cards(conn, f"infra:{element}", ("infra",))
    return [row for row in rows if (row.payload or {}).get("job") == job]


class AckService:
    def __init__(
        self,
        engine: Engine,
        *,
        channels: Collection[str],
        clock: Callable[[], datetime],
        paging: Paging | None = None,
        silences: SilenceClient | None = None,
        lock: asyncio.Lock | None = None,
        ackers: Ackers | None = None,
        node_labels: tuple[str, ...] = NODE_LABELS,
    ) -> None:
        self._engine = engine
        self._node_labels = node_labels  # policy.node_labels: the silences' node (silences.py)
        self._ackers = ackers or Ackers()  # who acknowledged, as configured (ackers.py)
        # The policy's lock (stages/planning/worker.py): on SQLite a transaction reads before
        # it takes the write lock, so the ticker could plan calls from the escalation state it read
        # before this ack committed, and write that state back over the ack.
        self._lock = lock or asyncio.Lock()
        self._chat_channels = sorted(CHAT_CHANNELS & set(channels))  # see ack_routes
        self._clock = clock
        self._paging = paging
        self._silences = silences

    async def acknowledge(
        self,
        alert_id: int,
        who: str,
        silence: timedelta | None = None,
        comment: str | None = None,
        via: str | None = None,
    ) -> AckResult | None:
        """None when there is no such alert. A comment is kept with the `acked` event, or
        as a `comment` event when the alert was acknowledged already; the card shows the
        first ack's comment. `who` (an open_id or a name) that is a configured person is
        recorded by that person's name (ackers.py), what was given kept in the event.
        `via`: how `who` signed in (gateway/access.py: proxy, break-glass, api-token),
        kept in the event and on the silence's `createdBy`."""
        now = self._clock()
        async with self._lock, self._engine.begin() as conn:
            row = await alert_state.lock_alert(conn, alert_id)
            if row is None:
                return None
            given, who = who, self._ackers.of(who, row.labels).name
            said = {"as": given} if given != who else {}
            if via is not None:
                said["via"] = via
            incident = await incident_of_alert(conn, alert_id)
            if incident is not None:
                result = await self._acknowledge_incident(
                    conn, row, incident, who, now, silence, comment, said
                )
            else:
                result = await self._acknowledge_alert(conn, row, who, now, silence, comment, said)
        return await self._finish(result, row, _audit(who, via), silence, now)

    async def acknowledge_incident(
        self,
        incident_id: int,
        who: str,
        silence: timedelta | None = None,
        comment: str | None = None,
        via: str | None = None,
    ) -> AckResult | None:
        """The ack of an incident (the incidents API, the console): through one of its
        alerts, since an ack of any of them acknowledges it all. None: no such incident."""
        async with self._engine.connect() as conn:
            alert_id = await incident_alert(conn, incident_id)
        if alert_id is None:
            return None
        return await self.acknowledge(alert_id, who, silence, comment, via=via)

    async def _acknowledge_alert(
        self,
        conn: Connection,
        row: Any,
        who: str,
        now: datetime,
        silence: timedelta | None,
        comment: str | None,
        said: dict[str, str],
    ) -> AckResult:
        """The ack of an alert in no incident (stored before incidents were kept)."""
        alert_id = int(row.id)
        already = row.acked_at is not None
        acked_by, acked_at = (row.acked_by, row.acked_at) if already else (who, now)
        if not already:
            await alert_state.acknowledge(conn, alert_id, who, now, comment, said)
        elif comment:
            await alert_state.record_event(
                conn, alert_id, "comment", now, {"by": who, "comment": comment, **said}
            )
        if already:
            comment = await alert_state.ack_comment(conn, alert_id)
        stopped = False
        if self._paging is not None:
            stopped = await self._paging.acknowledge(conn, alert_id, who, now)
        payload = self._payload(row, str(acked_by), now, silence)
        self._mention(payload, row.labels)
        if comment:
            payload["ack_comment"] = comment
        if not already:
            routes = ack_routes(await alert_cards(conn, alert_id), self._chat_channels, now)
            await insert_notifications(conn, self._drafts(row, payload, routes), now)
        return AckResult(
            alert_id,
            str(acked_by),
            acked_at,
            already,
            stopped,
            str(row.status),
            comment=comment,
            payload=dict(payload),
            alerts_acked=0 if already else 1,
        )

    async def _finish(
        self, result: AckResult, row: Any, who: str, silence: timedelta | None, now: datetime
    ) -> AckResult:
        """After the ack's commit: the silence, if asked for (a slow Alertmanager never
        delays the ack), and the log line."""
        if silence is not None:
            targets = await silence_targets(
                self._engine, dict(row.labels), result.incident_id, self._node_labels
            )
            result = await self._silence(result, targets, who, silence, now)
        log.info(
            "alert acknowledged alert_id=%d incident=%s by=%s already=%s alerts=%d "
            "escalation_stopped=%s",
            result.alert_id,
            result.incident_id,
            who,
            result.already_acked,
            result.alerts_acked,
            result.escalation_stopped,
        )
        return result

    async def _acknowledge_incident(
        self,
        conn: Connection,
        row: Any,
        incident: StoredIncident,
        who: str,
        now: datetime,
        silence: timedelta | None,
        comment: str | None,
        said: dict[str, str],
    ) -> AckResult:
        """The ack of the incident `row`'s alert is in: all its alerts, its escalation, and
        its card redrawn (or re-sent) where its cards went, in the caller's transaction."""
        already = incident.acked_at is not None
        acked_by, acked_at = (incident.acked_by, incident.acked_at) if already else (who, now)
        acked: list[int] = []
        if not already:
            acked = await acknowledge_incident(conn, incident.id, who, now, comment, said)
        elif comment:
            detail = {"by": who, "comment": comment, "incident": incident.id, **said}
            await alert_state.record_event(conn, row.id, "comment", now, detail)
        if already:
            comment = await alert_state.ack_comment(conn, row.id)
        stopped = False
        if self._paging is not None:
            paged = incident.state.get("page_alert_id")
            stopped = await self._paging.acknowledge(conn, int(paged or row.id), who, now)
        group = f"incident:{incident.id}"
        cards = await group_cards(conn, group) or await job_notices(conn, incident.state)
        shown = next((c.payload for c in cards if c.payload and c.status != "cancelled"), None)
        base: dict[str, Any] = dict(shown or self._payload(row, str(acked_by), now, None))
        payload = cast(NotificationPayload, base)
        for transient in ("redraw", "message_id", "on_call", "mentions"):
            base.pop(transient, None)
        base.pop("acked_by_open_id", None)
        base.update(event="acked", acked_by=str(acked_by), at=now.isoformat())
        self._mention(payload, row.labels)
        if silence is not None:
            payload["silenced_until"] = (now + silence).isoformat()
        if comment:
            payload["ack_comment"] = comment
        if not already:
            routes = ack_routes(cards, self._chat_channels, now)
            drafts = self._drafts(row, payload, routes, group)
            await insert_notifications(conn, drafts, now)
        return AckResult(
            row.id,
            str(acked_by),
            acked_at or now,
            already,
            stopped,
            str(row.status),
            comment=comment,
            payload=base,
            incident_id=incident.id,
            alerts_acked=len(acked),
        )

    async def escalate_now(self, alert_id: int, who: str, via: str | None = None) -> EscalateResult:
        """Calls the next step of `alert_id`'s running escalation now; raises
        EscalationRefused (404: no such alert; 409: no phone escalation, or it is not
        running: never paged, acknowledged, resolved or exhausted). `via`: how `who` signed
        in, kept in the `escalated` event."""
        now = self._clock()
        if self._paging is None:
            raise EscalationRefused(409, "this gateway has no phone escalation")
        async with self._lock, self._engine.begin() as conn:
            row = await alert_state.lock_alert(conn, alert_id)
            if row is None:
                raise EscalationRefused(404, f"no alert {alert_id}")
            try:
                drafts = await self._paging.escalate_now(conn, alert_id, who, now)
            except (LookupError, ValueError) as exc:
                raise EscalationRefused(409, f"cannot escalate alert {alert_id}: {exc}") from None
            calls = tuple(
                {"person": d.payload["person"]["name"], "layer": d.payload["layer"]}
                for d in drafts
                if d.alert_id == alert_id
            )
            detail: dict[str, Any] = {"by": who, "calls": list(calls)}
            if via is not None:
                detail["via"] = via
            await alert_state.record_event(conn, alert_id, "escalated", now, detail)
            await insert_notifications(conn, drafts, now)
        log.info("escalated now alert_id=%d by=%s via=%s calls=%d", alert_id, who, via, len(calls))
        return EscalateResult(alert_id, who, now, calls)

    async def card_message(self, notification: OutboundNotification) -> str | None:
        """The message_id of the card an `ack` or an incident's redraw updates, read as it is
        sent (the channels' `find_card`): one drafted while the card was still queued could
        not name it, and the outbox sends it only after that card (one group per channel).
        An incident's cards are its outbox group's; an alert's (before incidents), its own."""
        alert_id = notification.payload.get("alert_id")
        redraw = notification.kind == "ack" or bool(notification.payload.get("redraw"))
        group = notification.group_key
        if not redraw or not (group.startswith("incident:") or isinstance(alert_id, int)):
            return None
        async with self._engine.connect() as conn:
            if group.startswith("incident:"):
                cards = await group_cards(conn, group)
            else:
                assert isinstance(alert_id, int)
                cards = await alert_cards(conn, alert_id)
        routes = ack_routes(cards, [notification.channel], self._clock())
        return next((r.message_id for r in routes if r.channel == notification.channel), None)

    def _mention(self, payload: NotificationPayload, labels: Any) -> None:
        """The configured open_id of the acknowledger, for the card to mention (none for
        anyone the configuration does not know: their name stays plain text)."""
        open_id = self._ackers.of(payload["acked_by"], labels).open_id
        if open_id:
            payload["acked_by_open_id"] = open_id

    @staticmethod
    def _payload(
        row: Any, who: str, now: datetime, silence: timedelta | None
    ) -> NotificationPayload:
        payload: NotificationPayload = {
            "priority": row.priority or "P3",
            "status": row.status,
            "event": "acked",
            "alert_id": row.id,
            "alertname": row.alertname,
            "fingerprint": row.fingerprint,
            "labels": dict(row.labels),
            "annotations": dict(row.annotations),
            "starts_at": row.starts_at.isoformat(),
            "acked_by": who,
            "at": now.isoformat(),
        }
        if row.job_name:
            payload["job"] = (
                f"{row.job_namespace}/{row.job_name}" if row.job_namespace else row.job_name
            )
        if silence is not None:
            payload["silenced_until"] = (now + silence).isoformat()
        return payload

    @staticmethod
    def _drafts(
        row: Any, payload: NotificationPayload, routes: list[AckRoute], group: str = ""
    ) -> list[NotificationDraft]:
        who = payload["acked_by"]
        drafts = []
        for route in routes:
            extra: dict[str, Any] = {}
            if route.message_id:
                extra["message_id"] = route.message_id
            if route.job_route is not None:
                extra["job_route"] = route.job_route
            drafts.append(
                NotificationDraft(
                    channel=route.channel,
                    kind="ack",
                    priority=Priority(payload["priority"]),
                    idempotency_key=idempotency_key("ack", route.channel, group or str(row.id)),
                    payload={**payload, **extra},
                    alert_id=row.id,
                    # after the incident's (or the alert's) own cards
                    group_key=group or f"alert:{row.fingerprint}",
                    reason=f"acknowledged by {who}",
                )
            )
        return drafts

    async def silence_states(self, ids: Sequence[str]) -> dict[str, str] | None:
        """Alertmanager's state of these silences (stages/services/silences.py `silence_states`);
        None: this gateway has no Alertmanager for silences."""
        if self._silences is None:
            return None
        return await silence_states(self._silences, ids)

    async def _silence(
        self,
        result: AckResult,
        targets: list[dict[str, str]],
        who: str,
        duration: timedelta,
        now: datetime,
    ) -> AckResult:
        if self._silences is None:
            return _replace(result, silence_error="no Alertmanager configured for silences")
        made, error = await create_silences(
            self._engine, self._silences, targets, result.alert_id, result.incident_id,
            who=who, duration=duration, now=now,
        )  # fmt: skip
        return _replace(
            result,
            silence_id=made[0] if made else None,
            silence_ids=made,
            silence_error=error,
        )


def _audit(who: str, via: str | None) -> str:
    """Pure: `who` with how they signed in, as the silence's creator and the log name them
    (gateway/access.py `VIA_TEXT`); `who` alone for a card's button (no `via`)."""
    text = VIA_TEXT.get(via, via) if via is not None else None
    return who if text is None or who.endswith(f"({text})") else f"{who} ({text})"


def _replace(result: AckResult, **changes: Any) -> AckResult:
    from dataclasses import replace

    return replace(result, **changes)
