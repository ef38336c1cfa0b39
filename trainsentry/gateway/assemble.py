"""The one place the gateway is put together: settings → store → channels → stages → HTTP app.

`app_from_settings` is what `trainsentry gateway` runs: it builds the channels
(channels.py: the single channel factory and secret reader) and the hang diagnosis from the
settings, then `create_app`. `create_app` opens the store when the app starts and starts the
stages in pipeline order; tests call it directly and may inject a `plan` (any PlanHook) in
place of the policy: then the policy's timers, the classification record and the hang hold
(which belong to the real policy, `PolicyPlan`) are left out.

The `Gateway` is constructed once, in `_open`, every part given: a feature that is off is
its absent part (absent.py: `CordonOff`, `OncallOff`, ...), never `None`; nothing assigns to
the Gateway afterwards (tests/architecture/test_gateway_whole.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from trainsentry.alerts import AlertChange, Priority, utcnow
from trainsentry.config import GatewaySettings, MaintenanceSettings, Settings
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.config.remediation import CordonSettings, Mode
from trainsentry.gateway.absent import (
    CordonOff,
    EscalationOff,
    HandoffsOff,
    HangsOff,
    JobAlertingOff,
    JobStatusOff,
    MaintenanceOff,
    OncallOff,
    TickerOff,
    TopologyOff,
)
from trainsentry.gateway.api.app import (
    HANG_TRIGGER_PATH,
    CardCallbackSettings,
    add_routes,
)
from trainsentry.gateway.api.auth import json_errors, open_endpoints
from trainsentry.gateway.api.limits import BodyLimits, ReaderPool, body_limits
from trainsentry.gateway.api.trigger_listener import TRIGGER_LISTENER_KEY, serving, trigger_listener
from trainsentry.gateway.channels import build
from trainsentry.gateway.metrics import GatewayMetrics, PolicyMetrics
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway, HangTriggers
from trainsentry.gateway.policy.escalation import Escalator
from trainsentry.gateway.policy.outbox_retry import DeliveryRules
from trainsentry.gateway.policy.route import ARCHIVE_CHANNELS
from trainsentry.gateway.policy.rules import Policy, load_policy
from trainsentry.gateway.sections import (
    build_diagnosis_parts,
    build_job_alerting,
    build_topology,
    cordon_approvers_of,
    default_escalator,
    feishu_people_of,
    oncall_of,
    paging_of,
)
from trainsentry.gateway.stages.expansion import Expander
from trainsentry.gateway.stages.hang.diagnosis import EndpointResolver, HangDiagnoser
from trainsentry.gateway.stages.hang.enrichment import HangVerdict
from trainsentry.gateway.stages.hang.trigger import JobHangs, TriggerSources
from trainsentry.gateway.stages.intake import IntakeWriter, PlanHook, parse_webhook
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.steps import plan_steps
from trainsentry.gateway.stages.planning.ticker import Ticker
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.gateway.stages.services.ack import AckService
from trainsentry.gateway.stages.services.ackers import Ackers
from trainsentry.gateway.stages.services.cordon import Cordoner
from trainsentry.gateway.stages.services.handoff import HandoffNotices, reschedule
from trainsentry.gateway.stages.services.job_alerting import JobAlerting
from trainsentry.gateway.stages.services.job_status import JobStatusFeeder
from trainsentry.gateway.stages.services.maintenance import MaintenanceService
from trainsentry.gateway.stages.services.oncall import OncallService
from trainsentry.gateway.stages.services.paging import Paging
from trainsentry.gateway.stages.services.retention import Retention
from trainsentry.gateway.stages.services.topology import TopologySource
from trainsentry.kube.client import default_api_client
from trainsentry.labels import NODE_LABELS
from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.feishu.app import FeishuAppNotifier
from trainsentry.notifiers.feishu.job import FeishuJobNotifier
from trainsentry.oncall.types import OncallConfig
from trainsentry.store import create_engine, migrate
from trainsentry.store.engine import Engine
from trainsentry.store.queries import firing_occurrence
from trainsentry.store.writes import ReceiptOutcome

log = logging.getLogger("trainsentry.gateway")


@dataclass(frozen=True)
class Diagnosis:
    """Hang diagnosis: its settings, how ranks are found, and the probes' bearer token."""

    settings: DiagnosisSettings
    resolver: EndpointResolver
    probe_token: str = field(repr=False)


def _receipt_outcome(outcome: ReceiptOutcome) -> str:
    if outcome.resend:
        return "resend"
    return "replay" if outcome.times_received > 1 else "stored"


def _record_commit(gateway: Gateway, outcomes: Sequence[ReceiptOutcome]) -> None:
    """After the intake's commit (or an unchanged resend answered from the store): metrics,
    and the policy worker woken when there is something for it in the inbox."""
    for outcome in outcomes:
        gateway.metrics.receipts.labels(_receipt_outcome(outcome)).inc()
    _record_expanded(gateway, outcomes)


def _record_expanded(gateway: Gateway, outcomes: Sequence[ReceiptOutcome]) -> None:
    """After alerts were recorded (by the intake, or the expander from the journal): metrics,
    and the policy worker woken when they changed anything."""
    metrics = gateway.metrics
    queued = False
    for outcome in outcomes:
        metrics.alerts_stored.inc(outcome.new)
        metrics.duplicates.inc(outcome.unchanged)
        for change in outcome.changes:
            metrics.alert_changes.labels(change.kind.value).inc()
        queued = queued or bool(outcome.changes)
    if queued:
        gateway.policy_worker.wake()


def _record_verdict(gateway: Gateway, change: AlertChange, verdict: HangVerdict) -> None:
    """A hang's diagnosis reaches the job's status (lastAlert.diagnosis: which rank)."""
    if verdict.verdict not in ("hang", "mismatch"):
        return
    priority = Priority(gateway.classified().get(change.alert_id, "P0"))
    gateway.job_status.feed_verdict(change, priority, verdict.summary, verdict.culprit_ranks)


def _record_planned(gateway: Gateway, changes: Sequence[AlertChange], written: int) -> None:
    """After the policy's commit: what follows a decided change, then wake the outbox."""
    gateway.metrics.policy_planned.inc(len(changes))
    gateway.metrics.policy_batches.inc()
    gateway.expander.wake()  # room ahead of the planner: the next chunk may go
    gateway.hang.diagnose(changes)
    gateway.job_status.feed(changes, gateway.classified())
    if written:
        gateway.outbox.wake()


def create_app(
    settings: GatewaySettings,
    *,
    notifiers: Mapping[str, Notifier] | None = None,
    plan: PlanHook | None = None,
    metrics: GatewayMetrics | None = None,
    tick_interval: float = 1.0,
    clock: Callable[[], datetime] = utcnow,
    rate_limits: Mapping[str, list[tuple[int, float]]] | None = None,
    escalator: Escalator | None = None,
    silences: SilenceClient | None = None,
    card_callback: CardCallbackSettings | None = None,
    diagnosis: Diagnosis | None = None,
    kube_api: Callable[[], Awaitable[Any]] | None = None,
    topology: TopologySource | None = None,
    maintenance: MaintenanceSettings | None = None,
    oncall: OncallConfig | None = None,
    job_alerting: JobAlerting | None = None,
    remediation: CordonSettings | None = None,
) -> web.Application:
    """Builds the gateway app; the store is opened (and its schema checked) at startup.
    `job_alerting`: TrainingJobs' own routes (its `feishu_job` channel among `notifiers`).
    Raises ConfigError when the policy names an escalation policy `oncall` lacks, or
    `remediation.approvers` a person it lacks."""
    if notifiers is None:
        notifiers = {"console": ConsoleNotifier(settings.console_file)}
    gateway_metrics = metrics or GatewayMetrics()
    policy = load_policy(settings.policy_file) if plan is None else None
    paging = paging_of(escalator, oncall, policy, "phone" in notifiers, job_alerting)
    approvers = cordon_approvers_of(remediation, oncall)
    feishu_people = feishu_people_of(oncall)
    wiring = _Wiring(
        settings=settings,
        notifiers=notifiers,
        metrics=gateway_metrics,
        plan=plan,
        policy=policy,
        paging=paging,
        tick_interval=tick_interval,
        clock=clock,
        rate_limits=rate_limits,
        silences=silences,
        diagnosis=diagnosis,
        kube_api=kube_api,
        topology=topology,
        maintenance=maintenance or MaintenanceSettings(),
        oncall=oncall,
        job_alerting=job_alerting,
        remediation=remediation,
        approvers=approvers,
        feishu_people=feishu_people,
        ackers=Ackers(escalator, oncall, job_alerting),  # acks by configured people's names
    )
    app = _bounded_app(settings)

    listener = trigger_listener(settings, lambda: app[GATEWAY_KEY])  # the trigger port
    if listener is not None:
        app[TRIGGER_LISTENER_KEY] = listener

    async def lifecycle(app: web.Application) -> Any:
        gateway = await _open(app, wiring)
        await _start(gateway)
        try:
            async with serving(listener):  # after the stages it hands to, stopped before them
                yield
        finally:
            await _stop(gateway)

    app.cleanup_ctx.append(lifecycle)
    add_routes(app, card_callback)
    _say_if_unsigned(card_callback, gateway_metrics)
    return app


def _policy_plan(
    w: _Wiring, policy: Policy, maintenance: MaintenanceService, hold: HangDiagnoser | None
) -> PolicyPlan:
    """The real policy over the gateway's channels, built whole with its steps (the
    gateway's maintenance windows, paging and hang hold, where it has them); incidents'
    cards are redrawn in place on the channels that can, and TrainingJobs' own routes are
    read once per batch."""
    job_alerting = w.job_alerting
    return PolicyPlan(
        policy,
        channels=tuple(w.notifiers),
        steps=plan_steps(maintenance=maintenance, paging=w.paging, hold=hold),
        metrics=PolicyMetrics(w.metrics.registry),
        topology=w.topology.current if w.topology is not None else None,
        job_routes=job_alerting.routes if job_alerting is not None else None,
        # channels that redraw an incident's card in place (notifiers/base.py)
        updatable=[n for n, c in w.notifiers.items() if getattr(c, "updates_cards", False)],
    )


def _bounded_app(settings: GatewaySettings) -> web.Application:
    """The bare app: bodies bounded in size, time, readers and bytes in flight
    (api/limits.py; the hang triggers with readers of their own), errors answered as JSON."""
    limits = BodyLimits(
        read_timeout_s=settings.body_timeout_s,
        max_readers=settings.max_body_readers,
        max_bytes_in_flight=settings.max_body_bytes_in_flight,
        max_body_bytes=settings.max_body_bytes,
        pools=(ReaderPool(HANG_TRIGGER_PATH, settings.max_trigger_readers),),
    )
    return web.Application(
        client_max_size=settings.max_body_bytes, middlewares=[body_limits(limits), json_errors]
    )


def _say_if_unsigned(callback: CardCallbackSettings | None, metrics: GatewayMetrics) -> None:
    """Without an encrypt key Feishu neither encrypts nor signs card callbacks: the static
    verification token alone proves one, and the presser's open_id and the event id are
    whatever the caller writes (docs/channels.md). Said once at start, and in /metrics."""
    unsigned = callback is not None and not callback.encrypt_key
    metrics.feishu_callbacks_unsigned.set(1 if unsigned else 0)
    if callback is not None and unsigned:
        log.warning(
            "event=feishu_callbacks_unsigned path=%s: Feishu card callbacks are accepted on "
            "the verification token alone (no signature, no timestamp check; the presser's "
            "open_id and the event id are the caller's word): set "
            "channels.feishu_app.callback.encrypt_key_env to the app's encrypt key",
            callback.path,
        )


@dataclass(frozen=True)
class _Wiring:
    """What `create_app` was given, for the start of the app."""

    settings: GatewaySettings
    notifiers: Mapping[str, Notifier]
    metrics: GatewayMetrics
    plan: PlanHook | None  # a test's own, in place of the real policy
    policy: Policy | None  # the real policy's rules; None when a test injected `plan`
    paging: Paging | None
    tick_interval: float
    clock: Callable[[], datetime]
    rate_limits: Mapping[str, list[tuple[int, float]]] | None
    silences: SilenceClient | None
    diagnosis: Diagnosis | None
    kube_api: Callable[[], Awaitable[Any]] | None
    topology: TopologySource | None
    maintenance: MaintenanceSettings
    oncall: OncallConfig | None = None
    job_alerting: JobAlerting | None = None
    remediation: CordonSettings | None = None
    approvers: Mapping[str, str] = field(default_factory=dict)
    feishu_people: Mapping[str, str] = field(default_factory=dict)
    ackers: Ackers | None = None


@dataclass(frozen=True)
class _Core:
    """What the later parts are built over: the app (the stages' callbacks find the Gateway
    in it), the store, the outbox, the intake writer and the one policy lock."""

    app: web.Application
    engine: Engine
    outbox: Outbox
    writer: IntakeWriter
    lock: asyncio.Lock  # one policy transaction at a time in this process

    def record_planned(self, changes: Sequence[AlertChange], written: int) -> None:
        _record_planned(self.app[GATEWAY_KEY], changes, written)


@dataclass(frozen=True)
class _PolicyParts:
    """The plan the policy worker runs, and the parts that belong to the real policy (off
    when a test's plan replaces it)."""

    plan: PlanHook
    ticker: Ticker | TickerOff
    maintenance: MaintenanceService | MaintenanceOff
    hang: HangTriggers | HangsOff
    classified: Callable[[], Mapping[int, str]]


async def _open(app: web.Application, w: _Wiring) -> Gateway:
    """The store, then the stages in pipeline order (none started yet), then the `Gateway`,
    constructed once with every part; the real policy is built whole after the parts it
    steps through (maintenance windows, the hang hold). The app holds the Gateway under
    GATEWAY_KEY from here on: the stages' callbacks find it there (none runs before
    `_start`)."""
    settings, clock, policy = w.settings, w.clock, w.policy
    engine = create_engine(settings.db)
    await migrate(engine)
    # the one resolution of an alert's node: the store records it, every part reads it
    node_labels = policy.node_labels if policy is not None else NODE_LABELS
    policy_lock = asyncio.Lock()  # the expander's chunks take it too
    expander = Expander(
        engine,
        lambda body: parse_webhook(body.encode()).alerts,
        lock=policy_lock,
        node_labels=node_labels,
        on_expanded=lambda outcomes: _record_expanded(app[GATEWAY_KEY], outcomes),
        max_backlog=settings.journal_max_alerts,
    )
    writer = IntakeWriter(
        engine,
        on_commit=lambda outcomes: _record_commit(app[GATEWAY_KEY], outcomes),
        node_labels=node_labels,
        expander=expander,
    )
    core = _Core(app, engine, _new_outbox(engine, w), writer, policy_lock)
    parts = await _policy_parts(w, core)
    worker, ack = _new_policy_worker_and_ack(w, core, parts.plan)
    oncall, handoffs = _new_oncall(w, core, w.oncall) if w.oncall else (OncallOff(), HandoffsOff())
    gateway = Gateway(
        settings, engine, w.metrics, writer, core.outbox, expander, worker, ack,
        retention=Retention(
            engine, settings.retention, metrics=w.metrics, clock=clock, lock=policy_lock
        ),
        ticker=parts.ticker,
        hang=parts.hang,
        job_status=(
            JobStatusFeeder(w.kube_api or default_api_client)
            if settings.trainingjob_status else JobStatusOff()
        ),
        escalator=w.paging.escalator if w.paging is not None else EscalationOff(),
        maintenance=parts.maintenance,
        job_alerting=w.job_alerting if w.job_alerting is not None else JobAlertingOff(),
        topology=w.topology if w.topology is not None else TopologyOff(),
        # a test's plan runs without the real policy: node health reads the policy file's
        policy=policy if policy is not None else load_policy(settings.policy_file),
        oncall=oncall,
        handoffs=handoffs,
        cordon=_new_cordon(w, core),
        feishu_people=w.feishu_people,
        classified=parts.classified,
        clock=clock,
    )  # fmt: skip
    app[GATEWAY_KEY] = gateway
    return gateway


async def _policy_parts(w: _Wiring, core: _Core) -> _PolicyParts:
    """The real policy, built whole over its maintenance windows and hang hold, and its
    ticker; or a test's plan, without them."""
    policy = w.policy
    if policy is None:
        assert w.plan is not None  # create_app: a test's plan, or the real policy's rules
        return _PolicyParts(w.plan, TickerOff(), MaintenanceOff(), HangsOff(), dict)
    maintenance = _new_maintenance(w, core, policy)
    hang: HangTriggers | HangsOff = HangsOff()
    hold = None  # the policy's hold step: hang pages wait for their diagnosis
    if w.diagnosis is not None and w.diagnosis.settings.enabled:
        hang = _hang_triggers(w, core, w.diagnosis)
        hold = hang.diagnoser
    policy_plan = _policy_plan(w, policy, maintenance, hold)
    ticker = Ticker(  # fires the real policy's timers and expires stale alerts
        core.engine, policy_plan, interval=w.tick_interval,
        stale_after=w.settings.stale_after_seconds, on_drafts=core.outbox.wake,
        on_expired=core.record_planned, clock=w.clock, lock=core.lock,
    )  # fmt: skip
    return _PolicyParts(policy_plan, ticker, maintenance, hang, lambda: policy_plan.classified)


def _new_outbox(engine: Engine, w: _Wiring) -> Outbox:
    """The outbox: delivery rules, rate limits, leases and send slots from the settings."""
    settings = w.settings
    return Outbox(
        engine,
        w.notifiers,
        metrics=w.metrics,
        rules=DeliveryRules(
            give_up_after={Priority(p): s for p, s in settings.give_up_after_seconds.items()}
        ),
        rate_limits=w.rate_limits,
        lease_seconds=settings.outbox_lease_seconds,
        send_deadline=settings.send_deadline_seconds,
        slots=settings.send_slots_per_channel,
        clock=w.clock,
    )


def _new_policy_worker_and_ack(
    w: _Wiring, core: _Core, plan: PlanHook
) -> tuple[PolicyWorker, AckService]:
    """The policy worker and the ack service, both under the policy lock; the Feishu
    channels find an ack's card to redraw through the ack service."""
    worker = PolicyWorker(
        core.engine, plan, on_planned=core.record_planned,
        on_set_aside=lambda _change: w.metrics.policy_failed.inc(),
        clock=w.clock, lock=core.lock,
    )  # fmt: skip
    ack = AckService(
        core.engine, channels=tuple(w.notifiers), clock=w.clock, paging=w.paging,
        silences=w.silences, lock=core.lock, ackers=w.ackers,
        node_labels=w.policy.node_labels if w.policy is not None else NODE_LABELS,
    )  # fmt: skip
    for notifier in w.notifiers.values():  # an ack finds its card to redraw as it is sent
        if isinstance(notifier, FeishuAppNotifier | FeishuJobNotifier):
            notifier.find_card = ack.card_message
    return worker, ack


def _new_maintenance(w: _Wiring, core: _Core, policy: Policy) -> MaintenanceService:
    """The maintenance windows the real policy mutes by (one service, shared by the
    gateway's API and the policy's mute step), over its chat and phone channels."""
    return MaintenanceService(
        core.engine, w.maintenance, policy=policy,
        channels=frozenset(w.notifiers) - ARCHIVE_CHANNELS, clock=w.clock, lock=core.lock,
    )  # fmt: skip


def _new_oncall(
    w: _Wiring, core: _Core, oncall: OncallConfig
) -> tuple[OncallService, HandoffNotices]:
    """The on-call rota and its handoff notices (checked every 30 ticks)."""
    service = OncallService(core.engine, oncall, clock=w.clock, on_change=reschedule)
    handoffs = HandoffNotices(
        core.engine, service, tuple(w.notifiers), clock=w.clock,
        interval=30 * w.tick_interval, on_drafts=core.outbox.wake,
    )  # fmt: skip
    return service, handoffs


def _new_cordon(w: _Wiring, core: _Core) -> Cordoner | CordonOff:
    """Cordon recommendations, where `remediation.cordon` is on and the real policy runs."""
    remediation, policy = w.remediation, w.policy
    if remediation is None or remediation.cordon is Mode.OFF or policy is None:
        return CordonOff()
    return Cordoner(
        core.engine, remediation, policy, w.kube_api or default_api_client,
        tuple(w.notifiers), approvers=w.approvers, topology=w.topology, clock=w.clock,
        on_drafts=core.outbox.wake,
    )  # fmt: skip


def _hang_triggers(w: _Wiring, core: _Core, diagnosis: Diagnosis) -> HangTriggers:
    """The hang diagnosis (the policy's hold step holds hang alerts for it); the probes'
    triggers are accepted."""
    engine, clock, app = core.engine, w.clock, core.app
    diagnoser = HangDiagnoser(
        engine, diagnosis.settings, diagnosis.resolver, diagnosis.probe_token,
        clock=clock, on_release=core.outbox.wake,
        on_verdict=lambda change, verdict: _record_verdict(app[GATEWAY_KEY], change, verdict),
        paging=w.paging, lock=core.lock,
    )  # fmt: skip

    async def firing(fingerprint: str) -> tuple[datetime, dict[str, str]] | None:
        async with engine.connect() as conn:
            return await firing_occurrence(conn, fingerprint)

    async def submit(body: bytes) -> int:
        receipt = parse_webhook(body, received_at=clock())
        return (await core.writer.submit(receipt)).new

    hangs = JobHangs(firing, submit, writes_per_minute=diagnosis.settings.trigger_writes_per_minute)
    diagnoser.evidence = hangs.evidence
    sources = TriggerSources(diagnoser.rank_hosts)
    diagnoser.warm_up()
    return HangTriggers(diagnoser, hangs, sources)


async def _start(gateway: Gateway) -> None:
    """Starts the stages; the outbox last, after the leases an earlier run left."""
    gateway.topology.start()
    gateway.ticker.start()
    gateway.job_alerting.start(gateway.metrics)
    await gateway.expander.start()  # before the intake: what an earlier run journaled
    gateway.writer.start()
    gateway.policy_worker.start()
    # Before the worker and anything else can claim: rows an earlier run left in flight.
    await gateway.outbox.release_leases_of_earlier_runs()
    gateway.outbox.start()
    gateway.retention.start()
    gateway.handoffs.start()
    gateway.cordon.start()
    log.info(
        "gateway started db=%s listen=%s", gateway.engine.dialect.name, gateway.settings.listen
    )
    settings = gateway.settings
    if not settings.loopback_only:
        for group in open_endpoints(settings):
            log.warning("auth open: anyone who reaches %s can use the %s", settings.listen, group)


async def _stop(gateway: Gateway) -> None:
    """Stops the stages in pipeline order, then closes the store."""
    await gateway.retention.stop()
    await gateway.writer.stop()
    await gateway.expander.stop()
    await gateway.policy_worker.stop()
    await gateway.hang.stop()
    await gateway.job_status.stop()
    await gateway.job_alerting.stop()
    await gateway.ticker.stop()
    await gateway.handoffs.stop()
    await gateway.cordon.stop()
    await gateway.outbox.aclose()
    await gateway.topology.stop()
    for task in list(gateway.background):
        task.cancel()
    # before the engine goes: a cancelled task may still be giving its connection back
    await asyncio.gather(*gateway.background, return_exceptions=True)
    await gateway.engine.dispose()


def app_from_settings(settings: Settings, env: Mapping[str, str] | None = None) -> web.Application:
    """What `trainsentry gateway` serves: channels and hang diagnosis built from `settings`
    (secrets read from `env`, default the process environment), then `create_app`.

    Raises ConfigError alone: what the settings could not check when they loaded (a secret
    missing from the environment, the policy file and the escalation policies it names)."""
    env = os.environ if env is None else env
    channels = build(settings, env)
    job_alerting = build_job_alerting(settings.job_alerting, channels)
    diagnosis_parts = build_diagnosis_parts(settings.diagnosis, env)
    topology = build_topology(settings.topology)
    built = channels.built
    card_callback = None
    if built is not None and built.callback_path and built.verification_token:
        card_callback = CardCallbackSettings(  # stripped like the gateway's tokens
            built.callback_path,
            built.verification_token.strip(),
            built.encrypt_key.strip() if built.encrypt_key else None,
            built.callback_max_skew_s,
        )
    # loads and checks the policy file (TRAINSENTRY_POLICY_FILE): PolicyError is a ConfigError
    return create_app(
        settings.gateway,
        notifiers=channels.notifiers,
        rate_limits=channels.rate_limits,
        escalator=default_escalator(settings),
        silences=built.silences if built is not None else None,
        card_callback=card_callback,
        diagnosis=Diagnosis(*diagnosis_parts) if diagnosis_parts is not None else None,
        topology=topology,
        maintenance=settings.maintenance,
        oncall=oncall_of(settings),
        job_alerting=job_alerting,
        remediation=settings.remediation,
    )
