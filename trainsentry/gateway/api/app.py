"""The gateway's HTTP surface (aiohttp): thin handlers only.

Webhook intake (`POST /api/v1/alertmanager`), the probes' hang triggers
(`POST /api/v1/hang-triggers`), the read API, the Feishu card button, retries, health and
metrics; the routes of acks and "escalate now" (ack.py), maintenance windows, on-call
and cordons are registered by the modules that own them (`add_*_routes`). Each handler
validates its request and hands it to a stage; the stages are built and started by
assemble.py and found under `GATEWAY_KEY` (pipeline.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from trainsentry.alerts import JobRef, Priority, utcnow
from trainsentry.gateway.absent import Off
from trainsentry.gateway.acting import (
    alert_target,
    api_actor,
    authorize,
    feishu_presser,
    notifications_target,
    outbox_target,
    refusal,
)
from trainsentry.gateway.api.ack import add_ack_routes
from trainsentry.gateway.api.auth import WEBHOOK_PATH as WEBHOOK_PATH
from trainsentry.gateway.api.auth import authorized as _authorized
from trainsentry.gateway.api.auth import error_response as _error
from trainsentry.gateway.api.auth import unauthorized as _unauthorized
from trainsentry.gateway.api.cordon import add_cordon_routes, card_cordon
from trainsentry.gateway.api.incidents import add_incident_routes
from trainsentry.gateway.api.maintenance import add_maintenance_routes
from trainsentry.gateway.api.nodes import get_nodes
from trainsentry.gateway.api.oncall import add_oncall_routes
from trainsentry.gateway.api.read import (
    get_alert_detail,
    get_alerts,
    get_notifications,
)
from trainsentry.gateway.api.request_body import BodyRejected, read_body, read_json_object
from trainsentry.gateway.api.trigger_checks import HANG_TRIGGER_PATH as HANG_TRIGGER_PATH
from trainsentry.gateway.api.trigger_checks import (
    Count,
    checked_trigger,
    known_answer,
    not_a_rank,
    triggers_off,
)
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway, HangTriggers
from trainsentry.gateway.policy.outbox_retry import parse_retry_request
from trainsentry.gateway.stages.hang.trigger import HangTrigger
from trainsentry.gateway.stages.intake import IntakeRejected, parse_webhook
from trainsentry.gateway.stages.truncated import fetch_group
from trainsentry.gateway.ui import add_ui_routes
from trainsentry.notifiers.feishu.callback import CardAction, action_response, card_action_handler
from trainsentry.notifiers.feishu.card import alert_card
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.store import check_reachable
from trainsentry.store.callbacks import first_delivery, forget_delivery
from trainsentry.store.errors import STORE_FAILURES, DatabaseError, StoreUnavailable
from trainsentry.store.inbox import inbox_waiting
from trainsentry.store.journal import journal_waiting
from trainsentry.store.outbox import UNSENT
from trainsentry.store.queries import (
    outbox_depth,
)
from trainsentry.store.writes import IncomingReceipt

log = logging.getLogger("trainsentry.gateway")


@dataclass(frozen=True)
class CardCallbackSettings:
    """Where Feishu posts card button presses, and the secrets that authenticate them."""

    path: str
    verification_token: str = field(repr=False)
    encrypt_key: str | None = field(default=None, repr=False)
    max_skew_s: float = 300.0  # a signed request's timestamp may be this far from now


async def receive_webhook(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    metrics = gateway.metrics
    started = time.perf_counter()
    if not _authorized(request, gateway.settings.webhook_token):
        metrics.receipts.labels("unauthorized").inc()
        return _unauthorized()
    try:
        body = await read_body(request, gateway.settings.max_body_bytes)
    except BodyRejected as exc:
        metrics.receipts.labels("too_large").inc()
        return _error(exc.status, exc.reason)
    received_at = gateway.clock()
    sha256 = hashlib.sha256(body).hexdigest()
    # the same bytes as a body stored lately: an unchanged resend needs no parse
    outcome = await gateway.writer.answer_known(sha256, received_at)
    alerts = outcome.unchanged if outcome is not None else 0
    if outcome is None:
        try:
            receipt = parse_webhook(body, received_at=received_at, body_sha256=sha256)
        except IntakeRejected as exc:
            metrics.receipts.labels("rejected").inc()
            log.info("webhook rejected reason=%r", exc.reason)
            return _error(400, exc.reason, details=exc.details)
        try:
            outcome = await gateway.writer.submit(receipt)
        except StoreUnavailable as exc:
            metrics.receipts.labels("unavailable").inc()
            return _error(503, f"store unavailable, retry: {exc}")
        alerts = len(receipt.alerts)
        if receipt.truncated_alerts > 0:
            _complete_truncated(gateway, receipt)
    metrics.intake_latency.observe(time.perf_counter() - started)
    return web.json_response(
        {
            "status": "stored",
            "receipt_id": outcome.receipt_id,
            "replay": outcome.times_received > 1,
            "alerts": alerts,
            "new": outcome.new,
            "changed": outcome.changed,
            "unchanged": outcome.unchanged,
            "resend": outcome.resend,
            "queued": outcome.queued,
        }
    )


async def receive_hang_trigger(request: web.Request) -> web.Response:
    """A stalled rank's probe (`hang/trigger.py`): a job's first trigger is stored as its one
    hang alert before the answer, then diagnosed and paged like any hang alert; the job's
    later triggers are answered from memory ("hang": "known"), within the job's turns of the
    event loop (`LoopTurns`), after the same checks (token, sender, body bounds). The
    trigger port (`api/trigger_listener.py`) answers the same, from a process of its own."""
    gateway = request.app[GATEWAY_KEY]
    hang = gateway.hang
    if isinstance(hang, Off):
        return triggers_off()
    trigger = await checked_trigger(hang.diagnoser.token, request, receipts(gateway))
    if isinstance(trigger, web.Response):
        return trigger
    return await answer_trigger(gateway, hang, trigger, request.remote)


async def answer_trigger(
    gateway: Gateway, hang: HangTriggers, trigger: HangTrigger, remote: str | None
) -> web.Response:
    """A checked trigger's answer (`checked_trigger`), from `remote`: the sender checked
    against the job's ranks, then the known hang's answer from memory, or the job's hang
    taken (stored, adopted, ended). Runs on the gateway's event loop."""
    job = JobRef(trigger.namespace, trigger.trainingjob)
    allowed = hang.sources.cached(job, remote)  # memory; None: the job's ranks are asked
    if allowed is None:
        try:
            allowed = await asyncio.wait_for(hang.sources.allowed(job, remote), timeout=5)
        except Exception as exc:  # the cluster API is down: say so, the probe retries
            return _error(503, f"cannot check the job's ranks now: {type(exc).__name__}")
    if not allowed:
        return not_a_rank(job, remote, receipts(gateway))
    await hang.hangs.turns.turn(job)  # one job's flood takes a few of each turn, not all of it
    if hang.hangs.known(trigger, remote):  # memory only: no store, no task, no await
        return known_answer()
    try:
        answer = await hang.hangs.take(trigger, remote, gateway.clock())
    except (StoreUnavailable, DatabaseError) as exc:
        gateway.metrics.receipts.labels("unavailable").inc()
        return _error(503, f"store unavailable, retry: {type(exc).__name__}")
    except IntakeRejected as exc:
        return _error(400, exc.reason, details=exc.details)
    if answer.body.get("first"):
        log.info(
            "hang trigger job=%s pg=%s seq=%d rank=%d new=%s",
            job,
            trigger.pg,
            trigger.seq,
            trigger.rank,
            answer.body.get("new"),
        )
    headers = {"Retry-After": f"{answer.retry_after_s:.0f}"} if answer.retry_after_s else None
    return web.json_response(answer.body, status=answer.status, headers=headers)


def receipts(gateway: Gateway) -> Count:
    """Counts a refusal in the gateway's receipts metric."""
    return lambda label: gateway.metrics.receipts.labels(label).inc()


def _complete_truncated(gateway: Gateway, receipt: IncomingReceipt) -> None:
    """Alertmanager cut the list (`max_alerts`): fetch the rest from its API, in the background,
    so the answer to Alertmanager is not delayed."""
    gateway.metrics.truncated.inc(receipt.truncated_alerts)
    url = gateway.settings.alertmanager_url
    log.warning(
        "webhook truncated alerts_cut=%d group=%r fetching=%s",
        receipt.truncated_alerts,
        receipt.group_key,
        bool(url),
    )
    if not url:
        return

    async def complete() -> None:
        try:
            full = await fetch_group(url, receipt, gateway.clock())
            if full is not None:
                outcome = await gateway.writer.submit(full)
                log.info(
                    "truncated webhook completed alerts=%d new=%d", len(full.alerts), outcome.new
                )
        except StoreUnavailable:
            log.warning("truncated webhook: store unavailable for the fetched alerts")
        except Exception:
            log.exception("truncated webhook: completing failed")

    task = asyncio.create_task(complete())
    gateway.background.append(task)
    task.add_done_callback(gateway.background.remove)


async def card_ack(gateway: Gateway, action: CardAction) -> dict[str, Any] | None:
    """A Feishu card button press (Acknowledge / Silence): the same AckService as the API
    (stages/services/ack.py → stages/services/paging.py: the phone stops, calls not rung yet
    are cancelled); the answer redraws the pressed card, showing who acknowledged (and the
    silence). The presser acts on the alert's incident only if the per-team check allows them
    (gateway/acting.py: a team's `feishu` list, or `admin_feishu`); else an error toast
    says why and nothing changes."""
    if action.node is not None:  # the cordon card's Approve / Dismiss (cordon.py)
        return await card_cordon(gateway, action)
    silence = timedelta(seconds=action.duration_s) if action.duration_s else None
    event_id = action.event_id
    try:
        if gateway.settings.access.divided:
            target = await alert_target(gateway, action.alert_id)
            if target is None:
                return {"toast": {"type": "error", "content": f"no alert {action.alert_id}"}}
            actor = feishu_presser(gateway, action.who)
            decision = authorize(gateway, actor, target)
            if not decision.allowed:
                return {"toast": {"type": "error", "content": decision.reason[:500]}}
        if event_id is not None:
            async with gateway.engine.begin() as conn:
                first = await first_delivery(conn, event_id, gateway.clock())
            if not first:  # a replay or a redelivery: acted on already, by some replica
                log.info("card action repeated, dropped event_id=%s", event_id)
                return {"toast": {"type": "info", "content": "already handled"}}
        try:
            result = await gateway.ack.acknowledge(
                action.alert_id, action.who, silence, comment=action.comment
            )
        except Exception:
            if event_id is not None:  # not acted on: Feishu's redelivery must be
                async with gateway.engine.begin() as conn:
                    await forget_delivery(conn, event_id)
            raise
    except STORE_FAILURES as exc:
        log.warning("card action: store unavailable (%s)", type(exc).__name__)
        return {"toast": {"type": "error", "content": "store unavailable, press again"}}
    if result is None:
        return {"toast": {"type": "error", "content": f"no alert {action.alert_id}"}}
    return action_response(action, alert_card(parse_payload(result.payload)))


async def post_notifications_retry(request: web.Request) -> web.Response:
    """POST /api/v1/notifications/retry {"by": WHO, "ids"|"channel"|"since"|"all": ...}:
    dead notifications are sent again (who and when kept with them). The API token (all), or
    a person through the trusted proxy (gateway/acting.py): `ids` of their teams' incidents'
    notifications; a selection by channel, time or `all` spans every team (admins)."""
    gateway = request.app[GATEWAY_KEY]
    token = gateway.settings.api_token
    if token is None:
        return _error(403, "re-sending needs TRAINSENTRY_API_TOKEN set on the gateway")
    actor = api_actor(request, gateway, token)
    if isinstance(actor, web.Response):
        return actor
    try:
        body = await read_json_object(request)
    except BodyRejected as exc:
        return _error(exc.status, exc.reason)
    if actor.via != "api-token":  # the proxy's person, as the audit names them
        body = {**body, "by": actor.audit_name}
    selection = parse_retry_request(body, gateway.clock())
    if isinstance(selection, str):
        return _error(400, selection)
    try:
        if actor.via != "api-token":
            target = (
                await notifications_target(gateway, list(selection.ids))
                if selection.ids
                else outbox_target("every team's dead notifications (by channel, time or all)")
            )
            if (refused := refusal(gateway, actor, target)) is not None:
                return refused
        retried = await gateway.outbox.retry_dead(
            by=selection.by,
            ids=selection.ids,
            channel=selection.channel,
            created_since=selection.created_since,
        )
    except STORE_FAILURES as exc:
        return _error(503, f"store unavailable, retry: {type(exc).__name__}")
    return web.json_response({"retried": retried, "by": selection.by})


def _card_handler(
    app: web.Application, callback: CardCallbackSettings
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The card callback route: Feishu's verification and decryption
    (notifiers/feishu/callback.py), then `card_ack`."""

    async def on_action(action: CardAction) -> dict[str, Any] | None:
        return await card_ack(app[GATEWAY_KEY], action)

    return card_action_handler(
        on_action,
        verification_token=callback.verification_token,
        encrypt_key=callback.encrypt_key,
        max_skew_s=callback.max_skew_s,
    )


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    try:
        await asyncio.wait_for(check_reachable(gateway.engine), timeout=2.0)
    except Exception as exc:
        return _error(503, f"store unreachable: {type(exc).__name__}")
    return web.json_response({"status": "ready"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    metrics = gateway.metrics
    try:
        async with gateway.engine.connect() as conn:
            depth = await asyncio.wait_for(outbox_depth(conn), timeout=2.0)
            # the journal before the inbox: an alert recorded in between is counted once
            # (in the inbox), never missed in both
            journal = await asyncio.wait_for(journal_waiting(conn), timeout=2.0)
            waiting = await asyncio.wait_for(inbox_waiting(conn), timeout=2.0)
        now = utcnow()
        metrics.journal_depth.set(journal.alerts)
        oldest = journal.oldest_at
        metrics.journal_oldest_age.set(max(0.0, (now - oldest).total_seconds()) if oldest else 0)
        metrics.policy_inbox_depth.set(sum(group.count for group in waiting))
        ages = {group.urgency: (now - group.oldest_at).total_seconds() for group in waiting}
        for priority in Priority:  # every urgency, 0 when nothing waits: rules see no gaps
            age = max(0.0, ages.get(priority.level, 0.0))
            metrics.policy_inbox_oldest_age.labels(priority.value).set(age)
        counts: Counter[tuple[str, str]] = Counter()
        pending_since: dict[str, datetime] = {}
        for group in depth:
            counts[group.channel, group.status] += group.count
            if group.status in UNSENT:  # mid-send is not sent: a hung try still ages
                earliest = pending_since.get(group.priority, group.oldest_created_at)
                pending_since[group.priority] = min(earliest, group.oldest_created_at)
        metrics.outbox_depth.clear()
        for (channel, status), count in counts.items():
            metrics.outbox_depth.labels(channel, status).set(count)
        for priority in Priority:  # every priority, 0 when none is pending (as for the inbox)
            since = pending_since.get(priority.value)
            age = (now - since).total_seconds() if since is not None else 0.0
            metrics.outbox_oldest_age.labels(priority.value).set(max(0.0, age))
    except Exception:
        log.warning("metrics: outbox depth unavailable")
    return web.Response(
        body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def add_routes(app: web.Application, card_callback: CardCallbackSettings | None = None) -> None:
    """The gateway's HTTP surface; the handlers find the assembled stages under GATEWAY_KEY."""
    app.router.add_post(WEBHOOK_PATH, receive_webhook)
    app.router.add_post(HANG_TRIGGER_PATH, receive_hang_trigger)
    app.router.add_get("/api/v1/alerts", get_alerts)
    app.router.add_get("/api/v1/alerts/{alert_id}", get_alert_detail)
    app.router.add_get("/api/v1/notifications", get_notifications)
    app.router.add_get("/api/v1/nodes", get_nodes)
    add_ack_routes(app)
    add_incident_routes(app)
    app.router.add_post("/api/v1/notifications/retry", post_notifications_retry)
    add_maintenance_routes(app)
    add_oncall_routes(app)
    add_cordon_routes(app)
    if card_callback is not None:
        app.router.add_post(card_callback.path, _card_handler(app, card_callback))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    add_ui_routes(app)
