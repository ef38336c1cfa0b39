"""A 16,384-rank job's triggers arrive within one poll interval: none of them waits on the
store write of the job's first trigger, and the job's ranks are resolved once for all of
them (issue 42: 25,000 posts in 5 s).

The store and the resolver are stand-ins held open by the test (an `asyncio.Event`): what
is measured is what the trigger stage does while they are slow.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from tests.support.hang_triggers import trigger_json
from trainsentry.alerts import JobRef
from trainsentry.gateway.stages.hang.trigger import (
    HangTrigger,
    JobHangs,
    TriggerSources,
    parse_trigger,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
JOB = JobRef("team-a", "llama")


def trigger(rank: int, seq: int = 4812) -> HangTrigger:
    group = rank // 8 * 8
    return parse_trigger(
        trigger_json(
            JOB.namespace,
            JOB.name,
            rank,
            seq,
            pg=str(1 + rank // 8),
            group_ranks=f"{group}-{group + 7}",
        )
    )


async def test_triggers_during_the_first_ones_store_write_are_answered_at_once() -> None:
    """While the job's first trigger is looked up and stored (held open here), 500 more
    of its triggers are each answered at once, "pending" (not "known": the hang is not
    stored yet, so the probe does not stop posting), and noted as evidence: the stored
    hang's evidence has all 501 ranks. Nothing else is written."""
    store_open = asyncio.Event()
    written: list[bytes] = []

    async def lookup(fingerprint: str) -> None:
        await store_open.wait()

    async def submit(body: bytes) -> int:
        written.append(body)
        return 1

    hangs = JobHangs(lookup, submit)
    first = asyncio.ensure_future(hangs.take(trigger(0), "10.0.0.1", NOW))
    await asyncio.sleep(0.01)
    later = [
        asyncio.ensure_future(hangs.take(trigger(r), f"10.0.{r // 8 // 256}.{r // 8 % 256}", NOW))
        for r in range(1, 501)
    ]
    done, _ = await asyncio.wait(later, timeout=0.5)
    assert len(done) == 500, f"{500 - len(done)} triggers waited on the store write"
    answers = [t.result() for t in later]
    assert {(a.status, a.body["hang"], a.body["first"]) for a in answers} == {
        (200, "pending", False)
    }
    assert not first.done()
    store_open.set()
    stored = await first
    assert (stored.status, stored.body["first"], len(written)) == (202, True, 1)
    evidence = hangs.evidence(JOB)
    assert evidence is not None and set(evidence.waiters) == set(range(501))
    known = await hangs.take(trigger(501), "10.0.1.0", NOW)
    assert (known.status, known.body["hang"], len(written)) == (200, "known", 1)


async def test_a_failed_first_write_leaves_the_next_trigger_to_store_the_hang() -> None:
    """The first trigger's write fails (the store is down): its poster gets the error and
    retries; a trigger after it is not answered "pending" for a hang nobody is storing."""
    fail = True
    written: list[bytes] = []

    async def lookup(fingerprint: str) -> None:
        return None

    async def submit(body: bytes) -> int:
        if fail:
            raise OSError("store down")
        written.append(body)
        return 1

    hangs = JobHangs(lookup, submit)
    try:
        await hangs.take(trigger(0), "10.0.0.1", NOW)
        raise AssertionError("the failed write did not reach the caller")
    except OSError:
        pass
    fail = False
    again = await hangs.take(trigger(1), "10.0.0.1", NOW)
    assert (again.status, again.body["first"], len(written)) == (202, True, 1)


async def test_concurrent_triggers_resolve_the_jobs_ranks_once() -> None:
    calls = 0
    resolved = asyncio.Event()

    async def resolve(job: JobRef) -> list[str]:
        nonlocal calls
        calls += 1
        await resolved.wait()  # a Kubernetes API list of the job's pods
        return ["10.0.0.1", "10.0.0.2"]

    sources = TriggerSources(resolve)
    asking = [
        asyncio.ensure_future(sources.allowed(JOB, f"10.0.0.{1 + i % 3}")) for i in range(300)
    ]
    await asyncio.sleep(0.05)
    resolved.set()
    allowed = await asyncio.gather(*asking)
    assert calls == 1
    assert allowed == [i % 3 != 2 for i in range(300)]
