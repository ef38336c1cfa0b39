"""Feeds `status.lastAlert` of TrainingJobs from the gateway (the operator folds it into the
job's phase: Hung, Degraded).

After each committed batch, per job only the most urgent new firing alert (the latest on a
tie) is written, never over a more urgent alert of the job that is still firing (a P2 must
not turn a Hung job into a Degraded one), and the same alert and priority is not written
again within `min_interval` seconds, so a storm of 20,000 alerts costs a handful of API
calls, not 20,000. Failures are logged and dropped: the page never depends on the
Kubernetes API.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from trainsentry.alerts import AlertChange, ChangeKind, JobRef, Priority
from trainsentry.kube.client import LazyApiClient

log = logging.getLogger("trainsentry.job_status")


def latest_per_job(
    changes: Sequence[AlertChange], priorities: Mapping[int, str]
) -> dict[JobRef, tuple[AlertChange, Priority]]:
    """Per job, the most urgent new firing change (the latest on a tie)."""
    chosen: dict[JobRef, tuple[AlertChange, Priority]] = {}
    for change in changes:
        job = change.alert.job
        if job is None or change.kind is not ChangeKind.FIRING:
            continue
        priority = Priority(priorities.get(change.alert_id, "P3"))
        current = chosen.get(job)
        if current is None or priority.level <= current[1].level:
            chosen[job] = (change, priority)
    return chosen


class JobStatusFeeder:
    def __init__(
        self,
        api_factory: Callable[[], Awaitable[Any]],
        *,
        min_interval: float = 10.0,
        patch: Callable[..., Awaitable[bool]] | None = None,
    ) -> None:
        self._api = LazyApiClient(api_factory)
        self._min_interval = min_interval
        self._patch = patch
        self._last: dict[JobRef, tuple[str, str, float]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def feed(self, changes: Sequence[AlertChange], priorities: Mapping[int, str]) -> None:
        now = time.monotonic()
        for job, (change, priority) in latest_per_job(changes, priorities).items():
            last = self._last.get(job)
            if last is not None and Priority(last[1]).level < priority.level:
                continue  # a more urgent alert of the job is still firing: it stays lastAlert
            repeat = last is not None and last[:2] == (change.alert.name, priority.value)
            if repeat and last is not None and now - last[2] < self._min_interval:
                continue
            self._last[job] = (change.alert.name, priority.value, now)
            self._spawn(job, change, priority, "firing")
        for change in changes:  # the job's last alert resolved: the phase can recover
            resolved_job = change.alert.job
            if resolved_job is None or change.kind is ChangeKind.FIRING:
                continue
            last = self._last.get(resolved_job)
            if last is not None and last[0] == change.alert.name:
                del self._last[resolved_job]
                self._spawn(resolved_job, change, Priority(last[1]), "resolved")

    def feed_verdict(
        self, change: AlertChange, priority: Priority, summary: str, culprits: tuple[int, ...]
    ) -> None:
        """A hang alert's diagnosis: written into the job's lastAlert (the same alert), so the
        status says which rank within the diagnosis' seconds. Skipped when a more urgent
        alert of the job is its lastAlert."""
        job = change.alert.job
        if job is None:
            return
        last = self._last.get(job)
        if last is not None and Priority(last[1]).level < priority.level:
            return
        self._last[job] = (change.alert.name, priority.value, time.monotonic())
        self._spawn(job, change, priority, "firing", (summary, culprits))

    def _spawn(
        self,
        job: JobRef,
        change: AlertChange,
        priority: Priority,
        status: str,
        verdict: tuple[str, tuple[int, ...]] | None = None,
    ) -> None:
        task = asyncio.create_task(self._write(job, change, priority, status, verdict))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(
        self,
        job: JobRef,
        change: AlertChange,
        priority: Priority,
        status: str,
        verdict: tuple[str, tuple[int, ...]] | None = None,
    ) -> None:
        try:
            api = await self._api.get()
            patch = self._patch
            if patch is None:
                from trainsentry.operator.status import patch_last_alert

                patch = patch_last_alert
            extra: dict[str, Any] = {}
            if verdict is not None:
                extra = {"diagnosis": verdict[0], "culprit_ranks": verdict[1]}
            found = await patch(
                api,
                job.namespace,
                job.name,
                change.alert.name,
                priority,
                change.at,
                status=status,
                **extra,
            )
            if not found:
                log.debug("lastAlert: no TrainingJob %s", job)
        except Exception as exc:
            log.warning("lastAlert not written job=%s error=%s: %s", job, type(exc).__name__, exc)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._api.close()
