"""Locate a hang's culprits from little data before any dump: the triggers, then `/status`.

A job of 16,384 ranks cannot have every rank's dump fetched and analysed within a page's
hold. What its probes already said does most of the work (`evidence.py`): the oldest
stalled collective, its member ranks and which of them wait in it. `locate` then asks only
that group's ranks that did not post (and, when their addresses cannot be told, probes that
did not post, up to `max_status`) for their `/status` (a few KB: per process group the last
collective enqueued and completed, and what is in flight): a member whose group never
enqueued the stalled collective is **missing**, the suspect. The dumps to fetch are then
those suspects first and the group's waiting members after them, at most `max_dumps`.

Invariants:
- Never every rank: at most `max_status` `/status` and `max_dumps` dumps per diagnosis,
  whatever the job's size; without evidence (a rule's hang alert, no triggers), at most
  `max_dumps` dumps, in an order that is not rank order.
- The order of the dumps is the suspects', then the group's, never the endpoints' order.
- A `/status` answer is attacker-controlled: read with a cap (`probe_http`), every field
  checked; an answer that does not parse says nothing (the rank is "unknown").
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from trainsentry.gateway.stages.hang.enrichment import (
    HangVerdict,
    RankEndpoint,
    ranks_phrase,
    saving_summary,
)
from trainsentry.gateway.stages.hang.evidence import (
    HangEvidence,
    StalledKey,
    host_port,
    rank_addresses,
)
from trainsentry.gateway.stages.hang.probe_client import probe_client
from trainsentry.gateway.stages.hang.probe_reading import TooLarge, read_capped
from trainsentry.gateway.stages.hang.stacks import checkpointing

MAX_STATUS_BYTES = 1024 * 1024
MISSING, WAITING, PAST, UNKNOWN = "missing", "waiting", "past", "unknown"


@dataclass(frozen=True)
class Located:
    """What `locate` found, and the dumps to fetch in that order."""

    key: StalledKey | None
    #: Ranks whose `/status` says they never enqueued the stalled collective.
    missing: tuple[int, ...] = ()
    #: rank -> its state in the stalled collective, for every `/status` read.
    states: Mapping[int, str] = field(default_factory=dict)
    status_asked: int = 0
    dumps: tuple[RankEndpoint, ...] = ()
    #: rank -> (pod, node) as each `/status` read said (else the endpoint's hints).
    identities: Mapping[int, tuple[str, str]] = field(default_factory=dict)
    #: rank -> the `phase` its `/status` said (`{"name": "checkpoint", ...}`), when it said one.
    phases: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)

    def waiting(self) -> tuple[int, ...]:
        """Pure: the ranks known to wait in the stalled collective (their trigger or their
        `/status` said so)."""
        if self.key is None:
            return ()
        seen = set(self.key.waiting) | {r for r, s in self.states.items() if s == WAITING}
        return tuple(sorted(seen))

    def verdict(self, job: str, total_ranks: int, why: str, now: float = 0.0) -> HangVerdict | None:
        """Pure: the verdict from `/status` alone, for when no dump could be read (`why`:
        what happened to the fetch): a `hang` naming the ranks whose group never enqueued
        the stalled collective, with their pod and node, its summary saying it is from
        `/status` only; None when `/status` found no rank missing. Its report has the
        analyzer's `hang` fields the console draws (`waited_s`: since the stall began, at
        `now`, unix seconds) and `"source": "status"`. When every missing rank's `/status`
        says it is saving a checkpoint (its `phase`), it is a `checkpoint` instead, as its
        stack would make it (`with_phases`): held to the checkpoint limit, not paged as a
        hang."""
        if self.key is None or not self.missing:
            return None
        key, waiting = self.key, self.waiting()
        where = (
            f"{(key.op or 'a collective').split(' ')[0]} #{key.seq} of pg {key.pg_desc or key.pg}"
        )
        source = f"(from the ranks' /status only, {self.status_asked} asked: {why})"
        summary = (
            f"{ranks_phrase(self.missing, self.identities)} never entered {where}; "
            f"{len(waiting)} rank{'s' if len(waiting) != 1 else ''} waiting {source}"
        )
        hang = {
            "communicator": key.pg,
            "description": key.pg_desc,
            "op": key.op,
            "seq": key.seq,
            "missing_ranks": list(self.missing),
            "arrived_ranks": list(waiting),
            "arrived_count": len(waiting),
            "ranks_without_dump": [],
            "waited_s": round(max(0.0, now - key.since), 3) if now > 0 else None,
        }
        report = {"verdict": "hang", "source": "status", "ranks": total_ranks, "hang": hang}
        verdict = HangVerdict(
            job=job,
            verdict="hang",
            summary=summary,
            culprit_ranks=self.missing,
            report={**report, "culprit_ranks": list(self.missing)},
            not_read=f"no dump read; located from the /status of {self.status_asked} ranks",
        )
        verdict = self.with_phases(verdict)
        if verdict.verdict == "hang":
            return verdict
        return dataclasses.replace(verdict, summary=f"{verdict.summary} {source}")

    def with_phases(self, verdict: HangVerdict) -> HangVerdict:
        """Pure: `verdict` as a `checkpoint` when it is a `hang` whose every culprit is
        saving a checkpoint by what it said last: its stack when it answered one, else the
        `phase` its `/status` gave a moment before (`/status` and `/stack` say it alike):
        held to the checkpoint limit like one its stack showed, never paged as a hang, and
        releasing no page held for a checkpoint elsewhere. Otherwise `verdict` as it is.
        For when the stacks do not come in time: a rank busy writing a checkpoint answers
        slowly."""
        if verdict.verdict != "hang" or not verdict.culprit_ranks:
            return verdict
        saving = {}
        for rank in verdict.culprit_ranks:
            stack = verdict.stacks.get(rank)
            saving[rank] = checkpointing(stack or {"phase": self.phases.get(rank)})
        if not all(saving.values()):
            return verdict
        summary = saving_summary(saving, self.identities)
        return dataclasses.replace(verdict, verdict="checkpoint", summary=summary)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _text(value: Any) -> str:
    return value[:253] if isinstance(value, str) else ""


def identity(status: Mapping[str, Any], endpoint: RankEndpoint) -> tuple[str, str]:
    """Pure: (pod, node) of the rank a `/status` answer is from: what it says (bounded),
    else the endpoint's hints (the resolver's pod list)."""
    return _text(status.get("pod")) or endpoint.pod, _text(status.get("node")) or endpoint.node


def member_state(status: Mapping[str, Any], pg: str, seq: int) -> str:
    """Pure: where a rank stands in collective `seq` of group `pg`, by its `/status`:
    `past` (completed it), `waiting` (enqueued it, not completed), `missing` (its group's
    last enqueued collective is an earlier one), `unknown` (the group is not in it)."""
    groups = status.get("process_groups")
    group = groups.get(pg) if isinstance(groups, Mapping) else None
    if not isinstance(group, Mapping):
        return UNKNOWN
    enqueued, completed = _int(group.get("last_enqueued")), _int(group.get("last_completed"))
    flight = group.get("in_flight")
    in_flight = _int(flight.get("seq")) if isinstance(flight, Mapping) else -1
    if completed >= seq:
        return PAST
    if enqueued >= seq or in_flight == seq:
        return WAITING
    if 0 <= enqueued < seq:
        return MISSING
    return UNKNOWN


def spread(endpoints: Sequence[RankEndpoint], salt: str) -> list[RankEndpoint]:
    """Pure: `endpoints` in a fixed order that is not theirs (by a hash of each address)."""
    return sorted(endpoints, key=lambda e: hashlib.sha256(f"{salt}/{e.address}".encode()).digest())


async def _status_one(
    client: httpx.AsyncClient, endpoint: RankEndpoint, limit: asyncio.Semaphore
) -> tuple[RankEndpoint, Mapping[str, Any]] | None:
    async with limit:
        try:
            async with client.stream("GET", endpoint.base_url + "/status") as response:
                if response.status_code != 200:
                    return None
                data = await read_capped(response, MAX_STATUS_BYTES)
        except (httpx.HTTPError, TooLarge):
            return None
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if not isinstance(body, dict) or _int(body.get("rank")) < 0:
        return None
    return endpoint, body


async def fetch_status(
    endpoints: Sequence[RankEndpoint],
    *,
    timeout_s: float,
    deadline_s: float,
    concurrency: int,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[tuple[RankEndpoint, Mapping[str, Any]]]:
    """(endpoint, its `/status`) of each endpoint that answered by the deadline
    (unauthenticated: it holds no secret and no dump)."""
    limit = asyncio.Semaphore(max(1, concurrency))
    async with probe_client(timeout_s, transport, max(1, concurrency)) as client:
        tasks = [asyncio.ensure_future(_status_one(client, e, limit)) for e in endpoints]
        if not tasks:
            return []
        done, pending = await asyncio.wait(tasks, timeout=deadline_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    return [s for t in done if not t.cancelled() and t.exception() is None and (s := t.result())]


def endpoint_pairs(endpoints: Sequence[RankEndpoint]) -> list[tuple[str, int]]:
    """Pure: (host, port) of each endpoint, in their order (what `rank_addresses` matches
    the triggers' senders against; computed once per diagnosis)."""
    return [host_port(e.base_url) for e in endpoints]


def _status_targets(
    key: StalledKey,
    evidence: HangEvidence,
    endpoints: Sequence[RankEndpoint],
    pairs: Sequence[tuple[str, int]],
    max_status: int,
) -> tuple[list[RankEndpoint], list[RankEndpoint], dict[int, int]]:
    """Pure: whom to ask for `/status` first (the members that did not post, with a guess
    for those without an address), whom next if they show no missing rank (probes that did
    not post, spread), and rank -> endpoint index."""
    members = key.members
    where = rank_addresses(pairs, evidence.waiters, members or tuple(evidence.waiters))
    quiet = [r for r in members if r not in key.waiting]
    targets = [endpoints[where[r]] for r in quiet if r in where]
    unmapped = [r for r in quiet if r not in where]
    if not members or unmapped:
        posted = {(w.host, w.port) for w in evidence.waiters.values()}
        known = set(where.values())
        unposted = {i for i in range(len(endpoints)) if i not in known and pairs[i] not in posted}
        # A guess each `/status` answer checks (it says its rank): a list in rank order
        # (as static lists usually are) has rank r's probe at index r; the rest spread.
        guesses = [r for r in unmapped if r in unposted]
        targets += [endpoints[r] for r in guesses]
        rest = [endpoints[i] for i in sorted(unposted - set(guesses))]
        later = spread(rest, key.pg)[: max(0, max_status - len(targets))]
        return targets[:max_status], later, where
    return targets[:max_status], [], where


def ready(
    evidence: HangEvidence | None,
    endpoints: Sequence[RankEndpoint],
    pairs: Sequence[tuple[str, int]] | None = None,
) -> bool:
    """Pure: whether the triggers already tell where to look: the oldest stall's members are
    known and each that did not post has an address (then waiting longer adds nothing).
    `pairs`: `endpoint_pairs(endpoints)`, when the caller has them."""
    key = evidence.oldest() if evidence is not None else None
    if evidence is None or key is None or not key.members:
        return False
    pairs = endpoint_pairs(endpoints) if pairs is None else pairs
    quiet = [r for r in key.members if r not in key.waiting]
    return len(rank_addresses(pairs, evidence.waiters, quiet)) == len(quiet)


def onward(
    key: StalledKey, missing: Sequence[int], answered: Mapping[int, Mapping[str, Any]]
) -> tuple[str, int, str] | None:
    """Pure: where a missing rank of `key` is itself waiting, (pg, seq, op), if any: then it
    is a victim of a stall there, not a cause (the cascade's next step), oldest first."""
    found: list[tuple[float, str, int, str]] = []
    for rank in missing:
        groups = answered.get(rank, {}).get("process_groups")
        for pg, group in (groups if isinstance(groups, Mapping) else {}).items():
            flight = group.get("in_flight") if isinstance(group, Mapping) else None
            if not isinstance(flight, Mapping) or (str(pg), _int(flight.get("seq"))) == (
                key.pg,
                key.seq,
            ):
                continue
            age = flight.get("age_seconds")
            age = float(age) if isinstance(age, int | float) else 0.0
            op = str(flight.get("op") or "")
            if not op.startswith(("send", "recv")):
                found.append((-age, str(pg), _int(flight.get("seq")), op))
    if not found:
        return None
    _, pg, seq, op = min(found)
    return pg, seq, op


async def locate(
    evidence_of: Callable[[], HangEvidence | None],
    endpoints: Sequence[RankEndpoint],
    *,
    max_status: int,
    max_dumps: int,
    timeout_s: float,
    deadline_s: float,
    concurrency: int,
    transport: httpx.AsyncBaseTransport | None = None,
    pairs: Sequence[tuple[str, int]] | None = None,
) -> Located:
    """The stalled group's suspects and the dumps to fetch (module docstring). A suspect
    found waiting in another collective is followed there (at most 3 steps): the rank the
    waits lead to is the one that never arrived. `deadline_s` bounds the whole of it; a
    collective followed that no trigger has named yet is waited for (its waiting ranks'
    triggers are on their way) for up to half of what is left, since without its members
    the only targets are probes that did not post. `pairs`: `endpoint_pairs(endpoints)`,
    when the caller has them."""
    end = asyncio.get_running_loop().time() + deadline_s
    evidence = evidence_of()
    key = evidence.oldest() if evidence is not None else None
    if evidence is None or key is None:
        return Located(None, dumps=tuple(spread(endpoints, "")[:max_dumps]))
    pairs = endpoint_pairs(endpoints) if pairs is None else pairs
    asked, visited = 0, {(key.pg, key.seq)}
    by_rank: dict[int, RankEndpoint] = {}
    states: dict[int, str] = {}
    identities: dict[int, tuple[str, str]] = {}
    phases: dict[int, Mapping[str, Any]] = {}
    missing: tuple[int, ...] = ()
    for _step in range(3):
        first, later, where = _status_targets(key, evidence, endpoints, pairs, max_status - asked)
        by_rank.update({r: endpoints[i] for r, i in where.items()})
        answered: dict[int, Mapping[str, Any]] = {}
        members = set(key.members)
        for targets in (first, later):  # the later ones only if the first show nobody missing
            if not targets:
                continue
            left = end - asyncio.get_running_loop().time()
            if left <= 0:
                break
            asked += len(targets)
            answers = await fetch_status(
                targets,
                timeout_s=min(timeout_s, left),
                deadline_s=left,
                concurrency=concurrency,
                transport=transport,
            )
            for endpoint, status in answers:  # the rank is the one each probe says it is
                rank = _int(status.get("rank"))
                answered[rank] = status
                by_rank.setdefault(rank, endpoint)
                identities[rank] = identity(status, endpoint)
                if isinstance(phase := status.get("phase"), Mapping):
                    phases[rank] = phase
            members = set(key.members) or set(answered) | set(key.waiting)
            states = {
                rank: member_state(status, key.pg, key.seq)
                for rank, status in answered.items()
                if rank in members
            }
            missing = tuple(sorted(r for r, s in states.items() if s == MISSING))
            if missing:
                break
        following = onward(key, missing, answered)
        if following is None or following[:2] in visited:
            break
        visited.add(following[:2])
        pg, seq, op = following
        evidence, found = await _named(evidence_of, evidence, (pg, seq), end)
        key = found or StalledKey(pg, seq, "", op, 0.0, (), {})
    dumps = _dump_order(key, missing, states, by_rank, max_dumps)
    if not missing and len(endpoints) <= max_dumps:  # a small job: every rank is in bound
        dumps += [e for e in spread(endpoints, key.pg) if e not in dumps]
    return Located(key, missing, states, asked, tuple(dumps), identities, phases)


async def _named(
    evidence_of: Callable[[], HangEvidence | None],
    evidence: HangEvidence,
    where: tuple[str, int],
    end: float,
) -> tuple[HangEvidence, StalledKey | None]:
    """The newest evidence and its key for collective `where` once a trigger names it,
    waiting for that up to half of the time left before `end`."""
    loop = asyncio.get_running_loop()
    until = loop.time() + max(0.0, end - loop.time()) / 2
    while True:
        evidence = evidence_of() or evidence
        found = next((k for k in evidence.keys if (k.pg, k.seq) == where), None)
        if (found is not None and found.members) or loop.time() >= until:
            return evidence, found
        await asyncio.sleep(0.05)


def _dump_order(
    key: StalledKey,
    missing: Sequence[int],
    states: Mapping[int, str],
    by_rank: Mapping[int, RankEndpoint],
    max_dumps: int,
) -> list[RankEndpoint]:
    """Pure: the suspects, then the members whose state is unknown (neither their trigger
    nor their `/status` said they wait: a quiet member whose `/status` did not answer), then
    the waiting ones (those that posted first), at most `max_dumps`, each endpoint once."""
    order: list[RankEndpoint] = []
    unknown = [r for r in key.members if r not in key.waiting and states.get(r, UNKNOWN) == UNKNOWN]
    waiting = list(key.waiting) + [r for r, s in states.items() if s == WAITING]
    for rank in [*missing, *unknown, *waiting]:
        endpoint = by_rank.get(rank)
        if endpoint is not None and endpoint not in order:
            order.append(endpoint)
        if len(order) >= max_dumps:
            break
    return order
