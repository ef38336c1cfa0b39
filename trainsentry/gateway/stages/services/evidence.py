"""Hardware evidence (I/O): asks the Prometheus that evaluates the shipped rules whether a
hardware alert occurrence is one of its own firings (the matching is pure:
gateway/policy/evidence.py; docs/infrastructure.md, "Hardware evidence").

Invariants:
- an occurrence counts only once a query answered that it is confirmed; a failed query (no
  answer within `remediation.evidence.timeout_seconds`, an HTTP error, an answer over
  MAX_ANSWER_BYTES or not a range vector) confirms nothing and is asked again at the next
  check, so an unreachable Prometheus makes the cordon stricter, never looser;
- a verdict is kept in memory (at most MAX_VERDICTS, oldest dropped first), so an
  occurrence is asked about once: a confirmed one keeps its episode start (claimed, so no
  second occurrence takes it), an unconfirmed one is final only once its start is more than
  TOLERANCE_S + SETTLE_S old (Prometheus has written every sample that could confirm it);
- at most MAX_QUERIES_PER_CHECK queries per check, the occurrences of the sickest nodes
  first; the rest wait for the next check;
- no Prometheus configured: nothing is confirmed (said once at start by the stage).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

import httpx

from trainsentry.alerts import Alert
from trainsentry.gateway.policy.evidence import (
    TOLERANCE_S,
    EvidenceError,
    Firing,
    Key,
    Query,
    episode_starts,
    key_of,
    match,
    queries,
    read_matrix,
)

log = logging.getLogger("trainsentry.cordon")

MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_QUERIES_PER_CHECK = 50
MAX_VERDICTS = 200_000
SETTLE_S = 60.0


class Evidence:
    def __init__(
        self,
        prometheus_url: str,
        *,
        timeout_s: float,
        clock: Callable[[], datetime],
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = prometheus_url.rstrip("/")
        self._clock = clock
        self._client = (
            httpx.AsyncClient(
                timeout=httpx.Timeout(timeout_s), transport=transport, follow_redirects=False
            )
            if self.url
            else None
        )
        self._verdicts: dict[Key, Firing | None] = {}
        self._claimed: dict[Firing, Key] = {}

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def confirmed(self, alerts: Sequence[Alert]) -> set[Key]:
        """The occurrences among `alerts` (most wanted first) that Prometheus fired."""
        if self._client is None:
            return set()
        unknown = [a for a in alerts if key_of(a) not in self._verdicts]
        wanted = {key_of(a): rank for rank, a in enumerate(unknown)}
        asked = sorted(queries(unknown), key=lambda q: min(wanted[key_of(a)] for a in q.alerts))
        for query in asked[:MAX_QUERIES_PER_CHECK]:
            try:
                series = read_matrix(await self._ask(query))
            except (httpx.HTTPError, EvidenceError, ValueError) as exc:
                log.warning(
                    "event=evidence_unavailable url=%s error=%s: hardware alerts not confirmed "
                    "this check", self.url, str(exc)[:200] or type(exc).__name__,
                )  # fmt: skip
                break
            self._record(query, match(query.alerts, episode_starts(series), self._claimed))
        return {key for a in alerts if self._verdicts.get(key := key_of(a)) is not None}

    async def _ask(self, query: Query) -> object:
        assert self._client is not None
        form = {"query": query.expr, "time": f"{query.at:.3f}"}
        async with self._client.stream("POST", f"{self.url}/api/v1/query", data=form) as answer:
            if answer.status_code not in (200, 400, 422):  # Prometheus's error answers are JSON
                raise EvidenceError(f"Prometheus answered HTTP {answer.status_code}")
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    raise EvidenceError(f"Prometheus's answer is over {MAX_ANSWER_BYTES} bytes")
        return json.loads(body)

    def _record(self, query: Query, found: dict[Key, Firing]) -> None:
        settled = self._clock() - timedelta(seconds=TOLERANCE_S + SETTLE_S)
        for alert in query.alerts:
            key = key_of(alert)
            start = found.get(key)
            if start is None and alert.starts_at > settled:
                continue  # too fresh to call: asked again at the next check
            while len(self._verdicts) >= MAX_VERDICTS:
                old_key = next(iter(self._verdicts))
                old = self._verdicts.pop(old_key)
                if old is not None and self._claimed.get(old) == old_key:
                    del self._claimed[old]
            self._verdicts[key] = start
            if start is not None:
                self._claimed[start] = key
