"""Diagnosed hang alerts: the page names the rank that never arrived.

When a hang alert of a TrainingJob fires, its notifications are written to the outbox held
for `hold_seconds` (inside the intake transaction). Right after the commit the gateway finds
the job's ranks (a static list, or the Kubernetes API by the TrainingJob's pod selector),
locates the stalled group's suspects from the job's triggers and their `/status`
(`hang_locate.locate`), fetches the suspects' and that group's Flight Recorder dumps (at
most `max_dumps`, within byte budgets) with the job's own probe token (`job_token` of
the master: a pod never sees the master token) (`hang_enrichment.enrich_hang`: bounded
concurrency, per-request timeouts, an overall deadline below the hold), runs the analyzer,
stores the verdict with the alert and releases the held notifications with the verdict in
their payload (`diagnosis`). When no dump can be read in time (or at all) but the ranks'
`/status` already showed which ranks never entered the stalled collective, the verdict
names those, saying it is from `/status` only (`hang_locate.Located.verdict`); so it does
when the few dumps read in time say `ok` or `slow` (they cannot overrule it). If
anything else fails or takes too long, the notifications go out at the end of the hold
without a verdict: the page is never lost and never late by more than the hold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from trainsentry.alerts import Alert, AlertChange, ChangeKind, JobRef, NotificationDraft
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.gateway.stages.hang.enrichment import (
    HangVerdict,
    PodAddress,
    RankEndpoint,
    endpoints_for_pods,
    enrich_hang,
)
from trainsentry.gateway.stages.hang.evidence import HangEvidence, host_of
from trainsentry.gateway.stages.hang.locate import Located, endpoint_pairs, locate, ready
from trainsentry.gateway.stages.hang.pods import rank_order
from trainsentry.gateway.stages.hang.probe_client import probe_tls
from trainsentry.gateway.stages.hang.probe_reading import ByteBudget, DumpLimits
from trainsentry.gateway.stages.hang.trigger import ALERTNAME as TRIGGER_ALERTNAME
from trainsentry.gateway.stages.services.paging import Paging
from trainsentry.kube.client import Kube, KubeError, LazyApiClient, RetryPolicy, default_api_client
from trainsentry.kube.resources import PODS, TRAININGJOBS
from trainsentry.probe.token import job_token
from trainsentry.store.alert_state import cancel_held, release_incident_held, save_verdict
from trainsentry.store.engine import Connection, Engine
from trainsentry.tasks import OwnedTask

log = logging.getLogger("trainsentry.diagnosis")

_ONE_TRY = RetryPolicy(attempts=1)  # the diagnosis has its own deadline; the page never waits
# The share of the diagnosis' deadline the dump fetch may use: the rest is the analysis'
# and the culprits' stacks' (the stacks tell a checkpoint from a hang).
FETCH_SHARE = 0.6
# Before the fetch, at scale (`_choose`): the wait for the job's other triggers, a share of
# what is left of the deadline (at the defaults, 4 s: 2 s of the 3 s settle; a large job's
# probes spread their triggers over 1 s per 1,000 ranks, so a longer wait gains few of
# them: 16,384 ranks had 16 % of theirs in after 3 s, and the 1 s left was too little for
# the search and the fetch), then the /status asked to locate the stalled group, a share
# of what the wait left.
SETTLE_SHARE = 0.5
LOCATE_SHARE = 0.4
# What the diagnosis keeps of its deadline after the fetch and the analysis when `/status`
# already found the missing ranks: the time to fall back to the verdict from `/status` (the
# fetch is left to end on its own, not waited for: a loaded loop takes its time).
STORE_MARGIN_S = 0.2
# The dumps' verdicts that do not overrule ranks `/status` saw never enter the stalled
# collective: none read in time (`unknown`), or too few read to show them (the culprit's
# dump alone, 1 of 32 at 4,096 ranks, said `ok`, and the page was cancelled).
NOT_SHOWN = ("unknown", "ok", "slow")


@dataclass(frozen=True, slots=True)
class JobRanks:
    """What the diagnosis finds of a job: where its ranks' probes listen, and its own
    checkpoint limit (the TrainingJob's `spec.checkpointLimitSeconds`, read with its ranks;
    None: the gateway's `diagnosis.checkpoint_limit_seconds`)."""

    endpoints: tuple[RankEndpoint, ...]
    checkpoint_limit_seconds: float | None = None


@dataclass
class Steps:
    """Where a diagnosis is: each step's name and when it began (monotonic seconds), for
    the log line of a diagnosis past its deadline (which step it did not finish)."""

    began: list[tuple[str, float]] = field(default_factory=list)

    def enter(self, name: str) -> None:
        self.began.append((name, time.monotonic()))

    def said(self, now: float) -> str:
        """Pure: "resolve 0.01 s, settle 3.00 s, locate 0.98 s (unfinished)" at `now`."""
        ends = [at for _, at in self.began[1:]] + [now]
        parts = [
            f"{name} {end - at:.2f} s" for (name, at), end in zip(self.began, ends, strict=True)
        ]
        return ", ".join(parts) + " (unfinished)" if parts else "not started"


class EndpointResolver(Protocol):
    async def __call__(self, job: JobRef) -> JobRanks: ...


class StaticEndpoints:
    """The configured rank addresses of each job ("namespace/name", or the name alone); its
    `JobRanks` are built once per job (a 16,384-rank job's are asked for by each trigger
    batch's source check and by the diagnosis)."""

    def __init__(self, table: Mapping[str, Sequence[str]]) -> None:
        self._table = {key: list(value) for key, value in table.items()}
        self._ranks: dict[str, JobRanks] = {}

    async def __call__(self, job: JobRef) -> JobRanks:
        key = str(job) if self._table.get(str(job)) else job.name
        ranks = self._ranks.get(key)
        if ranks is None:
            ranks = JobRanks(tuple(RankEndpoint(a) for a in self._table.get(key) or []))
            if key in self._table:  # only the configured jobs: the cache stays bounded
                self._ranks[key] = ranks
        return ranks


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
            for pod in sorted(pods, key=rank_order)  # rank r's probe at index r, if labelled
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
        # fetches given up on for the verdict from /status, ending their cleanup
        self._leftovers: set[asyncio.Future[HangVerdict]] = set()
        # alerts whose page the diagnosis cancelled (a probe stall the dumps do not confirm)
        self._quiet: set[int] = set()
        #: What the job's hang triggers said (`JobHangs.evidence`; assemble.py sets it).
        self.evidence: Callable[[JobRef], HangEvidence | None] = lambda job: None
        # the bytes of dumps held by all diagnoses at once; one diagnosis per job at a time
        self._total = ByteBudget(settings.total_dump_budget_bytes)
        self._per_job: dict[JobRef, asyncio.Lock] = {}
        self._hosts_of: dict[JobRef, tuple[tuple[RankEndpoint, ...], list[str]]] = {}
        self._warming: OwnedTask | None = None

    def warm_up(self) -> None:
        """Imports the analyzer (numpy, scipy: seconds on a loaded node) and reads the probe
        clients' CA bundle (`hang_http.probe_tls`) in the background now, not while the
        first hang page is held (the package `trainsentry.diagnostics` is lazy: its `api`
        module is what pulls them in)."""

        async def load() -> None:
            await asyncio.to_thread(importlib.import_module, "trainsentry.diagnostics.api")
            await asyncio.to_thread(probe_tls)  # the probe clients' CA bundle, read once

        if self._warming is None:
            self._warming = OwnedTask("diagnosis-warm-up", load)
            self._warming.start()

    async def rank_hosts(self, job: JobRef) -> list[str]:
        """The hosts (IP addresses) of the job's rank endpoints, as the diagnosis finds them
        (read again only when the resolver's endpoints are new ones: static ones are not)."""
        ranks = await self._resolver(job)
        seen = self._hosts_of.get(job)
        if seen is None or seen[0] is not ranks.endpoints:
            seen = (ranks.endpoints, [h for e in ranks.endpoints if (h := host_of(e.base_url))])
            if len(self._hosts_of) >= 64:
                self._hosts_of.clear()
            self._hosts_of[job] = seen
        return seen[1]

    def is_hang(self, alert: Alert) -> bool:
        return alert.name in self._alertnames and alert.job is not None

    async def prepare(
        self, conn: Connection, changes: Sequence[AlertChange]
    ) -> tuple[frozenset[int], frozenset[int]]:
        """Before a batch is planned: its newly firing hang alerts (their drafts will be held
        for their diagnosis), and its ended hang alerts whose pages were still held for a
        checkpoint's limit, now cancelled (the save ended in time: nobody was told of them).
        The policy needs both before it drafts: an incident whose lead nobody was told of
        owes its channels the next lead's card (incident.py `_move_lead`)."""
        held = {
            c.alert_id for c in changes if c.kind is ChangeKind.FIRING and self.is_hang(c.alert)
        }
        ended = [
            c.alert_id for c in changes if c.kind is not ChangeKind.FIRING and self.is_hang(c.alert)
        ]
        unsent = await cancel_held(conn, ended, "the checkpoint ended within its limit")
        return frozenset(held), frozenset(unsent)

    def hold(
        self,
        drafts: Sequence[NotificationDraft],
        now: datetime,
        held: Collection[int],
        unsent: Collection[int],
    ) -> None:
        """Holds the notifications of newly firing hang alerts (`held`, from `prepare`) until
        their diagnosis; held, they say the diagnosis is late (what stays true if it does not
        come within the hold: the verdict replaces it). The resolution of an alert nobody was
        paged for (`unsent`, from `prepare`, or a page the diagnosis cancelled) is written
        cancelled: nobody is told it is over. (Held pages are known to the store; cancelled
        ones are remembered in memory, so after a restart such a resolution is sent.)"""
        until = now + timedelta(seconds=self.settings.hold_seconds)
        late = late_text(self.settings.hold_seconds)
        for draft in drafts:
            if draft.alert_id in held:
                draft.extra["not_before"] = until
                draft.payload["diagnosis"] = late
            elif draft.alert_id in self._quiet or draft.alert_id in unsent:
                draft.extra["status"] = "cancelled"

    def start(self, changes: Collection[AlertChange]) -> None:
        """After the commit: diagnose each newly firing hang alert in the background, one
        diagnosis per job at a time (a second hang alert of the job waits for the first)."""
        for change in changes:
            if change.kind is ChangeKind.FIRING and self.is_hang(change.alert):
                task = asyncio.create_task(self._one_per_job(change))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _one_per_job(self, change: AlertChange) -> HangVerdict | None:
        job = change.alert.job
        assert job is not None
        if len(self._per_job) > 4096:
            self._per_job = {k: v for k, v in self._per_job.items() if v.locked()}
        async with self._per_job.setdefault(job, asyncio.Lock()):
            return await self.diagnose(change)

    async def _choose(
        self, job: JobRef, endpoints: Sequence[RankEndpoint], budget: float, steps: Steps
    ) -> Located:
        """Which dumps to fetch (`hang_locate.locate`), once the job's other ranks have had
        `settle_seconds` from its first trigger to post theirs. Both steps share `budget`
        (what is left of the diagnosis' deadline) with the fetch and the analysis after
        them: the wait at most SETTLE_SHARE of it, the /status asked LOCATE_SHARE of what
        the wait left. Cutting the wait short costs more than it saves: without the other
        triggers the stalled group's members are unknown and `locate` asks the probes that
        did not post (up to `max_status`) instead of the group."""
        started = time.monotonic()
        steps.enter("settle")
        pairs = endpoint_pairs(endpoints)  # once: 16,384 of them take tens of ms
        evidence = self.evidence(job)
        wait_until = started + budget * SETTLE_SHARE
        while evidence is not None and not ready(evidence, endpoints, pairs):
            if time.time() >= evidence.first_at + self.settings.settle_seconds:
                break
            if time.monotonic() >= wait_until:
                break
            await asyncio.sleep(0.1)
            evidence = self.evidence(job)
        waited = time.monotonic() - started
        left = budget - waited
        steps.enter("locate")
        located = await locate(
            lambda: self.evidence(job),
            endpoints,
            max_status=self.settings.max_status,
            max_dumps=self.settings.max_dumps,
            timeout_s=self.settings.request_timeout_seconds,
            deadline_s=max(0.1, min(2.0, left * LOCATE_SHARE)),
            concurrency=self.settings.status_concurrency,
            pairs=pairs,
        )
        key = located.key
        log.info(
            "diagnosis located job=%s pg=%s seq=%s status_asked=%d missing=%s dumps=%d of %d "
            "settle_s=%.2f locate_s=%.2f",
            job,
            key.pg if key else "-",
            key.seq if key else "-",
            located.status_asked,
            list(located.missing[:8]),
            len(located.dumps),
            len(endpoints),
            waited,
            time.monotonic() - started - waited,
        )
        return located

    async def diagnose(self, change: AlertChange) -> HangVerdict | None:
        """The verdict of a newly firing hang alert, stored and its held pages released.

        The whole diagnosis (finding the ranks, fetching, the analysis off the event loop,
        the culprits' stacks) gets `deadline_seconds`, which is below the hold: the fetch
        ends at FETCH_SHARE of it, leaving the rest to the analysis and the stacks. When
        `/status` found the missing ranks, the dumps' verdict must come STORE_MARGIN_S
        before the deadline, else (or when it is one of NOT_SHOWN: the dumps read did not
        show those ranks) the verdict is `/status`'s.
        Past the deadline it gives up (a log line says the diagnosis is late) and the held
        pages go out at the end of the hold saying so."""
        job = change.alert.job
        assert job is not None
        deadline = self.settings.deadline_seconds
        started = time.monotonic()
        steps = Steps()
        try:
            found = await asyncio.wait_for(self._verdict(job, deadline, steps), timeout=deadline)
        except TimeoutError:
            log.warning(
                "diagnosis late alert_id=%d job=%s: no verdict within %.1f s (%s); its page "
                "goes out at the end of the hold saying so",
                change.alert_id,
                job,
                deadline,
                steps.said(time.monotonic()),
            )
            return None
        except Exception as exc:  # a failed diagnosis must never lose the page
            log.warning("diagnosis failed job=%s error=%s: %s", job, type(exc).__name__, exc)
            return None
        if found is None:
            return None
        verdict, ranks = found
        try:
            page_summary, hold_until = verdict.summary, None
            if verdict.verdict == "checkpoint":
                limit = ranks.checkpoint_limit_seconds
                limit = self.settings.checkpoint_limit_seconds if limit is None else limit
                page_summary, hold_until = past_checkpoint_limit(verdict, limit, self._clock())
            quiet = _not_a_page(change, verdict)
            await self._store(
                change.alert_id,
                verdict,
                page_summary,
                quiet=quiet,
                hold_until=hold_until,
                started=started,
            )
            if self._on_verdict is not None:
                self._on_verdict(change, verdict)
            return verdict
        except Exception as exc:  # a failed diagnosis must never lose the page
            log.warning("diagnosis failed job=%s error=%s: %s", job, type(exc).__name__, exc)
            return None

    async def _verdict(
        self, job: JobRef, deadline: float, steps: Steps
    ) -> tuple[HangVerdict, JobRanks] | None:
        """The job's ranks and their verdict (None: no rank endpoints); `steps` says how far
        it got."""
        started = time.monotonic()
        steps.enter("resolve")
        ranks = await asyncio.wait_for(
            self._resolver(job), timeout=min(self.settings.request_timeout_seconds, deadline)
        )
        if not ranks.endpoints:
            log.warning("diagnosis: no rank endpoints for job=%s", job)
            return None
        budget = deadline - (time.monotonic() - started)
        located = await self._choose(job, ranks.endpoints, budget, steps)
        steps.enter("fetch and analysis")
        left = deadline - (time.monotonic() - started)
        total = len(ranks.endpoints)
        enriching = enrich_hang(
            job,
            located.dumps,
            job_token(self.token, job.namespace, job.name),  # never the master to a pod
            timeout_s=min(self.settings.request_timeout_seconds, left * FETCH_SHARE),
            deadline_s=left * FETCH_SHARE,
            concurrency=self.settings.concurrency,
            limits=DumpLimits(
                self.settings.max_dump_bytes,
                (ByteBudget(self.settings.dump_budget_bytes), self._total),
                total,
            ),
        )
        if not located.missing:
            verdict = await enriching
            return located.with_phases(verdict), ranks
        # `/status` found the missing ranks: the page names them even when no dump can be
        # read (in time, or at all), saying the verdict is from `/status` only. A culprit
        # whose stack did not come but whose `/status` said it saves a checkpoint makes it
        # a checkpoint either way (held to the limit; it releases no other held page).
        fetching = asyncio.ensure_future(enriching)
        try:
            await asyncio.wait({fetching}, timeout=max(0.0, left - STORE_MARGIN_S))
        finally:
            given_up = not fetching.done()
            if given_up:  # cancelled, not waited for: its cleanup runs on its own
                fetching.cancel()
                self._leftovers.add(fetching)
                fetching.add_done_callback(self._leftovers.discard)
        if given_up:
            why = "no dump was read within the diagnosis' deadline"
            verdict = HangVerdict(str(job), "unknown", why)
        else:
            verdict = fetching.result()
        fallback = located.verdict(str(job), total, _why_not(verdict), time.time())
        if fallback is None or verdict.verdict not in NOT_SHOWN:
            return located.with_phases(verdict), ranks
        verdict = dataclasses.replace(fallback, ranks_failed=verdict.ranks_failed)
        log.info(
            "diagnosis from /status only job=%s verdict=%s missing=%s elapsed_s=%.3f",
            job,
            verdict.verdict,
            list(located.missing[:8]),
            time.monotonic() - started,
        )
        return dataclasses.replace(verdict, elapsed_s=time.monotonic() - started), ranks

    async def _store(
        self,
        alert_id: int,
        verdict: HangVerdict,
        page_summary: str,
        *,
        quiet: bool,
        hold_until: datetime | None,
        started: float,
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
            update = {"diagnosis": page_summary, "culprit_ranks": list(verdict.culprit_ranks)}
            released = await save_verdict(
                conn, alert_id, verdict.to_dict(), update, now, cancel=quiet, hold_until=hold_until
            )
            if verdict.verdict == "hang":
                # A hang anywhere in the incident releases the pages held there for a
                # checkpoint (another of its alerts'), now, saying what the hang is; their
                # escalation's first call goes out now too.
                for other in await release_incident_held(conn, alert_id, update, now):
                    released += 1
                    if self._paging is not None:
                        await self._paging.postpone(conn, other, now, now)
            if quiet:
                if len(self._quiet) >= 10_000:  # bounded; a forgotten one only costs a notice
                    self._quiet.pop()
                self._quiet.add(alert_id)
        log.info(
            "diagnosis stored alert_id=%d verdict=%s culprits=%s released=%d held_until=%s "
            "took_s=%.3f",
            alert_id,
            verdict.verdict,
            list(verdict.culprit_ranks),
            released,
            hold_until.isoformat() if hold_until else "-",
            time.monotonic() - started,  # from the diagnosis' start to its verdict stored
        )
        if self._on_release is not None:
            self._on_release()

    async def stop(self) -> None:
        if self._warming is not None:
            await self._warming.stop()
        running: list[asyncio.Future[Any]] = [*self._tasks, *self._leftovers]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


def _why_not(verdict: HangVerdict) -> str:
    """Pure: why the dumps' `verdict` (in NOT_SHOWN) gave way to `/status`'s, for its
    summary."""
    if verdict.verdict == "unknown":
        return verdict.summary
    read = verdict.ranks_answered
    return f"the {read} dump{'s' if read != 1 else ''} read in time said {verdict.verdict}"


def late_text(hold_s: float) -> str:
    """Pure: what a held page says of its diagnosis until the verdict replaces it: true if
    the page goes out at the end of the hold without one."""
    return f"diagnosis late: no verdict within the {hold_s:g} s hold; this page went out without it"


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
