"""Diagnosed hang alerts: the page names the rank that never arrived.

When a hang alert of a TrainingJob fires, its notifications are written to the outbox held
for `hold_seconds` (inside the intake transaction). Right after the commit the gateway finds
the job's ranks (a static list, or the Kubernetes API by the TrainingJob's pod selector),
fetches every rank's Flight Recorder dump with the job's own probe token (`job_token` of
the master: a pod never sees the master token) (`hang_enrichment.enrich_hang`: bounded
concurrency, per-request timeouts, an overall deadline below the hold), runs the analyzer,
stores the verdict with the alert and releases the held notifications with the verdict in
their payload (`diagnosis`). If anything fails or takes too long, the notifications go out
at the end of the hold without a verdict: the page is never lost and never late by more
than the hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit

from trainsentry.alerts import Alert, AlertChange, ChangeKind, JobRef, NotificationDraft
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.gateway.stages.hang_enrichment import (
    HangVerdict,
    PodAddress,
    RankEndpoint,
    endpoints_for_pods,
    enrich_hang,
)
from trainsentry.gateway.stages.hang_trigger import ALERTNAME as TRIGGER_ALERTNAME
from trainsentry.gateway.stages.paging import Paging
from trainsentry.kube.client import Kube, KubeError, LazyApiClient, RetryPolicy, default_api_client
from trainsentry.kube.resources import PODS, TRAININGJOBS
from trainsentry.probe.token import job_token
from trainsentry.store.alert_state import cancel_held, save_verdict
from trainsentry.store.engine import Connection, Engine

log = logging.getLogger("trainsentry.diagnosis")

_ONE_TRY = RetryPolicy(attempts=1)  # the diagnosis has its own deadline; the page never waits


@dataclass(frozen=True, slots=True)
class JobRanks:
    """What the diagnosis finds of a job: where its ranks' probes listen, and its own
    checkpoint limit (the TrainingJob's `spec.checkpointLimitSeconds`, read with its ranks;
    None: the gateway's `diagnosis.checkpoint_limit_seconds`)."""

    endpoints: tuple[RankEndpoint, ...]
    checkpoint_limit_seconds: float | None = None


class EndpointResolver(Protocol):
    async def __call__(self, job: JobRef) -> JobRanks: ...


class StaticEndpoints:
    def __init__(self, table: Mapping[str, Sequence[str]]) -> None:
        self._table = {key: list(value) for key, value in table.items()}

    async def __call__(self, job: JobRef) -> JobRanks:
        addresses = self._table.get(str(job)) or self._table.get(job.name) or []
        return JobRanks(tuple(RankEndpoint(address) for address in addresses))


class KubernetesEndpoints:
    """The job's running pods, found by the TrainingJob's selector (one endpoint per rank),
    and the TrainingJob's checkpoint limit, read from the same TrainingJob object.
    The job's namespace and name come from alert labels: the client refuses ones that are
    no Kubernetes names (InvalidName) before any request, and the diagnosis fails."""

    def __init__(
        self,
        api_client: Any | None = None,
        api_factory: Callable[[], Awaitable[Any]] = default_api_client,
    ) -> None:
        async def given() -> Any:
            return api_client

        self._api = LazyApiClient(api_factory if api_client is None else given)

    async def __call__(self, job: JobRef) -> JobRanks:
        from trainsentry.operator.spec import TrainingJobSpec

        kube = Kube(await self._api.get(), _ONE_TRY)
        body = await kube.get(TRAININGJOBS, job.namespace, job.name)
        if body is None:
            raise KubeError(404, f"no TrainingJob {job}")
        spec = TrainingJobSpec.model_validate(body.get("spec") or {})
        pods = await kube.list(PODS, job.namespace, spec.pod_selector().as_string())
        running = [
            PodAddress(
                str((pod.get("metadata") or {}).get("name") or ""),
                str((pod.get("status") or {}).get("podIP") or ""),
                str((pod.get("spec") or {}).get("nodeName") or ""),
            )
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running"
        ]
        endpoints = endpoints_for_pods(
            running, base_port=spec.probe.port, ranks_per_pod=spec.ranksPerPod
        )
        limit = spec.checkpointLimitSeconds
        return JobRanks(tuple(endpoints), None if limit is None else float(limit))


class HangDiagnoser:
    def __init__(
        self,
        engine: Engine,
        settings: DiagnosisSettings,
        resolver: EndpointResolver,
        probe_token: str,
        *,
        clock: Callable[[], datetime],
        on_release: Callable[[], None] | None = None,
        on_verdict: Callable[[AlertChange, HangVerdict], None] | None = None,
        paging: Paging | None = None,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self._engine = engine
        self.settings = settings
        self._alertnames = frozenset(settings.alertnames)
        self._resolver = resolver
        self.token = probe_token
        self._clock = clock
        self._on_release = on_release
        self._on_verdict = on_verdict
        # A page cancelled (not a hang) also stops its phone escalation, under the policy's
        # lock like an ack: the escalation state is one document the ticker also writes.
        self._paging = paging
        self._lock = lock or asyncio.Lock()
        self._tasks: set[asyncio.Task[HangVerdict | None]] = set()
        # alerts whose page the diagnosis cancelled (a probe stall the dumps do not confirm)
        self._quiet: set[int] = set()

    async def rank_hosts(self, job: JobRef) -> list[str]:
        """The hosts (IP addresses) of the job's rank endpoints, as the diagnosis finds them."""
        ranks = await self._resolver(job)
        return [h for e in ranks.endpoints if (h := urlsplit(e.base_url).hostname)]

    def is_hang(self, alert: Alert) -> bool:
        return alert.name in self._alertnames and alert.job is not None

    async def hold(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        drafts: Sequence[NotificationDraft],
        now: datetime,
    ) -> None:
        """Holds the notifications of newly firing hang alerts until their diagnosis. When a
        hang alert resolves, pages still held for a checkpoint's limit are cancelled (the
        save ended in time), and the resolution of an alert nobody was paged for (those, or
        a page the diagnosis cancelled) is written cancelled too: nobody is told it is over.
        (Held pages are known to the store; cancelled ones are remembered in memory, so
        after a restart such a resolution is sent.)"""
        held = {
            c.alert_id for c in changes if c.kind is ChangeKind.FIRING and self.is_hang(c.alert)
        }
        ended = [
            c.alert_id for c in changes if c.kind is not ChangeKind.FIRING and self.is_hang(c.alert)
        ]
        unpaged = await cancel_held(conn, ended, "the checkpoint ended within its limit")
        until = now + timedelta(seconds=self.settings.hold_seconds)
        for draft in drafts:
            if draft.alert_id in held:
                draft.extra["not_before"] = until
            elif draft.alert_id in self._quiet or draft.alert_id in unpaged:
                draft.extra["status"] = "cancelled"

    def start(self, changes: Collection[AlertChange]) -> None:
        """After the commit: diagnose each newly firing hang alert in the background."""
        for change in changes:
            if change.kind is ChangeKind.FIRING and self.is_hang(change.alert):
                task = asyncio.create_task(self.diagnose(change))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def diagnose(self, change: AlertChange) -> HangVerdict | None:
        job = change.alert.job
        assert job is not None
        try:
            ranks = await asyncio.wait_for(
                self._resolver(job), timeout=self.settings.request_timeout_seconds
            )
            endpoints = ranks.endpoints
            if not endpoints:
                log.warning("diagnosis: no rank endpoints for job=%s", job)
                return None
            verdict = await enrich_hang(
                job,
                endpoints,
                job_token(self.token, job.namespace, job.name),  # never the master to a pod
                timeout_s=self.settings.request_timeout_seconds,
                deadline_s=self.settings.deadline_seconds,
                concurrency=self.settings.concurrency,
            )
            page_summary, hold_until = verdict.summary, None
            if verdict.verdict == "checkpoint":
                limit = ranks.checkpoint_limit_seconds
                limit = self.settings.checkpoint_limit_seconds if limit is None else limit
                page_summary, hold_until = past_checkpoint_limit(verdict, limit, self._clock())
            quiet = _not_a_page(change, verdict)
            await self._store(
                change.alert_id, verdict, page_summary, quiet=quiet, hold_until=hold_until
            )
            if self._on_verdict is not None:
                self._on_verdict(change, verdict)
            return verdict
        except Exception as exc:  # a failed diagnosis must never lose the page
            log.warning("diagnosis failed job=%s error=%s: %s", job, type(exc).__name__, exc)
            return None

    async def _store(
        self,
        alert_id: int,
        verdict: HangVerdict,
        page_summary: str,
        *,
        quiet: bool,
        hold_until: datetime | None,
    ) -> None:
        now = self._clock()
        async with self._lock, self._engine.begin() as conn:
            # Not a hang after all (`_not_a_page`): the held pages are cancelled, not sent,
            # and the escalation they opened stops (its later steps would ring otherwise).
            # A checkpoint within its limit: the pages (the first call too) wait until the
            # limit and go out then unless the stall ends first (`settle`).
            if quiet and self._paging is not None:
                await self._paging.acknowledge(conn, alert_id, f"diagnosis: {verdict.verdict}", now)
            elif hold_until is not None and self._paging is not None:
                await self._paging.postpone(conn, alert_id, hold_until, now)
            released = await save_verdict(
                conn,
                alert_id,
                verdict.to_dict(),
                {"diagnosis": page_summary, "culprit_ranks": list(verdict.culprit_ranks)},
                now,
                cancel=quiet,
                hold_until=hold_until,
            )
            if quiet:
                if len(self._quiet) >= 10_000:  # bounded; a forgotten one only costs a notice
                    self._quiet.pop()
                self._quiet.add(alert_id)
        log.info(
            "diagnosis stored alert_id=%d verdict=%s culprits=%s released=%d held_until=%s",
            alert_id,
            verdict.verdict,
            list(verdict.culprit_ranks),
            released,
            hold_until.isoformat() if hold_until else "-",
        )
        if self._on_release is not None:
            self._on_release()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def past_checkpoint_limit(
    verdict: HangVerdict, limit_s: float, now: datetime
) -> tuple[str, datetime | None]:
    """Pure: what the page of a `checkpoint` verdict says, and when it goes out (None: now).

    The peers began waiting `hang.waited_s` before the dumps were taken; once they have
    waited `limit_s` the checkpoint is paged as one that does not end. Until then the pages
    are held (the returned time); their text says what will be true when they go out.
    """
    hang = (verdict.report or {}).get("hang") or {}
    waited = float(hang.get("waited_s") or 0.0)
    page_at = now + timedelta(seconds=max(0.0, limit_s - waited))
    minutes = f"{limit_s / 60:.0f} min" if limit_s >= 120 else f"{limit_s:.0f} s"
    saving = verdict.summary.split("; its peers wait", 1)[0]
    summary = f"{saving} past the job's checkpoint limit ({minutes}); its peers still wait"
    return summary, (page_at if page_at > now else None)


def _not_a_page(change: AlertChange, verdict: HangVerdict) -> bool:
    """Pure: whether a diagnosed hang alert's held pages are cancelled instead of sent.

    (A `checkpoint` is not cancelled: its pages are held until the checkpoint limit.)
    - A probe's own stall alert whose dumps show no hang (`ok`, `slow`): the group moved on
      before the diagnosis looked (a long but finished wait, e.g. on a loaded node); the
      probe's threshold is adaptive, so this is a judgement the dumps overrule. The
      Prometheus rules' alerts keep their page: their thresholds are the user's choice.
    A diagnosis that could not look (`unknown`) never cancels: the page goes out.
    """
    return change.alert.name == TRIGGER_ALERTNAME and verdict.verdict in ("ok", "slow")
