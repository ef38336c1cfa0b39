"""A probe's hang trigger becomes a stored, diagnosed hang alert (the fast hang path).

`POST /api/v1/hang-triggers` (bearer: the probes' token) takes what a stalled rank's probe
posts (`trainsentry/probe/trigger.py`) and turns it into one Alertmanager-style alert,
`TrainingCollectiveStalled` of (namespace, trainingjob, pg, seq), which then goes through
the same intake as Alertmanager's webhooks: stored before the answer, classified, held for
the hang diagnosis (which fetches every rank's dump and the culprits' stacks), and sent
with the rank named.

Invariants:
- A stall that ends (a rank posts `resolved: true`) resolves that alert; an end of a stall
  never stored is ignored (no alert is made from it).
- One alert per (namespace, trainingjob, pg, seq), whoever posts it and however often:
  the labels carry exactly those four (plus constants), and every trigger of the key gets
  the `startsAt` of the first one (remembered in memory, else read back from the store),
  so the store's (fingerprint, starts_at) key makes the second and later ones no-ops; a
  restart between two triggers of one hang therefore does not page twice.
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
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainsentry.alerts import PROBE_HANG_ALERT, JobRef
from trainsentry.gateway.stages.intake import label_fingerprint
from trainsentry.notifiers.feishu.sign import secrets_equal
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
    """Pure: the alert's labels: the key (namespace, trainingjob, pg, seq) and constants."""
    return {
        "alertname": ALERTNAME,
        "namespace": trigger.namespace,
        "trainingjob": trigger.trainingjob,
        "pg": trigger.pg,
        "seq": str(trigger.seq),
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


class TriggerKeys:
    """The `startsAt` of each trigger key: the first trigger's, for every later one.

    `starts_at(trigger, now)` serialises triggers of one key (a lock per key), answers from
    memory, else from `lookup` (the store: the earliest occurrence of the alert's
    fingerprint), else `now - waited_s` for a key never seen.
    """

    def __init__(self, lookup: Callable[[str], Awaitable[datetime | None]]) -> None:
        self._lookup = lookup
        self._known: OrderedDict[str, datetime] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, trigger: HangTrigger) -> asyncio.Lock:
        key = label_fingerprint(trigger_labels(trigger))
        if len(self._locks) > _REMEMBERED:
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
        return self._locks.setdefault(key, asyncio.Lock())

    async def starts_at(self, trigger: HangTrigger, now: datetime) -> tuple[datetime, bool]:
        """(startsAt, first): call with `lock(trigger)` held. `first` means the key was never
        seen (memory or store)."""
        key = label_fingerprint(trigger_labels(trigger))
        known = self._known.get(key)
        if known is None:
            known = await self._lookup(key)
        first = known is None
        if known is None:
            known = (now - timedelta(seconds=trigger.waited_s)).replace(microsecond=0)
            if trigger.resolved:  # the end of a stall never stored: remember nothing
                return known, True
        self._known[key] = known
        self._known.move_to_end(key)
        while len(self._known) > _REMEMBERED:
            self._known.popitem(last=False)
        return known, first


class TriggerSources:
    """Which addresses may post a trigger for a job: the hosts of its ranks' probe endpoints
    (`resolve`, e.g. the TrainingJob's running pods), remembered for `ttl_s` per job."""

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

    async def allowed(self, job: JobRef, remote: str | None) -> bool:
        """Whether `remote` (the sender's address) is one of the job's rank hosts."""
        now = self._clock()
        cached = self._hosts.get(job)
        if cached is None or now - cached[0] > self._ttl_s:
            cached = (now, frozenset(await self._resolve(job)))
            self._hosts[job] = cached
            self._hosts.move_to_end(job)
            while len(self._hosts) > _REMEMBERED:
                self._hosts.popitem(last=False)
        return remote is not None and remote in cached[1]
