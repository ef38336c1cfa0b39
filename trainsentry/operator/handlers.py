"""Thin kopf handlers: each one hands the object to reconcile.py and maps errors to retries.

Handlers are registered into a fresh `kopf.OperatorRegistry` by `build_registry()`, not at
import time, so an operator process (or a test) decides what it runs: discovery on or off,
the resync interval, how to log in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import kopf
from kubernetes_asyncio.client import ApiClient, Configuration

from trainsentry.kube.client import Kube, KubeError, RetryPolicy
from trainsentry.operator import reconcile as rec
from trainsentry.operator.admission import AdmissionServer, ProbeSecrets, Webhook
from trainsentry.operator.instrument import InstrumentSettings
from trainsentry.operator.namespace_label import NamespaceLabels
from trainsentry.operator.spec import GROUP, MONITOR_ANNOTATION, PLURAL, VERSION, JobIdentity
from trainsentry.operator.webhook_credentials import WebhookCredentials

log = logging.getLogger(__name__)

FINALIZER = "trainsentry.io/finalizer"
# The mutating webhook's id: kopf serves it at POST /<id> (the chart's webhook path).
WEBHOOK_ID = "instrument-pods"
# The webhook's name in the chart's MutatingWebhookConfiguration (operator-webhook.yaml).
WEBHOOK_NAME = "instrument-pods.trainsentry.io"
# kind → (group, version, plural) of the workloads that can opt in to discovery.
DISCOVERABLE = {
    "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
    "Job": ("batch.volcano.sh", "v1alpha1", "jobs"),
}


@dataclass(frozen=True)
class WebhookServing:
    """The admission webhook (`admission.py`): where kopf serves it and what it gives the
    pods. HTTPS with `credentials` (the chart's default: the operator keeps the certificate
    and the path token, `webhook_credentials.py`), else with the given certificate files
    and no path token (tests, a certificate made elsewhere)."""

    settings: InstrumentSettings
    port: int = 9443
    certfile: str | None = None
    keyfile: str | None = None
    address: str = "0.0.0.0"
    budget_s: float = 3.0  # below the webhook's timeoutSeconds in the chart (5)
    credentials: WebhookCredentials | None = None
    # The CA of the client certificate the API server presents (where the admin configured
    # one, `WebhookAdmission.kubeConfigFile`): a call without such a certificate fails TLS.
    client_ca: str | None = None
    # How often the credentials are read again (renewed if due) and caBundle and path put
    # back should something have removed them (a `helm upgrade` from a chart that set them).
    check_s: float = 60.0
    reload_s: float = 60.0  # how often kopf looks whether the certificate files changed


@dataclass(frozen=True)
class OperatorOptions:
    resync_seconds: float = 60.0  # every job is fully reconciled at least this often
    retry_delay: float = 5.0  # a failed reconcile is retried after this many seconds
    discovery: bool = True
    api_config: Configuration | None = None  # for our own client; None: the default config
    # A kopf login handler; None: kopf's built-ins (current-context only). The CLI passes
    # login.login_handler, which connects where api_config does.
    login: Callable[..., Any] | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # kopf watches namespaces (and CRDs) to follow glob patterns; with exact namespace names
    # that is not needed, and turning it off spares the cluster-wide list/watch permission.
    scan_cluster: bool = True
    # The master probe token: each job's namespace gets a Secret with the job's token derived
    # from it (admission.ProbeSecrets); None: no Secrets, and pods get no token.
    probe_token: str | None = field(default=None, repr=False)
    webhook: WebhookServing | None = None
    # Label each namespace holding a TrainingJob (namespace_label.py; the chart's selectors
    # read it). Off with fixed namespaces (the chart names them instead).
    label_namespaces: bool = False


def _emitter(body: kopf.Body) -> rec.Emit:
    def emit(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message[:1000])

    return emit


class WarnedOnce:
    """Warnings already given per job in this process, for as long as the problem lasts.

    The reconciler warns once per distinct problem by looking at the conditions of the status
    it is given; but a reconcile that waited for the job's lock behind the one that wrote
    those conditions was given the older status, and would warn a second time."""

    def __init__(self) -> None:
        self._given: dict[str, set[tuple[str, str]]] = {}

    def emitter(self, uid: str, emit: rec.Emit, seen: set[tuple[str, str]]) -> rec.Emit:
        """`emit` for the job `uid`, leaving out a warning given before. Every warning
        asked for is added to `seen` (see `keep_only`)."""

        def emit_once(kind: str, reason: str, message: str) -> None:
            if kind == "Warning":
                seen.add((reason, message))
                given = self._given.setdefault(uid, set())
                if (reason, message) in given:
                    return
                given.add((reason, message))
            emit(kind, reason, message)

        return emit_once

    def keep_only(self, uid: str, seen: set[tuple[str, str]]) -> None:
        """After a reconcile: problems it no longer warned about are over (and may warn
        again should they come back)."""
        if uid in self._given:
            self._given[uid] &= seen

    def forget(self, uid: str) -> None:
        self._given.pop(uid, None)


def default_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod: the service account; elsewhere: $KUBECONFIG or ~/.kube/config."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    return info or kopf.login_with_kubeconfig(**kwargs)


def configure(settings: kopf.OperatorSettings) -> None:
    """Our names for kopf's bookkeeping, and no status clutter."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP, v1=False)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration", v1=False
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30
    # A resync timer must stop before the finalizer goes; check often (kopf's default: 60 s).
    settings.background.cancellation_polling = 1


def build_registry(sources: rec.Sources, options: OperatorOptions) -> kopf.OperatorRegistry:
    """The kopf registry of one operator: its start and stop, the TrainingJob handlers, the
    admission webhook (with `options.webhook`) and discovery (with `options.discovery`)."""
    registry = kopf.OperatorRegistry()
    _register_lifecycle(registry, sources, options)
    _register_job_handlers(registry, _Jobs(sources, options))
    if options.webhook is not None:
        _register_webhook(registry)
    if options.discovery:
        for kind, (group, version, plural) in DISCOVERABLE.items():
            _register_discovery(registry, kind, group, version, plural, options)
    return registry


def _register_lifecycle(
    registry: kopf.OperatorRegistry, sources: rec.Sources, options: OperatorOptions
) -> None:
    """Startup (settings, the API client and what the handlers share in kopf's memo, the
    admission server), cleanup, and the login."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure(settings)
        settings.scanning.disabled = not options.scan_cluster
        memo.api = ApiClient(configuration=options.api_config)
        memo.kube = Kube(memo.api, options.retry)
        memo.node_locks = rec.NodeLocks()
        memo.claims = rec.ClaimLedger()
        memo.probe_secrets = ProbeSecrets(options.probe_token) if options.probe_token else None
        memo.namespaces = NamespaceLabels() if options.label_namespaces else None
        memo.keeping = None
        if options.webhook is not None:
            serving = options.webhook
            certfile, keyfile, token = serving.certfile, serving.keyfile, None
            if serving.credentials is not None:
                credentials = serving.credentials
                await _first_credentials(memo.kube, credentials)
                certfile = keyfile = str(credentials.served)  # key and certificate, one file
                token = credentials.token
                memo.keeping = asyncio.create_task(
                    _keep_credentials(memo.kube, credentials, serving.check_s)
                )
            settings.admission.server = AdmissionServer(
                webhook_id=WEBHOOK_ID,
                token=token,
                addr=serving.address,
                port=serving.port,
                certfile=certfile,
                pkeyfile=keyfile,
                file_check_interval=serving.reload_s,
                verify_mode=ssl.CERT_REQUIRED if serving.client_ca else None,
                verify_cafile=serving.client_ca,
            )
            settings.admission.managed = None  # the chart renders the webhook configuration
            memo.webhook = Webhook(serving.settings, memo.probe_secrets, serving.budget_s)
        log.info(
            "event=operator_started rule_files=%d dashboards=%d discovery=%s",
            len(sources.rule_files),
            len(sources.dashboards),
            options.discovery,
        )

    @kopf.on.cleanup(registry=registry)
    async def shutdown(memo: kopf.Memo, **_: Any) -> None:
        if getattr(memo, "keeping", None) is not None:
            memo.keeping.cancel()
        if getattr(memo, "api", None) is not None:
            await memo.api.close()

    kopf.on.login(registry=registry)(options.login or default_login)


async def _first_credentials(kube: Kube, credentials: WebhookCredentials) -> None:
    """The webhook's credentials before its server starts; with the API unreachable, a
    certificate of this process only (`serve_unstored`) until the next check."""
    try:
        await credentials.keep(kube)
    except (KubeError, OSError, ValueError) as exc:
        log.warning("event=webhook_credentials_failed error=%r", str(exc))
        credentials.serve_unstored()


async def _keep_credentials(kube: Kube, credentials: WebhookCredentials, every_s: float) -> None:
    """Reads the credentials again every `every_s` (renewing them when due); after a
    failure, within 30 s."""
    delay = every_s
    while True:
        await asyncio.sleep(delay)
        try:
            await credentials.keep(kube)
            delay = every_s
        except (KubeError, OSError, ValueError) as exc:
            log.warning("event=webhook_credentials_failed error=%r", str(exc))
            delay = min(every_s, 30.0)


@dataclass
class _Jobs:
    """What the TrainingJob handlers share: one lock per job (a reconcile and a delete of
    one job never overlap), the warnings already posted, and the jobs already deleted (a
    late resync must not re-claim their nodes)."""

    sources: rec.Sources
    options: OperatorOptions
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    warned: WarnedOnce = field(default_factory=WarnedOnce)
    deleted: set[str] = field(default_factory=set)  # uids cleaned up
    seen_alerts: dict[str, Any] = field(default_factory=dict)  # uid -> status.lastAlert

    async def reconcile(self, body: kopf.Body, memo: kopf.Memo) -> None:
        uid = str(body.metadata.uid)
        lock = self.locks.setdefault(uid, asyncio.Lock())
        async with lock:
            if uid in self.deleted or body.metadata.get("deletionTimestamp"):
                return
            seen: set[tuple[str, str]] = set()
            try:
                await rec.reconcile(
                    memo.kube,
                    body,
                    self.sources,
                    self.warned.emitter(uid, _emitter(body), seen),
                    memo.node_locks,
                    memo.claims,
                )
                self.warned.keep_only(uid, seen)
                if memo.namespaces is not None:
                    await memo.namespaces.holds_jobs(memo.kube, str(body.metadata.namespace))
                if memo.probe_secrets is not None:
                    await memo.probe_secrets.ensure(memo.kube, JobIdentity.from_body(body))
            except KubeError as exc:
                kopf.warn(body, reason="ReconcileFailed", message=str(exc)[:1000])
                raise kopf.TemporaryError(str(exc), delay=self.options.retry_delay) from exc

    async def reconcile_or_log(self, body: kopf.Body, memo: kopf.Memo, event: str) -> None:
        """A reconcile no retry will follow (a resync, a lastAlert change): a failure is
        logged as `event`, and the next resync tries again."""
        try:
            await self.reconcile(body, memo)
        except kopf.TemporaryError as exc:
            log.warning(
                "event=%s job=%s/%s error=%r",
                event,
                body.metadata.namespace,
                body.metadata.name,
                str(exc),
            )

    def last_alert_changed(self, type: str | None, body: kopf.Body) -> bool:
        """Whether this watch event changed a known job's status.lastAlert (the first sight
        of a job is not a change: its create or resume handler reconciles it)."""
        uid = str(body.metadata.uid)
        if type == "DELETED":
            self.seen_alerts.pop(uid, None)
            return False
        alert = (body.get("status") or {}).get("lastAlert")
        first_sight = uid not in self.seen_alerts
        previous = self.seen_alerts.get(uid)
        self.seen_alerts[uid] = dict(alert) if alert else None
        return not first_sight and previous != self.seen_alerts[uid]

    async def delete(self, body: kopf.Body, memo: kopf.Memo) -> None:
        uid = str(body.metadata.uid)
        async with self.locks.setdefault(uid, asyncio.Lock()):
            self.deleted.add(uid)
            try:
                await rec.cleanup(
                    memo.kube,
                    body,
                    _emitter(body),
                    memo.node_locks,
                    memo.claims,
                    self.sources.dashboards_namespace,
                )
            except KubeError as exc:
                raise kopf.TemporaryError(str(exc), delay=self.options.retry_delay) from exc
        self.locks.pop(uid, None)
        self.warned.forget(uid)
        if memo.namespaces is not None:
            await memo.namespaces.job_gone(memo.kube, str(body.metadata.namespace))
        if memo.probe_secrets is not None:
            memo.probe_secrets.forget(uid)  # the Secret goes with the job (ownerReference)


def _register_job_handlers(registry: kopf.OperatorRegistry, jobs: _Jobs) -> None:
    """A TrainingJob is reconciled when created, resumed, its spec changed, on the resync
    timer and when the gateway changes its status.lastAlert; cleaned up when deleted."""

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="reconcile")
    @kopf.on.update(GROUP, VERSION, PLURAL, field="spec", registry=registry, id="reconcile")
    async def reconcile_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await jobs.reconcile(body, memo)

    @kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        interval=jobs.options.resync_seconds,
        initial_delay=jobs.options.resync_seconds,
        registry=registry,
        id="resync",
    )
    async def resync_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await jobs.reconcile_or_log(body, memo, "resync_failed")

    # The gateway writes status.lastAlert; fold it into the phase now, not at the next resync.
    # (kopf's change handlers ignore status, so this watches raw events and compares.)
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="last-alert")
    async def last_alert_changed(
        type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
    ) -> None:
        if jobs.last_alert_changed(type, body):
            await jobs.reconcile_or_log(body, memo, "last_alert_reconcile_failed")

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, id="cleanup")
    async def delete_job(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        await jobs.delete(body, memo)


def _register_webhook(registry: kopf.OperatorRegistry) -> None:
    """The admission webhook that instruments a TrainingJob's pods as they are created."""

    @kopf.on.mutate(
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operations=["CREATE"],
        ignore_failures=True,
        side_effects=True,  # the job's token Secret; not on a dry run
        registry=registry,
    )
    async def instrument_pod(
        body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, dryrun: bool, **_: Any
    ) -> None:
        plan = await memo.webhook.review(memo.kube, body, dry_run=dryrun)
        if plan.ops:
            patch.fns.append(functools.partial(jsonpatch.apply_patch, patch=plan.ops,
                                               in_place=True))  # fmt: skip


def _register_discovery(
    registry: kopf.OperatorRegistry,
    kind: str,
    group: str,
    version: str,
    plural: str,
    options: OperatorOptions,
) -> None:
    # on.event, not on.create: it stores nothing on the user's workload (no finalizer, no
    # annotations), so the operator needs only read access to workloads.
    @kopf.on.event(
        group,
        version,
        plural,
        annotations={MONITOR_ANNOTATION: "true"},
        registry=registry,
        id=f"discover-{plural}",
    )
    async def discover_workload(
        type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
    ) -> None:
        if type == "DELETED" or body.metadata.get("deletionTimestamp"):
            return
        try:
            created = await rec.discover(memo.kube, kind, body)
        except KubeError as exc:
            log.warning(
                "event=discovery_failed kind=%s name=%s/%s error=%r",
                kind,
                body.metadata.namespace,
                body.metadata.name,
                str(exc),
            )
            return
        if created:
            kopf.info(
                body,
                reason="TrainingJobCreated",
                message=f"trainsentry watches this job as TrainingJob {body.metadata.name}",
            )
