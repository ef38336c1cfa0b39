"""TrainingJobs route their own alerts: the gateway reads each job's `spec.alerting`.

Every `refresh_seconds` the stage lists the TrainingJobs (all namespaces, or the configured
ones) through the Kubernetes API, reads what their settings reference, checks it, and
swaps in a new snapshot keyed by namespace/name:
- every reference names an object in the JOB'S OWN namespace: it has no namespace field,
  and its name must be an object name (a DNS-1123 subdomain: the CRD's pattern, the spec
  model and the Kubernetes client each check it, so no `../` or `%2e%2e/` reaches another
  namespace); a job whose reference is no name gets `InvalidReference`, naming the field,
  and nothing is read for it;
- `feishu.webhookSecretRef`: the Secret; `key` holds the custom
  bot's webhook URL, which must start with one of `webhook_prefixes` (Feishu's bot hook
  URLs by default: the gateway posts nowhere else), `secretKey` its signing secret;
- `feishu.chatId`: a Feishu chat id (`oc_...`); needs the gateway's Feishu app;
- `owners`: open_ids (`ou_...`) or e-mail addresses;
- `onCallRosterRef`: a ConfigMap key in the job's namespace holding `layers:` in the format
  of the gateway's `oncall.escalation.layers`, or `escalation_policy: NAME` (or per
  priority, `{P0: NAME}`), of the gateway's `oncall.escalation_policies`
  (`escalation_policies`, set by the paging's builder; an unknown name is a problem like
  any other, and the pages take the global route).
The policy reads `routes()` once per batch (route.JobRoute per job; the decision stays pure),
the `feishu_job` channel reads `destination()` at each send, paging reads `roster()` and
`escalation_policy()`, so a changed chat or roster is used for the next notification without
a restart.

Problems get a visible answer, never a crash or a silent drop: the job's status gets the
condition `AlertingReady=False` with the reason (read-modify-write of `status.conditions`,
optimistic locking), an Event is recorded on the job, `trainsentry_job_alerting_not_ready`
counts such jobs, and the alert takes the policy's own route. Failures at send time (a chat
the app is not in, a webhook that refuses or cannot be reached) are reported by the channel
(`report`), which sends the card to the policy's route instead. The condition turns True
again when the settings work (read cleanly, or the next card went through). Secrets never
reach logs, events, conditions or metrics: messages name the Secret and key, never values.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from trainsentry.alerts import JobRef, Priority
from trainsentry.config.job_alerting import JobAlertingSettings
from trainsentry.gateway.metrics import GatewayMetrics
from trainsentry.gateway.policy.escalation import Roster
from trainsentry.gateway.policy.job_roster import JobOnCall, parse_roster
from trainsentry.gateway.policy.job_settings import (
    CHAT_ID,
    JobSettings,
    check_owners,
    condition_of,
    secret_value,
    with_condition,
)
from trainsentry.gateway.policy.route import JobRoute
from trainsentry.kube.client import Kube, KubeError, LazyApiClient
from trainsentry.kube.events import event
from trainsentry.kube.names import InvalidName
from trainsentry.kube.resources import CONFIGMAPS, EVENTS, SECRETS, TRAININGJOBS
from trainsentry.notifiers.feishu.bot import BotWebhook
from trainsentry.notifiers.feishu.job import JobDestination, Problem
from trainsentry.operator.spec import (
    API_VERSION,
    INVALID_OBJECT_NAME,
    KIND,
    Alerting,
    TrainingJobSpec,
)

log = logging.getLogger("trainsentry.job_alerting")

# What the API answers a read the gateway's RBAC does not allow: a setting problem of the job
# (its condition says so), not a passing failure.
FORBIDDEN = 403
MAX_JOBS = 10_000
REFRESH_TIMEOUT_S = 120.0
INVALID_REFERENCE = "InvalidReference"


def invalid_references(exc: ValidationError) -> tuple[Problem, ...]:
    """Pure: an InvalidReference problem per reference of `spec.alerting` whose name is no
    Kubernetes object name, naming the field; () when the spec fails for other reasons."""
    return tuple(
        (INVALID_REFERENCE, f"spec.{'.'.join(map(str, error['loc']))}: {error['msg']}")
        for error in exc.errors(include_url=False, include_input=False)
        if error["type"] == INVALID_OBJECT_NAME and error["loc"][:1] == ("alerting",)
    )


# --- the stage --------------------------------------------------------------------------------


@dataclass
class _Sent:
    problem: Problem
    destination: JobDestination | None  # what failed; a changed destination forgets it


@dataclass
class _State:
    settings: dict[JobRef, JobSettings] = field(default_factory=dict)
    sent: dict[JobRef, _Sent] = field(default_factory=dict)
    written: dict[JobRef, tuple[bool, str, str]] = field(default_factory=dict)


class JobAlerting:
    """The TrainingJobs' alerting settings, kept fresh from the cluster (module docstring)."""

    def __init__(
        self,
        settings: JobAlertingSettings,
        api_factory: Callable[[], Awaitable[Any]],
        *,
        has_app: bool,
        clock: Callable[[], datetime] = lambda: datetime.now(tz=UTC),
    ) -> None:
        self.settings = settings
        self._api = LazyApiClient(api_factory)
        self._has_app = has_app
        self._clock = clock
        self._state = _State()
        self._routes: dict[JobRef, JobRoute] = {}
        self.metrics: GatewayMetrics | None = None
        self._task: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        # the names a roster reference may give (`oncall.escalation_policies`); set by
        # sections.paging_of before the first refresh
        self.escalation_policies: frozenset[str] = frozenset()

    # what the policy, the channel and paging read ----------------------------------------

    def routes(self) -> Mapping[JobRef, JobRoute]:
        return self._routes

    def _get(self, job: str) -> JobSettings | None:
        namespace, _, name = job.partition("/")
        return self._state.settings.get(JobRef(namespace, name)) if name else None

    def destination(self, job: str) -> JobDestination | None:
        found = self._get(job)
        return found.destination if found is not None else None

    def roster(self, job: str) -> Roster | None:
        found = self._get(job)
        return found.roster if found is not None else None

    def escalation_policy(self, job: str, priority: Priority) -> str:
        """The configured escalation policy the job's roster reference names for `priority`,
        or "" (none named for it, or the job has inline layers or nothing)."""
        found = self._get(job)
        return found.escalation_policies.get(priority, "") if found is not None else ""

    def report(self, job: str, problem: Problem | None, *, fallback: bool) -> None:
        """From the `feishu_job` channel: how the job's last card went (None: fine)."""
        found = self._get(job)
        if found is None:
            return
        if fallback and problem is not None and self.metrics is not None:
            self.metrics.job_route_fallbacks.labels(problem[0]).inc()
        if problem is None:
            self._state.sent.pop(found.job, None)
        else:
            self._state.sent[found.job] = _Sent(problem, found.destination)
        self._publish(found.job)

    # reading the cluster -----------------------------------------------------------------

    async def _kube(self) -> Kube:
        return Kube(await self._api.get())

    async def refresh(self) -> None:
        """One pass: list the jobs, read and check what they reference, publish."""
        kube = await self._kube()
        if self.settings.namespaces:
            bodies = []
            for namespace in self.settings.namespaces:
                bodies += await kube.list(TRAININGJOBS, namespace)
        else:
            bodies = await kube.list(TRAININGJOBS)
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def read(body: Mapping[str, Any]) -> JobSettings | None:
            async with gate:
                return await self._read(kube, body)

        found = await asyncio.gather(*(read(body) for body in bodies[:MAX_JOBS]))
        fresh = {s.job: s for s in found if s is not None}
        state = self._state
        for job, sent in list(state.sent.items()):
            if job not in fresh or fresh[job].destination != sent.destination:
                del state.sent[job]  # the failure was about settings that are gone now
        for job in set(state.settings) - set(fresh):
            state.written.pop(job, None)
        state.settings = fresh
        self._routes = {job: s.route() for job, s in fresh.items()}
        for job in fresh:
            self._publish(job)
        self._count()

    async def _read(self, kube: Kube, body: Mapping[str, Any]) -> JobSettings | None:
        meta = body.get("metadata") or {}
        job = JobRef(str(meta.get("namespace", "")), str(meta.get("name", "")))
        uid = str(meta.get("uid", ""))
        try:
            alerting = TrainingJobSpec.model_validate(body.get("spec") or {}).alerting
        except ValidationError as exc:
            # A reference that is no object name (the CRD refuses those; an older object may
            # carry one): read nothing, say which field. Else the operator reports the spec.
            bad = invalid_references(exc)
            return JobSettings(job, problems=bad, uid=uid) if bad else None
        if not (alerting.owners or alerting.feishu or alerting.onCallRosterRef):
            return None
        try:
            return await self._check(kube, job, uid, alerting)
        except InvalidName as exc:  # the client's own check, should the model's be bypassed
            return JobSettings(job, problems=((INVALID_REFERENCE, str(exc)),), uid=uid)
        except KubeError as exc:
            if (known := self._state.settings.get(job)) is not None:
                return known  # a passing API failure does not reroute a working job
            problem = ("ApiError", f"the gateway could not read the job's references: {exc}")
            return JobSettings(job, problems=(problem,), uid=uid)

    async def _check(self, kube: Kube, job: JobRef, uid: str, alerting: Alerting) -> JobSettings:
        owners, problems = check_owners(alerting.owners)
        works: list[str] = []
        destination: JobDestination | None = None
        feishu = alerting.feishu
        if feishu is not None and feishu.webhookSecretRef is not None:
            webhook = await self._webhook(kube, job, feishu.webhookSecretRef, problems)
            if webhook is not None:
                destination = JobDestination(webhook=webhook)
                works.append(f"cards to the bot of Secret {feishu.webhookSecretRef.name}")
        if feishu is not None and feishu.chatId is not None and destination is None:
            if not CHAT_ID.fullmatch(feishu.chatId):
                problems.append(("InvalidChatId", f"chatId {feishu.chatId[:80]!r} is not oc_..."))
            elif not self._has_app:
                problems.append(("NoFeishuApp", "chatId needs the gateway's Feishu app"))
            else:
                destination = JobDestination(chat_id=feishu.chatId)
                works.append(f"cards to chat {feishu.chatId}")
        roster, policies = await self._on_call(kube, job, alerting, problems, works)
        if owners:
            works.append(f"{len(owners)} owner(s) mentioned")
        summary = "; ".join(works)
        return JobSettings(
            job, destination, owners, roster, tuple(problems), uid, summary, policies
        )

    async def _on_call(
        self,
        kube: Kube,
        job: JobRef,
        alerting: Alerting,
        problems: list[Problem],
        works: list[str],
    ) -> tuple[Roster | None, dict[Priority, str]]:
        """The job's roster reference: (its inline roster, the escalation policies it names
        by priority); (None, {}) with a problem when it cannot be followed."""
        ref = alerting.onCallRosterRef
        if ref is None:
            return None, {}
        where = f"ConfigMap {ref.name} key {ref.key}"
        try:
            configmap = await kube.get(CONFIGMAPS, job.namespace, ref.name)
        except KubeError as exc:
            if exc.status != FORBIDDEN:
                raise
            problems.append(
                ("ConfigMapNotReadable", f"the gateway may not read ConfigMaps in {job.namespace}")
            )
            return None, {}
        text = ((configmap or {}).get("data") or {}).get(ref.key)
        if configmap is None:
            problems.append(("ConfigMapNotFound", f"no ConfigMap {ref.name} in {job.namespace}"))
        elif not isinstance(text, str):
            problems.append(("ConfigMapKeyMissing", f"ConfigMap {ref.name} has no key {ref.key}"))
        elif not isinstance(
            parsed := parse_roster(text, where, self.settings.phone_prefixes), JobOnCall
        ):
            problems.append(parsed)
        elif parsed.roster is not None:
            works.append(f"P0 pages call the roster of {where}")
            return parsed.roster, {}
        elif unknown := sorted(set(parsed.policies.values()) - self.escalation_policies):
            known = ", ".join(sorted(self.escalation_policies)) or "none configured"
            problems.append(
                (
                    "UnknownEscalationPolicy",
                    f"{where} names escalation policy {', '.join(map(repr, unknown))}, which "
                    f"the gateway does not have (oncall.escalation_policies: {known})",
                )
            )
        else:
            names = sorted(set(parsed.policies.values()))
            if len(names) == 1 and len(parsed.policies) == len(Priority):
                said = f"escalation policy {names[0]}"
            else:
                said = ", ".join(f"{p.value}: {n}" for p, n in sorted(parsed.policies.items()))
                said = f"escalation policies {said}"
            works.append(f"pages follow {said} ({where})")
            return None, dict(parsed.policies)
        return None, {}

    async def _webhook(
        self, kube: Kube, job: JobRef, ref: Any, problems: list[Problem]
    ) -> BotWebhook | None:
        try:
            secret = await kube.get(SECRETS, job.namespace, ref.name)  # the job's namespace only
        except KubeError as exc:
            if exc.status != FORBIDDEN:
                raise
            problems.append(
                (
                    "SecretNotReadable",
                    f"the gateway may not read Secrets in {job.namespace} (an admin allows it "
                    "with the chart's gateway.jobAlerting.secretNamespaces or namespaces)",
                )
            )
            return None
        if secret is None:
            problems.append(("SecretNotFound", f"no Secret {ref.name} in {job.namespace}"))
            return None
        url = secret_value(secret, ref.key)
        if not url:
            problems.append(("SecretKeyMissing", f"Secret {ref.name} has no key {ref.key}"))
            return None
        if not any(url.startswith(prefix) for prefix in self.settings.webhook_prefixes):
            problems.append(
                ("InvalidWebhook", f"Secret {ref.name} key {ref.key} is not a Feishu bot webhook")
            )
            return None
        signing = None
        if ref.secretKey:
            signing = secret_value(secret, ref.secretKey)
            if not signing:
                problems.append(
                    ("SecretKeyMissing", f"Secret {ref.name} has no key {ref.secretKey}")
                )
                return None
        return BotWebhook(f"job:{job}", url, signing)

    # the condition and the event ----------------------------------------------------------

    def _count(self) -> None:
        if self.metrics is not None:
            bad = sum(1 for ok, _, _ in self._state.written.values() if not ok)
            self.metrics.job_alerting_not_ready.set(bad)

    def _publish(self, job: JobRef) -> None:
        """Writes the job's condition (and an event) when it changed."""
        settings = self._state.settings.get(job)
        if settings is None:
            return
        sent = self._state.sent.get(job)
        wanted = condition_of(settings, sent.problem if sent is not None else None)
        if self._state.written.get(job) == wanted:
            return
        self._state.written[job] = wanted
        self._count()
        if not wanted[0]:
            log.warning("event=job_alerting_not_ready job=%s reason=%s", job, wanted[1])
        task = asyncio.create_task(self._write(settings, wanted))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, settings: JobSettings, wanted: tuple[bool, str, str]) -> None:
        ok, reason, message = wanted
        job = settings.job
        try:
            async with self._write_lock:  # one read-modify-write of conditions at a time
                kube = await self._kube()
                await self._patch_condition(kube, job, ok, reason, message)
                await kube.create(EVENTS, job.namespace, self._event(settings, wanted))
        except Exception as exc:  # the routing never depends on the status write
            log.warning("AlertingReady not written job=%s error=%s", job, type(exc).__name__)

    async def _patch_condition(
        self, kube: Kube, job: JobRef, ok: bool, reason: str, message: str
    ) -> None:
        await kube.rewrite_conditions(
            TRAININGJOBS,
            job.namespace,
            job.name,
            lambda conditions, meta: with_condition(
                conditions, ok, reason, message, self._now(), meta.get("generation")
            ),
        )

    def _event(self, settings: JobSettings, wanted: tuple[bool, str, str]) -> dict[str, Any]:
        ok, reason, message = wanted
        job = settings.job
        involved = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": job.name,
            "namespace": job.namespace,
            "uid": settings.uid,
        }
        return event(
            involved,
            job.namespace,
            "AlertingReady" if ok else reason,
            message,
            warning=not ok,
            component="trainsentry-gateway",
            at=self._clock(),
        )

    def _now(self) -> str:
        return self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # running -----------------------------------------------------------------------------

    def start(self, metrics: GatewayMetrics | None = None) -> None:
        self.metrics = metrics
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            try:  # a hanging API server must not stop later refreshes
                await asyncio.wait_for(self.refresh(), timeout=REFRESH_TIMEOUT_S)
            except Exception as exc:  # keep the last snapshot; try again next time
                log.warning("job alerting refresh failed error=%s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.settings.refresh_seconds)

    async def settle(self) -> None:
        """Waits for the condition and event writes under way (tests, shutdown)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.settle()
        await self._api.close()  # a later refresh (tests) opens a new client
