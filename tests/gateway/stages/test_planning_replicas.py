"""Two real gateway processes (`trainsentry gateway`) on one PostgreSQL plan one storm
together (issue 46: planning partitioned by job, store/inbox.py), with a real local receiver
counting deliveries per idempotency key:

- a storm of 6 jobs (one Alertmanager group each) posted to both: every change planned once
  (the replicas' planned counters add up to the changes stored), both replicas planned
  batches, one incident per job with one card per channel, nothing sent twice;
- one replica killed with SIGKILL while both plan the storm: the survivor plans what the
  dead one held (its transaction rolled back, its partitions' locks gone), every answered
  alert is planned once and in one incident, no card is written twice.

That two concurrent claims take disjoint jobs (and did not before) is shown on the store
itself: tests/store/test_inbox_partitions.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from sqlalchemy import func, select

from tests.support.eventually import eventually
from tests.support.gateway_process import start_gateway
from tests.support.realservers import RunningServer
from tests.support.receiver import ThreadedReceiver
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.store.engine import create_engine
from trainsentry.store.schema import (
    alert_events,
    alerts,
    incident_alerts,
    incidents,
    intake_journal,
    notifications,
    policy_inbox,
)

pytestmark = pytest.mark.e2e
TOKEN = "replica-token"
JOBS = 6
PER_POST = 50


def storm_bodies(per_job: int) -> list[bytes]:
    """`JOBS` jobs × `per_job` P2 alerts, one Alertmanager group per job (the shipped route's
    groupKey), posts of 50 alerts, the jobs' posts interleaved."""
    by_job = [
        [
            make_alert(job * 100_000 + n, labels={"trainingjob": f"job-{job}", "priority": "P2"})
            for n in range(per_job)
        ]
        for job in range(JOBS)
    ]
    posts = [
        [encode(make_body(alerts[i : i + PER_POST])) for i in range(0, per_job, PER_POST)]
        for alerts in by_job
    ]
    return [post for round_ in zip(*posts, strict=True) for post in round_]


def config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"webhooks": {"feishu": {"url": url}}}))
    return path


def counter(server: RunningServer, name: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.split()[1]) for line in text.splitlines() if line.startswith(name + " "))


async def post_spread(
    urls: list[str], bodies: list[bytes], victim: RunningServer | None = None, db_url: str = ""
) -> tuple[set[int], float, int]:
    """Posts the bodies round-robin to `urls`, 4 at a time per gateway; the indexes of the
    bodies answered 200, what the `victim` had planned when last seen, and the changes and
    alerts waiting in `db_url` right after the kill. `victim`: killed with SIGKILL once it
    has committed two planning batches (its posts after that fail, unanswered)."""
    answered: set[int] = set()
    seen = [0.0, 0.0]  # the victim's planned changes before the kill; what waited after it
    queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in urls]
    for index in range(len(bodies)):
        queues[index % len(urls)].put_nowait(index)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def worker(session: aiohttp.ClientSession, url: str, queue: asyncio.Queue[int]) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            try:
                async with session.post(url + WEBHOOK_PATH, data=bodies[index]) as response:
                    await response.read()
                    if response.status == 200:
                        answered.add(index)
            except aiohttp.ClientError:
                continue  # the killed replica: never answered

    async def killer(victim: RunningServer) -> None:
        async def planning() -> bool:
            return await asyncio.to_thread(counter, victim, "trainsentry_policy_batches_total") >= 2

        await eventually(planning, 60, 0.01, what="the victim planning")
        seen[0] = await asyncio.to_thread(counter, victim, "trainsentry_policy_planned_total")
        os.kill(victim.process.pid, signal.SIGKILL)
        seen[1] = (await store_counts(db_url))["waiting"]

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        workers = [
            worker(session, url, queue)
            for url, queue in zip(urls, queues, strict=True)
            for _ in range(4)
        ]
        await asyncio.gather(*workers, *([killer(victim)] if victim is not None else []))
    return answered, seen[0], int(seen[1])


async def store_counts(db_url: str) -> dict[str, int]:
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:

            async def count(query: object) -> int:
                return int((await conn.execute(query)).scalar_one())  # type: ignore[call-overload]

            return {
                "waiting": await count(select(func.count()).select_from(policy_inbox))
                + await count(select(func.count()).select_from(intake_journal)),
                "alerts": await count(select(func.count()).select_from(alerts)),
                "planned": await count(
                    select(func.count()).select_from(alerts).where(alerts.c.priority.is_not(None))
                ),
                "events": await count(select(func.count()).select_from(alert_events)),
                "in_incidents": await count(select(func.count()).select_from(incident_alerts)),
            }
    finally:
        await engine.dispose()


async def cards(db_url: str) -> tuple[int, dict[str, list[str]]]:
    """(incidents stored, incident -> the channels of its notifications)."""
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            opened = (await conn.execute(select(func.count()).select_from(incidents))).scalar_one()
            rows = await conn.execute(select(notifications.c.group_key, notifications.c.channel))
            found: dict[str, list[str]] = {}
            for group_key, channel in rows:
                found.setdefault(group_key, []).append(channel)
        return int(opened), {key: sorted(channels) for key, channels in found.items()}
    finally:
        await engine.dispose()


async def all_planned(db_url: str, alerts_expected: int) -> dict[str, int] | None:
    counts = await store_counts(db_url)
    done = counts["waiting"] == 0 and counts["planned"] == counts["alerts"] >= alerts_expected
    return counts if done else None


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
async def test_two_replicas_plan_one_storm_each_change_once(db_url: str, tmp_path: Path) -> None:
    bodies = storm_bodies(per_job=200)
    with ThreadedReceiver() as receiver:
        cfg = config(tmp_path, receiver.url)
        with (
            start_gateway(tmp_path / "a", db_url, token=TOKEN, config=cfg) as a,
            start_gateway(tmp_path / "b", db_url, token=TOKEN, config=cfg) as b,
        ):
            answered, _, _ = await post_spread([a.url, b.url], bodies)
            assert answered == set(range(len(bodies)))
            counts = await eventually(
                lambda: all_planned(db_url, JOBS * 200), 120, 0.2, what="the storm planned"
            )
            planned = [counter(g, "trainsentry_policy_planned_total") for g in (a, b)]
            batches = [counter(g, "trainsentry_policy_batches_total") for g in (a, b)]
            await asyncio.sleep(1)  # room for a late, duplicate send
    assert counts["alerts"] == counts["events"] == counts["in_incidents"] == JOBS * 200
    assert sum(planned) == counts["events"], planned  # each change planned once
    assert min(batches) > 0, batches  # both replicas planned
    # One incident per job (its Alertmanager group), one card each on each channel: no
    # incident opened twice by two replicas, no card sent twice.
    opened, sent = await cards(db_url)
    assert opened == JOBS
    assert sorted(sent.values()) == [["console", "feishu"]] * JOBS, sent
    assert receiver.unique == JOBS and receiver.duplicates == 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
async def test_a_replica_killed_mid_storm_loses_and_repeats_no_change(
    db_url: str, tmp_path: Path
) -> None:
    bodies = storm_bodies(per_job=500)
    with ThreadedReceiver() as receiver:
        cfg = config(tmp_path, receiver.url)
        with (
            start_gateway(tmp_path / "a", db_url, token=TOKEN, config=cfg) as a,
            start_gateway(tmp_path / "b", db_url, token=TOKEN, config=cfg) as b,
        ):
            answered, victim_planned, waiting = await post_spread(
                [a.url, b.url], bodies, victim=a, db_url=db_url
            )
            a.process.wait(timeout=10)
            assert a.process.returncode == -signal.SIGKILL
            assert waiting > 0, "the kill should land mid-storm"
            counts = await eventually(
                lambda: all_planned(db_url, len(answered) * PER_POST),
                180,
                0.2,
                what="the storm planned by the survivor",
            )
            survivor = counter(b, "trainsentry_policy_planned_total")
            await asyncio.sleep(1)  # room for a late, duplicate send
    # Every answered alert is stored once, planned, and in one incident; each change
    # once: one firing event per alert, and the survivor planned no more than what the
    # dead replica had not committed (its batch in flight rolled back, planned again here;
    # it may have committed a batch between its last reading and the kill: `<=`).
    assert counts["alerts"] == counts["events"] == counts["in_incidents"] == counts["planned"]
    assert counts["alerts"] >= len(answered) * PER_POST
    assert victim_planned > 0 and survivor > 0
    assert victim_planned + survivor <= counts["events"], (victim_planned, survivor, counts)
    # One notification row per incident and channel: planning wrote no card twice. (What the
    # dead replica was sending is the outbox's bound, tested in test_outbox_replicas.py: its
    # claimed rows come back after their lease, and may be sent again.)
    opened, sent = await cards(db_url)
    assert opened == JOBS
    assert sorted(sent.values()) == [["console", "feishu"]] * JOBS, sent
