"""A probe's hang trigger becomes a stored, diagnosed hang alert (the fast hang path).

`POST /api/v1/hang-triggers` (bearer: the probes' token) takes what a stalled rank's probe
posts (`trainsentry/probe/trigger.py`). A job's triggers are **one hang**: the first one
becomes the P0 alert `TrainingCollectiveStalled` of (namespace, trainingjob), which then goes
through the same intake as Alertmanager's webhooks (stored before the answer, classified,
held for the hang diagnosis, sent with the rank named); every later trigger of that job,
whatever its (pg, seq), is answered from memory (`"hang": "known"`, no store transaction)
and only noted as evidence for the diagnosis (`evidence.py`); the probe then stops
posting. One alert, one card, one page per job hang, at any rank count.

Invariants:
- One firing hang per job: the first trigger stores it (its `startsAt`: when that rank
  began waiting); later ones join it. Memory is checked against the store at most once per
  `window_s` per job (and after a restart), so a hang the store no longer has firing (it
  resolved or expired) is not joined.
- A hang ends when the collective it was raised for completes (a `resolved: true` trigger
  of its first (pg, seq)); the end of another key only removes that key from the evidence;
  the end of a stall never stored is ignored (no alert is made from it).
- Per-job budget: at most `writes_per_minute` store writes per job (new hangs and ends);
  beyond, 429 with Retry-After. Triggers of a known hang cost no write and no budget.
- A trigger of a known hang is answered in the turn of the event loop that handles it
  (`JobHangs.known`, `TriggerSources.cached`): no store transaction, no task, no await, no
  diagnosis work beyond noting its evidence (bounded, `evidence.py`), and a pre-encoded
  answer (`KNOWN_BODY`). The trigger port's process answers them from its own copy of that
  memory (`api/trigger_listener.py`): `JobHangs.known_for` and `TriggerSources.remembered` say
  for how long the gateway itself would answer from memory, `JobHangs.noted` takes the
  evidence of the triggers it answered, `JobHangs.on_forget` says when a hang stops being
  known (ended, not found in the store, evicted).
- Per-job turns (`LoopTurns`): at most `per_turn` triggers of one job are handled in one
  turn of the event loop; the job's others wait for the next turns, in order (none is
  refused). Every connection's request is otherwise handled in the turn its bytes arrive
  in, so a job's 25,000 triggers made each turn long and every other job's webhook, whose
  store writes take a turn each, waited behind thousands of them per write.
- No trigger waits on another's write: those that arrive while the job's first trigger is
  being looked up or stored are noted as that hang's evidence and answered at once
  (`"hang": "pending"`: not "known", so the probe keeps posting its later stalls). If that
  write fails, its poster gets the error and retries (the evidence noted meanwhile is
  dropped with it); a 16,384-rank job's ranks all post within one poll interval.
- Everything in a trigger is attacker-controlled: the body is capped (8 KiB), every field
  is typed and bounded, names must be Kubernetes names, and only fixed, known labels are
  built from it (no free-form labels or annotations pass through).
- A trigger for job J carries J's own token (`trainsentry.probe.token.job_token` of the
  master probe token, which the operator keeps in a Secret next to J), or the master itself
  (`trigger_token_ok`): a team's token speaks for its own job only. And a trigger is
  accepted only from an address of one of the job's ranks (`TriggerSources`: the job's
  probe endpoints as the diagnosis finds them, cached 30 s), so one team's pod cannot page
  another team's job even with a token that is not per job, and a job that does not exist
  is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainsentry.alerts import PROBE_HANG_ALERT, JobRef
from trainsentry.credentials import secrets_equal
from trainsentry.gateway.stages.hang.evidence import (
    RANKS_PATTERN,
    HangEvidence,
    JobEvidence,
    Waiter,
)
from trainsentry.gateway.stages.intake import label_fingerprint
from trainsentry.probe.token import job_token

ALERTNAME = PROBE_HANG_ALERT
MAX_TRIGGER_BYTES = 8 * 1024
_REMEMBERED = 4096

_K8S_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
K8sName = Annotated[str, Field(min_length=1, max_length=253, pattern=_K8S_NAME)]
Text = Annotated[str, Field(max_length=256)]


class HangTrigger(BaseModel):
    """What a probe posts; see `trainsentry/probe/trigger.py`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    namespace: K8sName
    trainingjob: K8sName
    pg: Annotated[str, Field(min_length=1, max_length=128)]
    seq: int = Field(ge=0, le=2**62)
    rank: int = Field(ge=0, le=10**7)
    pod: Text = ""
    node: Text = ""
    pg_desc: Text = ""
    op: Text = ""
    state: Text = ""
    world_size: int = Field(default=0, ge=0, le=10**7)
    waited_s: float = Field(ge=0, le=10**7)
    threshold_s: float = Field(default=0, ge=0, le=10**7)
    #: The rank saw its group move past the collective: the stall is over.
    resolved: bool = False
    #: When the rank began waiting (unix seconds; 0: not said, then now - waited_s).
    since: float = Field(default=0, ge=0, le=10**11)
    #: The group's member ranks, compact ("0-7,64-120:8"; `hang_evidence.parse_ranks`).
    group_ranks: Annotated[str, Field(max_length=4096, pattern=RANKS_PATTERN)] = ""
    #: Where this rank's probe listens (its port; its host is the sender's address).
    port: int = Field(default=0, ge=0, le=65535)
    local_rank: int = Field(default=-1, ge=-1, le=10**6)


class TriggerRejected(ValueError):
    """Not a usable trigger; the message is safe to return to the sender."""


def parse_trigger(body: bytes) -> HangTrigger:
    """Pure: the trigger in `body`, or TriggerRejected saying why not."""
    if len(body) > MAX_TRIGGER_BYTES:
        raise TriggerRejected(f"body larger than {MAX_TRIGGER_BYTES} bytes")
    try:
        return HangTrigger.model_validate_json(body)
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise TriggerRejected(f"not a hang trigger: {where}") from None


def trigger_token_ok(given: str, master: str, trigger: HangTrigger) -> bool:
    """Pure: whether `given` may post `trigger`: the token of the trigger's own job, or the
    master probe token. Both compared in constant time, always both."""
    own = job_token(master, trigger.namespace, trigger.trainingjob)
    matches = [secrets_equal(given, own), secrets_equal(given, master)]
    return any(matches)


def trigger_labels(trigger: HangTrigger) -> dict[str, str]:
    """Pure: the alert's labels: the job (namespace, trainingjob) and constants. Not the
    (pg, seq): a job's stalls are one hang, whichever groups its ranks wait in."""
    return {
        "alertname": ALERTNAME,
        "namespace": trigger.namespace,
        "trainingjob": trigger.trainingjob,
        "priority": "P0",
        "component": "training",
        "source": "probe",
    }


def trigger_webhook(
    trigger: HangTrigger, starts_at: datetime, now: datetime | None = None
) -> bytes:
    """Pure: an Alertmanager webhook (version 4) body holding the trigger's one alert:
    firing, or resolved at `now` when the trigger says the stall ended."""
    labels = trigger_labels(trigger)
    group = trigger.pg_desc or trigger.pg
    what = (
        f"{trigger.op} #{trigger.seq}"
        if trigger.op and trigger.op != "unknown"
        else (f"collective #{trigger.seq}")
    )
    annotations = {
        "summary": (
            f"Job {trigger.namespace}/{trigger.trainingjob} is stalled in {what} of pg {group}"
        ),
        "description": (
            f"Rank {trigger.rank} (pod {trigger.pod or '?'}, node {trigger.node or '?'}) has "
            f"waited {trigger.waited_s:.0f} s in {what} of process group {trigger.pg} "
            f"({group}); its group's stall threshold is {trigger.threshold_s:.0f} s."
        ),
        # When the stall began: the weekly report measures time to detection from it.
        "stalled_since": ((now or starts_at) - timedelta(seconds=trigger.waited_s))
        .astimezone(UTC)
        .isoformat(),
        "why": (
            "A rank's probe saw its peers wait far longer than this process group normally "
            "takes: some rank never entered the collective. The diagnosis names it."
        ),
        # The collective the hang was raised for: its completion ends the hang.
        "pg": trigger.pg,
        "seq": str(trigger.seq),
    }
    status = "resolved" if trigger.resolved else "firing"
    ends = (now or starts_at) if trigger.resolved else None
    alert = {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": starts_at.astimezone(UTC).isoformat(),
        "endsAt": ends.astimezone(UTC).isoformat() if ends else "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": "",
    }
    payload = {
        "version": "4",
        "groupKey": f"trainsentry-probe/{trigger.namespace}/{trigger.trainingjob}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "trainsentry-probe",
        "groupLabels": {"alertname": ALERTNAME},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [alert],
    }
    return json.dumps(payload).encode()


@dataclass(frozen=True)
class TriggerAnswer:
    """What the endpoint answers: HTTP status, JSON body, and Retry-After for a 429."""

    status: int
    body: dict[str, Any]
    retry_after_s: float | None = None


@dataclass
class _Hang:
    starts_at: datetime
    #: The (pg, seq) it was raised for (None after a restart that read no annotation).
    key: tuple[str, int] | None
    checked: float  # monotonic: when the store last had it firing (or wrote it)
    evidence: JobEvidence


KNOWN = {"status": "known", "hang": "known", "first": False, "new": 0}
PENDING = {"status": "noted", "hang": "pending", "first": False, "new": 0}
#: The answer to a trigger of a known hang, encoded once (the probe stops posting on it).
KNOWN_BODY = json.dumps(KNOWN).encode()
#: A job's triggers handled in one turn of the event loop (`LoopTurns`).
TRIGGERS_PER_TURN = 32


class LoopTurns:
    """A per-key budget of work per turn of the running event loop: `turn(key)` returns at
    once for the first `per_turn` callers of a key in a turn, and later callers of that key
    wait for later turns, `per_turn` of them a turn, first come first served (none is
    refused; one cancelled while waiting gives up its place). Other keys never wait on a
    key's queue. Idle, it schedules nothing; busy, one callback a turn."""

    def __init__(self, per_turn: int = TRIGGERS_PER_TURN) -> None:
        self.per_turn = per_turn
        self._used: dict[Hashable, int] = {}
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._ticking = False

    async def turn(self, key: Hashable) -> None:
        """Returns when `key` may be worked on (see the class invariants)."""
        used = self._used.get(key, 0)
        if used < self.per_turn and key not in self._waiting:
            self._used[key] = used + 1
            self._tick_soon()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(future)
        self._tick_soon()
        await future

    def waiting(self, key: Hashable) -> int:
        """How many callers of `key` wait for a turn now."""
        return len(self._waiting.get(key, ()))

    def _tick_soon(self) -> None:
        if not self._ticking:
            self._ticking = True
            asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        """A new turn: every key's budget back, spent first on the keys' waiting callers."""
        self._ticking = False
        self._used.clear()
        for key, queue in list(self._waiting.items()):
            released = 0
            while queue and released < self.per_turn:
                future = queue.popleft()
                if not future.done():  # a cancelled waiter gives its place up
                    future.set_result(None)
                    released += 1
            if released:
                self._used[key] = released
            if not queue:
                del self._waiting[key]
        if self._used or self._waiting:
            self._tick_soon()


def _since(trigger: HangTrigger, wall: float) -> float:
    """Pure: when the rank began waiting: its own `since` when plausible (within a day of
    the gateway's clock), else the gateway's clock less `waited_s`."""
    if trigger.since > 0 and abs(trigger.since - wall) <= 86400:
        return trigger.since
    return wall - trigger.waited_s


class JobHangs:
    """The open hang of each job, its evidence and its write budget (module invariants).

    `lookup(fingerprint)`: the store's firing occurrence of that alert (its startsAt and
    annotations), or None. `submit(webhook body)`: stores it, returns the number of new
    alerts; the store's and the intake's errors pass through to the caller.
    """

    def __init__(
        self,
        lookup: Callable[[str], Awaitable[tuple[datetime, Mapping[str, str]] | None]],
        submit: Callable[[bytes], Awaitable[int]],
        *,
        window_s: float = 600.0,
        writes_per_minute: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._lookup = lookup
        self._submit = submit
        self._window_s = window_s
        self._rate = writes_per_minute / 60.0
        self._burst = max(1.0, writes_per_minute)
        self._clock = clock
        self._wall = wall
        self._hangs: OrderedDict[JobRef, _Hang] = OrderedDict()
        self._locks: dict[JobRef, asyncio.Lock] = {}
        # the evidence of each job whose first trigger is being looked up or stored
        self._pending: dict[JobRef, JobEvidence] = {}
        self._buckets: OrderedDict[JobRef, tuple[float, float]] = OrderedDict()
        self._watchers: list[Callable[[JobRef], None]] = []
        #: Each job's triggers a turn of the event loop (module invariants).
        self.turns = LoopTurns()

    def on_forget(self, watcher: Callable[[JobRef], None]) -> Callable[[], None]:
        """Calls `watcher(job)` whenever a job's hang leaves memory (its stall ended, the
        store has it no longer, or it was evicted); returns the call that stops it."""
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    def known_for(self, job: JobRef) -> float | None:
        """For how many more seconds the job's later stall triggers are answered "known"
        from memory (`known`) before the store is asked again; None: not now."""
        hang = self._open(job)
        if hang is None:
            return None
        return max(0.0, self._window_s - (self._clock() - hang.checked))

    def noted(self, trigger: HangTrigger, remote: str | None) -> bool:
        """A trigger answered "known" elsewhere (the trigger port's process) noted as its
        job's hang's evidence, as `known` notes it; False when no hang of the job is in
        memory any more (then it is dropped)."""
        hang = self._hangs.get(JobRef(trigger.namespace, trigger.trainingjob))
        if hang is None or trigger.resolved:
            return False
        self._note(hang.evidence, trigger, remote)
        return True

    def evidence(self, job: JobRef) -> HangEvidence | None:
        """What the job's triggers said so far (None: no hang of it in memory)."""
        hang = self._hangs.get(job)
        return hang.evidence.snapshot() if hang is not None else None

    def known(self, trigger: HangTrigger, remote: str | None) -> bool:
        """Whether `trigger` (authenticated, from an address of its job's ranks) is a stall
        of its job's open hang; if so it is noted as that hang's evidence, and its answer is
        200 `KNOWN_BODY`. Memory only: no store, no await."""
        if trigger.resolved:
            return False
        hang = self._open(JobRef(trigger.namespace, trigger.trainingjob))
        if hang is None:
            return False
        self._note(hang.evidence, trigger, remote)
        return True

    async def take(self, trigger: HangTrigger, remote: str | None, now: datetime) -> TriggerAnswer:
        """One authenticated trigger from an address of its job's ranks."""
        job = JobRef(trigger.namespace, trigger.trainingjob)
        if self.known(trigger, remote):  # the cheap path: memory only
            return TriggerAnswer(200, dict(KNOWN))
        pending = self._pending.get(job)
        if pending is not None and not trigger.resolved:  # memory only too (invariants)
            self._note(pending, trigger, remote)
            return TriggerAnswer(200, dict(PENDING))
        async with self._lock(job):
            hang = self._open(job)
            if trigger.resolved:
                return await self._end(job, hang or await self._adopt(job, None), trigger, now)
            if hang is not None:
                self._note(hang.evidence, trigger, remote)
                return TriggerAnswer(200, dict(KNOWN))
            old = self._hangs.get(job)
            evidence = old.evidence if old is not None else JobEvidence(self._wall())
            self._pending[job] = evidence
            try:
                return await self._first(job, trigger, remote, now, evidence)
            finally:
                self._pending.pop(job, None)

    async def _first(
        self,
        job: JobRef,
        trigger: HangTrigger,
        remote: str | None,
        now: datetime,
        evidence: JobEvidence,
    ) -> TriggerAnswer:
        """A stall trigger of a job with no open hang in memory: joins the store's firing
        hang, else stores it (within the budget); either way `evidence` is the hang's."""
        hang = await self._adopt(job, evidence)
        if hang is not None:
            self._note(hang.evidence, trigger, remote)
            return TriggerAnswer(200, dict(KNOWN))
        if not self._spend(job):
            return _over_budget()
        starts_at = (now - timedelta(seconds=trigger.waited_s)).replace(microsecond=0)
        new = await self._submit(trigger_webhook(trigger, starts_at, now))
        hang = _Hang(starts_at, (trigger.pg, trigger.seq), self._clock(), evidence)
        self._remember(job, hang)
        self._note(hang.evidence, trigger, remote)
        return TriggerAnswer(202, {"status": "stored", "hang": "known", "first": True, "new": new})

    async def _end(
        self, job: JobRef, hang: _Hang | None, trigger: HangTrigger, now: datetime
    ) -> TriggerAnswer:
        if hang is None:
            return TriggerAnswer(200, {"status": "ignored", "reason": "no such stall"})
        if hang.key is not None and hang.key != (trigger.pg, trigger.seq):
            hang.evidence.ended(trigger.pg, trigger.seq)
            return TriggerAnswer(200, {"status": "noted", "reason": "not the hang's collective"})
        if not self._spend(job):
            return _over_budget()
        await self._submit(trigger_webhook(trigger, hang.starts_at, now))
        self._forget(job)
        return TriggerAnswer(202, {"status": "stored", "resolved": True, "first": False, "new": 0})

    def _open(self, job: JobRef) -> _Hang | None:
        hang = self._hangs.get(job)
        if hang is None or self._clock() - hang.checked > self._window_s:
            return None
        return hang

    async def _adopt(self, job: JobRef, evidence: JobEvidence | None) -> _Hang | None:
        """The store's firing hang of the job (after a restart, or once per window), with
        `evidence` (else the evidence in memory, else none yet)."""
        labels = {"alertname": ALERTNAME, "namespace": job.namespace, "trainingjob": job.name}
        labels |= {"priority": "P0", "component": "training", "source": "probe"}
        found = await self._lookup(label_fingerprint(labels))
        if found is None:
            self._forget(job)
            return None
        starts_at, annotations = found
        seq = str(annotations.get("seq", ""))
        key = (str(annotations["pg"]), int(seq)) if "pg" in annotations and seq.isdigit() else None
        if evidence is None:
            old = self._hangs.get(job)
            evidence = old.evidence if old is not None else JobEvidence(self._wall())
        hang = _Hang(starts_at, key, self._clock(), evidence)
        self._remember(job, hang)
        return hang

    def _remember(self, job: JobRef, hang: _Hang) -> None:
        self._hangs[job] = hang
        self._hangs.move_to_end(job)
        while len(self._hangs) > _REMEMBERED:
            self._tell(self._hangs.popitem(last=False)[0])

    def _forget(self, job: JobRef) -> None:
        if self._hangs.pop(job, None) is not None:
            self._tell(job)

    def _tell(self, job: JobRef) -> None:
        for watcher in list(self._watchers):
            watcher(job)

    def _note(self, evidence: JobEvidence, trigger: HangTrigger, remote: str | None) -> None:
        waiter = Waiter(
            trigger.rank, remote or "", trigger.port, trigger.local_rank, trigger.pod, trigger.node
        )
        evidence.note(
            pg=trigger.pg,
            seq=trigger.seq,
            pg_desc=trigger.pg_desc,
            op=trigger.op,
            since=_since(trigger, self._wall()),
            members=trigger.group_ranks,
            waiter=waiter,
            world_size=trigger.world_size,
        )

    def _lock(self, job: JobRef) -> asyncio.Lock:
        if len(self._locks) > _REMEMBERED:
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        return self._locks.setdefault(job, asyncio.Lock())

    def _spend(self, job: JobRef) -> bool:
        """Takes one write from the job's budget (a token bucket); False when it is empty."""
        now = self._clock()
        tokens, at = self._buckets.get(job, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._rate)
        if tokens < 1.0:
            self._buckets[job] = (tokens, now)
            return False
        self._buckets[job] = (tokens - 1.0, now)
        self._buckets.move_to_end(job)
        while len(self._buckets) > _REMEMBERED:
            self._buckets.popitem(last=False)
        return True


def _over_budget() -> TriggerAnswer:
    return TriggerAnswer(
        429, {"error": "this job's trigger budget is spent; retry later"}, retry_after_s=2.0
    )


class TriggerSources:
    """Which addresses may post a trigger for a job: the hosts of its ranks' probe endpoints
    (`resolve`, e.g. the TrainingJob's running pods), remembered for `ttl_s` per job. One
    resolution per job at a time: the triggers that arrive during it share its answer (a
    16,384-rank job's first triggers would each list the job's pods otherwise)."""

    def __init__(
        self,
        resolve: Callable[[JobRef], Awaitable[Sequence[str]]],
        *,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolve = resolve
        self._ttl_s = ttl_s
        self._clock = clock
        self._hosts: OrderedDict[JobRef, tuple[float, frozenset[str]]] = OrderedDict()
        self._resolving: dict[JobRef, asyncio.Future[frozenset[str]]] = {}

    def cached(self, job: JobRef, remote: str | None) -> bool | None:
        """Whether `remote` is one of the job's rank hosts, from memory; None when the
        job's hosts are not remembered within `ttl_s` (then ask `allowed`)."""
        cached = self._hosts.get(job)
        if cached is None or self._clock() - cached[0] > self._ttl_s:
            return None
        return remote is not None and remote in cached[1]

    def remembered(self, job: JobRef) -> tuple[frozenset[str], float] | None:
        """The job's rank hosts in memory and for how many more seconds they are (`ttl_s`);
        None when they are not remembered within `ttl_s`."""
        cached = self._hosts.get(job)
        if cached is None:
            return None
        left = self._ttl_s - (self._clock() - cached[0])
        return (cached[1], left) if left >= 0 else None

    async def allowed(self, job: JobRef, remote: str | None) -> bool:
        """Whether `remote` (the sender's address) is one of the job's rank hosts."""
        known = self.cached(job, remote)
        if known is not None:
            return known
        hosts = await self._hosts_of(job, self._clock())
        return remote is not None and remote in hosts

    async def _hosts_of(self, job: JobRef, now: float) -> frozenset[str]:
        """The job's hosts, resolved once for all who ask meanwhile (a failure reaches each)."""
        running = self._resolving.get(job)
        if running is None:

            async def resolve() -> frozenset[str]:
                try:
                    hosts = frozenset(await self._resolve(job))
                finally:
                    self._resolving.pop(job, None)
                self._hosts[job] = (now, hosts)
                self._hosts.move_to_end(job)
                while len(self._hosts) > _REMEMBERED:
                    self._hosts.popitem(last=False)
                return hosts

            running = self._resolving[job] = asyncio.ensure_future(resolve())
            running.add_done_callback(lambda done: done.cancelled() or done.exception())
        # shielded: one asker cancelled (its client went away) cancels nobody else's
        return await asyncio.shield(running)
