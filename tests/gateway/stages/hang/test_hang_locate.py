"""`hang_locate.locate` on its own: real loopback probes answer `/status` (one address per
rank, as a job's pods have), the triggers' evidence is built with `JobEvidence.note` and
may grow while `locate` runs (a trigger arriving late).

The job: 8 ranks, 2 per pod (pod p on 127.3.0.(p+1), rank r on port base + r % 2).
- TP group pg "1" = ranks 0-3 stalls in all_reduce #41: ranks 0, 1, 2 wait in it; rank 3
  never enqueued it because it waits in DP all_reduce #7 of pg "2" (ranks 3, 7);
- rank 7 never enqueued DP all_reduce #7: it is the culprit (no collective in flight);
- ranks 4, 5, 6 are elsewhere (their `/status` knows neither group).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest
from aiohttp import web

from tests.support.ports import free_port
from trainsentry.gateway.stages.hang.enrichment import RankEndpoint
from trainsentry.gateway.stages.hang.evidence import HangEvidence, JobEvidence, Waiter
from trainsentry.gateway.stages.hang.locate import locate, spread

WORLD, CULPRIT, FOLLOWED = 8, 7, 3
TP, DP = ("1", 41), ("2", 7)


def host(rank: int) -> str:
    return f"127.3.0.{1 + rank // 2}"


def group(enqueued: int, completed: int, flight: tuple[int, str] | None = None) -> dict[str, Any]:
    in_flight = None
    if flight is not None:
        in_flight = {"seq": flight[0], "op": flight[1], "state": "started", "age_seconds": 30.0}
    return {"last_enqueued": enqueued, "last_completed": completed, "in_flight": in_flight}


def status_of(rank: int) -> dict[str, Any]:
    """What rank `rank`'s probe says (module docstring)."""
    groups: dict[str, Any] = {}
    if rank < 4:
        groups["1"] = group(41, 40, (41, "all_reduce")) if rank != FOLLOWED else group(40, 40)
    if rank == FOLLOWED:
        groups["2"] = group(7, 6, (7, "all_reduce"))
    if rank == CULPRIT:
        groups["2"] = group(6, 6)
    return {"rank": rank, "process_groups": groups}


class StatusProbes:
    """The job's probes on real loopback sockets; `slow` ranks answer after 30 s."""

    def __init__(self) -> None:
        self.port = free_port()
        self.asked: list[int] = []
        self.slow: set[int] = set()
        self._by_address = {(host(r), self.port + r % 2): r for r in range(WORLD)}
        self._runner: web.AppRunner | None = None

    def endpoints(self) -> list[RankEndpoint]:
        return [RankEndpoint(f"{host(r)}:{self.port + r % 2}") for r in range(WORLD)]

    async def status(self, request: web.Request) -> web.Response:
        address = request.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
        rank = self._by_address[tuple(address)]
        self.asked.append(rank)
        if rank in self.slow:
            await asyncio.sleep(30)
        return web.json_response(status_of(rank))

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/status", self.status)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self._runner.setup()
        for address, port in self._by_address:
            await web.TCPSite(self._runner, address, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def probes() -> AsyncIterator[StatusProbes]:
    state = StatusProbes()
    await state.start()
    yield state
    await state.stop()


def note(evidence: JobEvidence, rank: int, where: tuple[str, int], members: str, port: int) -> None:
    evidence.note(
        pg=where[0],
        seq=where[1],
        pg_desc="tp" if where == TP else "dp",
        op="all_reduce",
        since=1000.0 + (0.3 if where == TP else 0.0),
        members=members,
        waiter=Waiter(rank, host(rank), port + rank % 2, rank % 2),
        world_size=WORLD,
    )


def tp_evidence(port: int) -> JobEvidence:
    """Ranks 0, 1, 2 posted their TP wait; rank 3's DP trigger has not arrived."""
    evidence = JobEvidence(first_at=1020.0)
    for rank in (0, 1, 2):
        note(evidence, rank, TP, "0-3", port)
    return evidence


def growing(evidence: JobEvidence, after_s: float, then: Callable[[], None]) -> Callable[[], Any]:
    """`evidence_of` for `locate`: the evidence, to which `then` adds after `after_s`."""
    start = time.monotonic()
    added = False

    def evidence_of() -> HangEvidence:
        nonlocal added
        if not added and time.monotonic() - start >= after_s:
            then()
            added = True
        return evidence.snapshot()

    return evidence_of


async def run(probes: StatusProbes, evidence_of: Callable[[], Any], **kw: Any) -> Any:
    settings: dict[str, Any] = {
        "max_status": 16,
        "max_dumps": 4,
        "timeout_s": 3.0,
        "deadline_s": 2.0,
        "concurrency": 8,
    }
    settings.update(kw)
    return await locate(evidence_of, probes.endpoints(), **settings)


def rank_of(endpoint: RankEndpoint, probes: StatusProbes) -> int:
    return next(r for r, e in enumerate(probes.endpoints()) if e == endpoint)


async def test_a_followed_collective_waits_for_its_trigger_then_asks_its_members_only(
    probes: StatusProbes,
) -> None:
    """Rank 3 is missing from the TP stall and waits in DP #7, which no trigger has named
    yet: locate waits for the DP trigger (it comes 0.3 s later) and asks that group's one
    quiet member, rank 7, not every probe that did not post."""
    evidence = tp_evidence(probes.port)
    evidence_of = growing(evidence, 0.3, lambda: note(evidence, FOLLOWED, DP, "3,7", probes.port))
    started = time.monotonic()
    located = await run(probes, evidence_of)
    elapsed = time.monotonic() - started
    assert (located.key.pg, located.key.seq) == DP and located.key.members == (3, 7)
    assert located.missing == (CULPRIT,)
    assert sorted(probes.asked) == [FOLLOWED, CULPRIT] and located.status_asked == 2
    assert [rank_of(e, probes) for e in located.dumps] == [CULPRIT, FOLLOWED]
    assert 0.3 <= elapsed < 1.0, elapsed  # it waited for the trigger, not for its whole share


async def test_a_followed_collective_never_named_falls_back_to_the_quiet_probes(
    probes: StatusProbes,
) -> None:
    """No trigger ever names DP #7: after half of what was left, locate asks the probes
    that did not post (spread, within `max_status`) and still finds rank 7."""
    evidence = tp_evidence(probes.port)
    started = time.monotonic()
    located = await run(probes, evidence.snapshot, deadline_s=1.6)
    elapsed = time.monotonic() - started
    assert (located.key.pg, located.key.seq) == DP and located.key.members == ()
    assert located.missing == (CULPRIT,)
    assert sorted(probes.asked) == [3, 3, 4, 5, 6, 7] and located.status_asked == 6
    assert 0.7 <= elapsed < 1.6, elapsed  # waited about half of the 1.6 s, then asked


async def test_max_status_bounds_every_status_asked(probes: StatusProbes) -> None:
    evidence = tp_evidence(probes.port)
    located = await run(probes, evidence.snapshot, max_status=3, deadline_s=1.0)
    assert located.status_asked <= 3 and len(probes.asked) <= 3, probes.asked
    # without members of the followed group, no endpoint beyond the bound was asked
    assert probes.asked[0] == FOLLOWED


async def test_the_whole_locate_keeps_one_deadline(probes: StatusProbes) -> None:
    """The followed group is never named and its quiet probes never answer: the wait for
    the trigger and the `/status` after it share one deadline (not one each, not the
    per-request timeout)."""
    probes.slow = {4, 5, 6, 7}
    evidence = tp_evidence(probes.port)
    started = time.monotonic()
    located = await run(probes, evidence.snapshot, deadline_s=1.0, timeout_s=5.0)
    elapsed = time.monotonic() - started
    assert elapsed < 1.3, elapsed
    assert located.missing == () and (located.key.pg, located.key.seq) == DP


async def test_a_quiet_member_that_does_not_answer_is_dumped_before_those_that_posted(
    probes: StatusProbes,
) -> None:
    """Rank 3's `/status` never comes: locate ends at its deadline, and of the stalled
    group's dumps rank 3's (the one member that did not post) is fetched first, before the
    members whose triggers said they wait (in a group of 128 with 32 dumps, it would
    otherwise be cut by its place in the member list)."""
    probes.slow = {FOLLOWED}
    evidence = tp_evidence(probes.port)
    started = time.monotonic()
    located = await run(probes, evidence.snapshot, deadline_s=0.5, timeout_s=5.0, max_dumps=2)
    assert time.monotonic() - started < 0.8
    assert (located.key.pg, located.key.seq) == TP and located.missing == ()
    assert [rank_of(e, probes) for e in located.dumps] == [FOLLOWED, 0]


@pytest.mark.parametrize(
    "evidence", [None, HangEvidence((), {}, 0.0)], ids=["no triggers", "no stalled key"]
)
async def test_without_evidence_no_status_and_a_bounded_spread_of_dumps(
    probes: StatusProbes, evidence: HangEvidence | None
) -> None:
    endpoints = probes.endpoints()
    located = await run(probes, lambda: evidence, max_dumps=3)
    assert located.key is None and located.status_asked == 0 and not probes.asked
    assert list(located.dumps) == spread(endpoints, "")[:3]
    # (That the spread is not the rank order is checked on fixed addresses below: these
    # ports are random, and one draw in a few thousand put the first three in rank order.)


def test_spread_is_a_fixed_order_of_the_same_endpoints() -> None:
    endpoints = [RankEndpoint(f"10.0.0.{i}:9401") for i in range(20)]
    once: Mapping[str, list[RankEndpoint]] = {"a": spread(endpoints, "a")}
    assert spread(endpoints, "a") == once["a"] and sorted(once["a"], key=endpoints.index) == (
        endpoints
    )
    assert spread(endpoints, "b") != once["a"]
    assert once["a"][:3] != endpoints[:3] and spread(endpoints, "")[:3] != endpoints[:3]


async def test_a_large_groups_quiet_members_are_asked_at_once() -> None:
    """A data-parallel group of 128 ranks (a 16,384-rank job's), 20 of which posted their
    wait so far (the others' triggers are spread over seconds): its 108 quiet members'
    `/status` are asked in one round at the shipped `status_concurrency`, and rank 127,
    which never enqueued the all_reduce, is found within a 1.4 s search though each probe
    takes 0.5 s to answer (a loaded node). Before, they were asked 32 at a time
    (`concurrency`, meant for MB-sized dumps): four rounds, 2 s, and at 16,384 ranks the
    search's share of the deadline ended in the second."""
    from trainsentry.config.diagnosis import DiagnosisSettings

    size, culprit, seq, port = 128, 127, 1000, free_port()
    hosts = [f"127.6.{r // 200}.{1 + r % 200}" for r in range(size)]
    by_address = {(h, port): r for r, h in enumerate(hosts)}

    async def status(request: web.Request) -> web.Response:
        rank = by_address[tuple(request.transport.get_extra_info("sockname")[:2])]  # type: ignore[union-attr]
        await asyncio.sleep(0.5)
        entered = seq - 1 if rank == culprit else seq
        flight = None if rank == culprit else (seq, "all_reduce")
        return web.json_response(
            {"rank": rank, "process_groups": {"9": group(entered, seq - 1, flight)}}
        )

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    for address in by_address:
        await web.TCPSite(runner, *address).start()
    evidence = JobEvidence(first_at=1020.0)
    for rank in range(20):
        evidence.note(
            pg="9", seq=seq, pg_desc="dp", op="all_reduce", since=1000.0,
            members=f"0-{size - 1}", waiter=Waiter(rank, hosts[rank], port, 0), world_size=size,
        )  # fmt: skip
    try:
        located = await locate(
            evidence.snapshot,
            [RankEndpoint(f"{h}:{port}") for h in hosts],
            max_status=512,
            max_dumps=32,
            timeout_s=2.0,
            deadline_s=1.4,
            concurrency=DiagnosisSettings().status_concurrency,
        )
    finally:
        await runner.cleanup()
    assert located.status_asked == size - 20
    assert located.missing == (culprit,), sorted(located.states.items())[-10:]
