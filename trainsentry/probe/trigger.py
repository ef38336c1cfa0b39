"""Tell the gateway at once that this rank is stalled in a collective (the fast hang path).

The Prometheus rules find a hang too, but through scrape → evaluation → `for:` → Alertmanager
→ group_wait, minutes after the stall. A probe that sees a stall (`stall.StallDetector`)
posts a trigger straight to the gateway instead; the gateway fetches every rank's dump and
stacks, names the rank that never arrived and pages (docs/probe.md has the time budget).

    POST <TRAINSENTRY_GATEWAY_URL>/api/v1/hang-triggers
    Authorization: Bearer <TRAINSENTRY_PROBE_TOKEN>
    {"namespace", "trainingjob", "rank", "local_rank", "port", "pod", "node", "pg",
     "pg_desc", "seq", "op", "state", "waited_s", "threshold_s", "since", "group_ranks"}

`since` is when the rank began waiting (unix seconds), `port` where its probe listens, and
`group_ranks` the group's member ranks in compact form (`compact_ranks`), sent with this
rank's first trigger of that group only: the gateway locates the stalled group's missing
ranks from these before it fetches any dump.

Invariants:
- Never blocks or raises into the poll loop: triggers go through a bounded queue to one
  daemon thread; a full queue drops the newest trigger (and counts it).
- Idempotent: one trigger per (group, sequence number) from this rank (the detector reports
  each once); retries of the same trigger carry the same body, so the gateway deduplicates
  by (namespace, trainingjob, pg, seq) whoever sends it.
- Rate-limited: before the first send a random delay of up to `jitter_s` (`spread_s` of the
  job's world size: 1 s up to 1,000 ranks, then 1 s per 1,000 ranks, so a job's waiting
  ranks post at most about `GATEWAY_POSTS_PER_S` a second together), then at most
  `max_attempts` tries with a doubling back-off; 4xx answers (bad token, job unknown) are
  not retried.
- Told once: when the gateway answers that the job's hang is known (`"hang": "known"`),
  this rank's further stall triggers are dropped (counted as `suppressed`) until one of its
  stalls ends; the end of a stall is always sent. At 16,384 ranks that keeps the gateway's
  intake to about one trigger per rank.
- The token goes only into the Authorization header; it is never logged.
- A probe bound to one address (TRAINSENTRY_PROBE_BIND, e.g. the pod's IP on a pod with
  several interfaces) sends its triggers from that address too: the gateway accepts a
  trigger only from an address of one of the job's ranks.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import queue
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("trainsentry.probe.trigger")

TRIGGER_PATH = "/api/v1/hang-triggers"


def source_address(bind: str) -> str | None:
    """Pure: the address triggers are sent from for a probe bound to `bind`: that address
    when it is one unicast IP address, else None (the system's choice)."""
    try:
        address = ipaddress.ip_address(bind.strip("[]"))
    except ValueError:
        return None
    return None if address.is_unspecified else str(address)


class _HTTPFrom(urllib.request.HTTPHandler):
    def __init__(self, address: str) -> None:
        super().__init__()
        self._address = address

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(http.client.HTTPConnection, req, source_address=(self._address, 0))


class _HTTPSFrom(urllib.request.HTTPSHandler):
    def __init__(self, address: str) -> None:
        super().__init__()
        self._address = address

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(
            http.client.HTTPSConnection,
            req,
            context=self._context,  # type: ignore[attr-defined]
            source_address=(self._address, 0),
        )


MAX_RANKS_TEXT = 4096

# What one gateway takes from one job's probes, posts a second: a trigger costs it about
# 330 us of CPU, mostly the new connection's (a bare aiohttp handler: 308 us), so one event
# loop takes about 3,000 a second, all its time; at a third of that it keeps time for the
# diagnosis and everyone else's requests (docs/benchmarks.md, bench_hang_scale.py).
GATEWAY_POSTS_PER_S = 1000.0
MAX_SPREAD_S = 60.0


def spread_s(world_size: int) -> float:
    """Pure: the longest random delay before a rank's first try (`TriggerClient.jitter_s`):
    1 s, or `world_size / GATEWAY_POSTS_PER_S` when longer (at most MAX_SPREAD_S), so the
    job's ranks, all stalling within one poll, post about GATEWAY_POSTS_PER_S a second
    together: 16,384 ranks over 16.4 s instead of 1 s. The first of them still posts
    within milliseconds (the earliest of thousands of draws)."""
    return min(MAX_SPREAD_S, max(1.0, world_size / GATEWAY_POSTS_PER_S))


def compact_ranks(ranks: Sequence[int]) -> str:
    """Pure: sorted ranks as arithmetic runs, "0-7,16,32-160:16" ("" when longer than
    MAX_RANKS_TEXT characters); the gateway reads it with `hang_evidence.parse_ranks`."""
    ordered = sorted(set(ranks))
    items: list[str] = []
    i = 0
    while i < len(ordered):
        j = i + 1
        step = ordered[j] - ordered[i] if j < len(ordered) else 1
        while j + 1 < len(ordered) and ordered[j + 1] - ordered[j] == step:
            j += 1
        if j < len(ordered) and (j - i >= 2 or step == 1):
            items.append(f"{ordered[i]}-{ordered[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            items.append(str(ordered[i]))
            i += 1
    text = ",".join(items)
    return text if len(text) <= MAX_RANKS_TEXT else ""


@dataclass
class TriggerStats:
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    #: stall triggers not sent because the gateway said the job's hang is known
    suppressed: int = 0


@dataclass
class TriggerClient:
    """Posts hang triggers to the gateway from a daemon thread (see module invariants)."""

    gateway_url: str
    token: str | None = field(repr=False)
    timeout_s: float = 5.0
    jitter_s: float = 1.0
    max_attempts: int = 4
    backoff_s: float = 1.0
    sleep: Callable[[float], bool] | None = None  # returns True when stopping
    stats: TriggerStats = field(default_factory=TriggerStats)
    #: Send from this address (`source_address`); None: the system's choice.
    source: str | None = None

    def __post_init__(self) -> None:
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=64)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        handlers = [_HTTPFrom(self.source), _HTTPSFrom(self.source)] if self.source else []
        self._opener = urllib.request.build_opener(*handlers)
        #: The gateway said this job's hang is known: stall triggers are not sent.
        self.known = False

    @property
    def url(self) -> str:
        return self.gateway_url.rstrip("/") + TRIGGER_PATH

    def submit(self, body: dict[str, Any]) -> None:
        """Queue one trigger; returns at once (drops it when 64 are already waiting, and a
        stall trigger once the gateway said the hang is known)."""
        if body.get("resolved"):
            self.known = False  # a stall of this rank ended: the next one is news again
        elif self.known:
            self.stats.suppressed += 1
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="trainsentry-probe-trigger", daemon=True
            )
            self._thread.start()
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.stats.dropped += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)

    def _wait(self, seconds: float) -> bool:
        if self.sleep is not None:
            return self.sleep(seconds)
        return self._stop.wait(seconds)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                body = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if self._wait(random.uniform(0, self.jitter_s)):
                return
            if self.known and not body.get("resolved"):
                self.stats.suppressed += 1
                continue
            self.send(body)

    def send(self, body: dict[str, Any]) -> bool:
        """POST one trigger with retries; True once the gateway accepted it (2xx)."""
        data = json.dumps(body, sort_keys=True).encode()
        delay = self.backoff_s
        for attempt in range(1, self.max_attempts + 1):
            request = urllib.request.Request(self.url, data=data, method="POST")
            request.add_header("Content-Type", "application/json")
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            try:
                with self._opener.open(request, timeout=self.timeout_s) as answer:
                    said = answer.read(4096)
                self.stats.sent += 1
                if not body.get("resolved") and _hang_known(said):
                    self.known = True
                log.info(
                    "event=hang_trigger_sent pg=%s seq=%s attempt=%d",
                    body.get("pg"),
                    body.get("seq"),
                    attempt,
                )
                return True
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500 and exc.code != 429:
                    self.stats.failed += 1
                    log.warning("event=hang_trigger_refused status=%d", exc.code)
                    return False
                error = f"HTTP {exc.code}"
            except (OSError, ValueError) as exc:
                error = type(exc).__name__
            if attempt == self.max_attempts or self._wait(delay):
                break
            delay *= 2
        self.stats.failed += 1
        log.warning("event=hang_trigger_failed pg=%s error=%s", body.get("pg"), error)
        return False


def _hang_known(answer: bytes) -> bool:
    """Pure: whether the gateway's answer says the job's hang is already known."""
    try:
        said = json.loads(answer)
    except ValueError:
        return False
    return isinstance(said, dict) and said.get("hang") == "known"
