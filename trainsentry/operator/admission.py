"""The admission webhook's I/O: a pod being created → the TrainingJobs of its namespace →
`instrument.plan` (pure) → the job's probe token Secret made sure of → one log line, and an
Event on the job for what is worth a person's attention (once per process).

The kopf handler (`handlers.py`) only hands the pod in and the patch out. Everything here
fails open: an API error or a slow API gives an unchanged pod and a log line saying why,
within `budget_s` (below the webhook's timeout in the chart), never an exception.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp.web
import kopf

from trainsentry.kube.client import Kube, KubeError
from trainsentry.kube.events import event
from trainsentry.kube.resources import EVENTS, SECRETS, TRAININGJOBS
from trainsentry.operator.instrument import (
    InstrumentSettings,
    Plan,
    plan,
    token_secret,
    token_secret_name,
)
from trainsentry.operator.spec import API_VERSION, KIND, JobIdentity
from trainsentry.probe.token import job_token

log = logging.getLogger(__name__)

COMPONENT = "trainsentry-operator"
MAX_REMEMBERED = 10_000  # jobs whose Secret is known written / notes given, per process


def review_problem(review: Any) -> str | None:
    """Pure: what makes `review` not an admission.k8s.io AdmissionReview of an object (the
    fields kopf reads), or None. kopf would answer such a body with a 500."""
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        return "not an AdmissionReview: no request"
    request = review["request"]
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        return "request.uid is missing"
    resource = request.get("resource")
    if not isinstance(resource, dict) or not all(
        isinstance(resource.get(key), str) for key in ("group", "version", "resource")
    ):
        return "request.resource needs group, version and resource"
    if not isinstance(request.get("userInfo"), dict):
        return "request.userInfo is missing"
    if not isinstance(request.get("object"), dict) and not isinstance(
        request.get("oldObject"), dict
    ):
        return "request.object is missing"
    return None


class AdmissionServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server, answering the API server only.

    With `token` (the operator's credentials, `webhook_credentials.py`), a call whose path
    is not `/<webhook_id>/<token>` gets a 403 before anything is judged: no list, no Secret,
    no Event, no patch (the API server takes the path from the webhook configuration, which
    only cluster admins read). A body that is not an AdmissionReview gets a 400 saying why
    (`review_problem`) instead of kopf's 500. aiohttp's access log, which would write the
    path, is held at WARNING (`logs.quiet_url_loggers`)."""

    def __init__(
        self, *, webhook_id: str, token: Callable[[], str | None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.webhook_id = webhook_id
        self.token = token

    def allowed(self, webhook: str | None) -> bool:
        """Whether a call to the path `/<webhook>` is the API server's."""
        if self.token is None:
            return webhook == self.webhook_id
        token = self.token()
        expected = f"{self.webhook_id}/{token}"
        return token is not None and hmac.compare_digest(
            (webhook or "").encode(), expected.encode()
        )

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        async def checked(request: Any, **kwargs: Any) -> Any:
            if not self.allowed(kwargs.get("webhook")):
                log.warning("event=admission_refused reason=%r", "not the webhook's path")
                raise aiohttp.web.HTTPForbidden(reason="not the API server's webhook path")
            problem = review_problem(request)
            if problem is not None:
                raise aiohttp.web.HTTPBadRequest(reason=problem)
            return await fn(request, **{**kwargs, "webhook": self.webhook_id})

        async for config in super().__call__(checked):
            yield config


class JobLister:
    """The TrainingJobs of a namespace, one API list per namespace at a time: pods created
    together (a 1,000-pod job) wait for the same list instead of each making one. Nothing
    is cached after it answers, so a job applied a moment before its pods is seen."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}

    async def jobs(self, kube: Kube, namespace: str) -> list[dict[str, Any]]:
        running = self._running.get(namespace)
        if running is None:
            running = asyncio.ensure_future(kube.list(TRAININGJOBS, namespace))
            self._running[namespace] = running
            running.add_done_callback(lambda _: self._running.pop(namespace, None))
        return await asyncio.shield(running)


class ProbeSecrets:
    """Keeps each TrainingJob's probe token Secret (`instrument.token_secret`: the job's
    token derived from the master, owned by the job) in the job's namespace.

    Written with create, else (409) a merge patch: the operator never reads Secrets. Once
    written in this process for a job and token, not again (the reconcile asks on every
    resync); the token only changes with the master, i.e. a restart."""

    def __init__(self, master: str) -> None:
        self._master = master
        self._written: set[tuple[str, str]] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    async def ensure(self, kube: Kube, job: JobIdentity) -> bool:
        """Creates or updates the job's Secret unless done already; True if written."""
        token = job_token(self._master, job.namespace, job.name)
        key = (job.uid, token[:16])
        if key in self._written:
            return False
        async with self._locks.setdefault(job.uid, asyncio.Lock()):
            if key in self._written:
                return False
            manifest = token_secret(job, token)
            try:
                await kube.create(SECRETS, job.namespace, manifest)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                update = {"metadata": manifest["metadata"], "data": manifest["data"]}
                await kube.patch(SECRETS, job.namespace, token_secret_name(job.name), update)
            if len(self._written) >= MAX_REMEMBERED:
                self._written.clear()
            self._written.add(key)
        log.info(
            "event=probe_token_written job=%s secret=%s", job.key, manifest["metadata"]["name"]
        )
        return True

    def forget(self, uid: str) -> None:
        self._written = {key for key in self._written if key[0] != uid}
        self._locks.pop(uid, None)


def _pod_name(meta: Mapping[str, Any]) -> str:
    return str(meta.get("name") or f"{meta.get('generateName') or ''}*")


@dataclass
class Webhook:
    """Judges one pod at a time; see the module docstring."""

    settings: InstrumentSettings
    secrets: ProbeSecrets | None
    budget_s: float = 3.0
    lister: JobLister = field(default_factory=JobLister)
    _noted: set[tuple[str, str]] = field(default_factory=set)

    async def review(self, kube: Kube, pod: Mapping[str, Any], dry_run: bool = False) -> Plan:
        """The patch for `pod` (empty when unchanged), never raising."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget_s
        jobs: list[dict[str, Any]] = []
        try:
            if namespace:
                jobs = await asyncio.wait_for(self.lister.jobs(kube, namespace), self.budget_s)
            result = plan(pod, namespace, jobs, self.settings)
        except (KubeError, TimeoutError, OSError) as exc:
            result = Plan([], None, f"cannot read the TrainingJobs of {namespace}: {exc}")
        except Exception as exc:  # a bug must not block pods: log it, admit unchanged
            log.exception("event=pod_admission_failed namespace=%s", namespace)
            result = Plan([], None, f"internal error: {type(exc).__name__}")
        job_body = next((j for j in jobs if j["metadata"]["name"] == result.job), None)
        if result.ops and job_body is not None and self.secrets is not None and not dry_run:
            try:
                remaining = max(0.1, deadline - loop.time())
                await asyncio.wait_for(
                    self.secrets.ensure(kube, JobIdentity.from_body(job_body)), remaining
                )
            except (KubeError, TimeoutError, OSError) as exc:  # the pod's ref is optional
                log.warning(
                    "event=probe_token_not_written job=%s/%s error=%r",
                    namespace,
                    result.job,
                    str(exc),
                )
        log.info(
            "event=pod_admission namespace=%s pod=%r job=%s instrumented=%s reason=%r kept=%r",
            namespace,
            _pod_name(meta),
            result.job or "-",
            bool(result.ops),
            result.reason,
            result.kept,
        )
        if job_body is not None and not dry_run and not result.deliberate:
            await self._note(kube, job_body, result)
        return result

    async def _note(self, kube: Kube, job: Mapping[str, Any], result: Plan) -> None:
        """Tells the job's owners, once per process and message, that its pods are
        instrumented, what of their own settings was kept, or why a pod was not. The
        messages are `Plan.note` and `Plan.kept`: never the pod's own text (a caller's
        words on a job's Events would read as the operator's)."""
        notes = []
        if result.ops:
            notes.append(("Normal", "PodsInstrumented", result.note))
            if result.kept:
                kept = ", ".join(result.kept)
                notes.append(("Normal", "PodSettingsKept", f"kept the pod's own {kept}"))
        elif result.note:
            notes.append(("Warning", "PodNotInstrumented", result.note))
        meta = job["metadata"]
        involved = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": str(meta["name"]),
            "namespace": str(meta["namespace"]),
            "uid": str(meta.get("uid") or ""),
        }
        for kind, reason, message in notes:
            key = (involved["uid"], f"{reason}:{message}")
            if key in self._noted:
                continue
            if len(self._noted) >= MAX_REMEMBERED:
                self._noted.clear()
            self._noted.add(key)
            body = event(
                involved,
                involved["namespace"],
                reason,
                message,
                warning=kind == "Warning",
                component=COMPONENT,
                at=datetime.now(UTC),
            )
            try:
                await kube.create(EVENTS, involved["namespace"], body)
            except KubeError as exc:
                log.warning("event=event_not_written reason=%s error=%r", reason, str(exc))
