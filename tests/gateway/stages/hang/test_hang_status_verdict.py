"""The page names the missing rank from `/status` alone when its dumps cannot be read in time.

An in-process gateway (SQLite, a webhook channel to a local receiver) and a 4-rank job on
real loopback probes, 2 ranks per pod (pod p on 127.4.0.(p+1), rank r on port base + r % 2):
ranks 0, 1 and 3 wait in all_reduce #10 of pg "1" and post their triggers; rank 2's
`/status` says its group's last enqueued collective is #9: it never arrived. Then either
no `/dump` answers within the diagnosis' deadline, or the dumps come late in the fetch's
share and the culprit's `/stack` never comes (the analysis and the stacks overrun the
diagnosis' deadline). Either way the page names rank
2, its pod and node, and says the verdict is from `/status` only (before: "no rank
answered with a Flight Recorder dump", or no verdict at all and the page went out late at
the end of the hold).

About 3 s per case.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import SecretStr

from tests.support.gateway_process import close_in_process
from tests.support.ports import free_port
from tests.support.receiver import Receiver
from trainsentry.config import GatewaySettings
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.diagnostics.synthetic import make_dump
from trainsentry.gateway.assemble import Diagnosis, create_app
from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints, past_checkpoint_limit
from trainsentry.gateway.stages.hang.enrichment import HangVerdict
from trainsentry.gateway.stages.hang.evidence import StalledKey, Waiter
from trainsentry.gateway.stages.hang.locate import MISSING, PAST, WAITING, Located
from trainsentry.notifiers.webhook import WebhookNotifier

PROBE_TOKEN = "probe-token"
WORLD, CULPRIT, SEQ = 4, 2, 10
WAITER = Waiter(1, "10.0.0.1", 9401)


def host(rank: int) -> str:
    return f"127.4.0.{1 + rank // 2}"


# What the probe's `/status` says of a rank whose main thread is inside torch.save
# (probe/stacks.py `current_phase`; /stack says the same).
SAVING = {"name": "checkpoint", "since": None, "source": "stack"}


def status_of(rank: int, saving: bool = False) -> dict[str, Any]:
    enqueued = SEQ - 1 if rank == CULPRIT else SEQ
    flight = None if rank == CULPRIT else {"op": "all_reduce", "seq": SEQ, "age_seconds": 25.0}
    group = {"last_enqueued": enqueued, "last_completed": SEQ - 1, "in_flight": flight}
    return {
        "rank": rank,
        "pod": f"llama-w-{rank // 2}",
        "node": f"gpu-{rank // 2:02d}",
        "process_groups": {"1": {"pg_desc": "tp", **group}},
        "phase": SAVING if saving and rank == CULPRIT else None,
    }


class Probes:
    """The job's probes; each path of `delays` answers after that many seconds."""

    def __init__(
        self, delays: dict[str, float], saving: bool = False, prompt: int | None = None
    ) -> None:
        self.port = free_port()
        self.delays = delays
        self.prompt = prompt  # the one rank whose answers come at once, whatever `delays` say
        self.saving = saving  # the culprit is inside torch.save (its /status says so)
        self.asked: list[tuple[str, int]] = []
        self._by_address = {(host(r), self.port + r % 2): r for r in range(WORLD)}
        self._runner: web.AppRunner | None = None

    def endpoints(self) -> list[str]:
        return [f"{host(r)}:{self.port + r % 2}" for r in range(WORLD)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        address = request.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
        rank = self._by_address[tuple(address)]
        what = request.path.strip("/")
        self.asked.append((what, rank))
        if rank != self.prompt:
            await asyncio.sleep(self.delays.get(what, 0.0))
        if what == "status":
            return web.json_response(status_of(rank, self.saving))
        headers = {"X-Trainsentry-Rank": str(rank), "X-Trainsentry-Pod": f"llama-w-{rank // 2}"}
        if what == "stack":
            return web.json_response({"rank": rank, "threads": []}, headers=headers)
        dump = make_dump(rank, WORLD, 30, scenario="hang", culprit=CULPRIT)
        # taken 25 s after the job's last collective began: the peers waited 25 s
        newest = max(e["time_created_ns"] for e in dump["entries"])
        headers["X-Trainsentry-Captured-At-Ns"] = str(newest + 25 * 10**9)
        return web.json_response(dump, headers=headers)

    async def start(self) -> None:
        app = web.Application()
        for path in ("/status", "/dump", "/stack"):
            app.router.add_get(path, self.handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self._runner.setup()
        for address, port in self._by_address:
            await web.TCPSite(self._runner, address, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def trigger(rank: int, port: int) -> bytes:
    return json.dumps(
        {
            "namespace": "team-a",
            "trainingjob": "llama",
            "rank": rank,
            "local_rank": rank % 2,
            "port": port + rank % 2,
            "pod": f"llama-w-{rank // 2}",
            "node": f"gpu-{rank // 2:02d}",
            "world_size": WORLD,
            "pg": "1",
            "pg_desc": "tp",
            "seq": SEQ,
            "op": "all_reduce",
            "state": "started",
            "waited_s": 21.0,
            "threshold_s": 20.0,
            "since": time.time() - 21.0,
            "group_ranks": "0-3",
        }
    ).encode()


async def wait_for_a_page(receiver: Receiver, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if receiver.bodies:
            return
        await asyncio.sleep(0.05)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    await receiver.start()
    yield receiver
    await receiver.stop()


FAST = DiagnosisSettings(hold_seconds=4, deadline_seconds=2, request_timeout_seconds=1)


async def run_job(
    tmp_path: Path,
    receiver: Receiver,
    probes: Probes,
    wait_s: float,
    settings_of_diagnosis: DiagnosisSettings = FAST,
    posting: tuple[int, ...] = (0, 1, 3),
) -> float:
    """The gateway (in process; by default hold 4 s, deadline 2 s) takes the triggers of
    the ranks `posting`; seconds from the last trigger to the first page (waiting `wait_s`
    at most)."""
    await probes.start()
    settings = GatewaySettings(
        listen="127.0.0.1:0", db=f"sqlite:///{tmp_path / 'gw.db'}", webhook_token=SecretStr("w")
    )
    diagnosis = Diagnosis(
        settings_of_diagnosis,
        StaticEndpoints({"team-a/llama": probes.endpoints()}),
        PROBE_TOKEN,
    )
    notifiers = {"feishu": WebhookNotifier(receiver.url, name="feishu")}
    server = TestServer(
        create_app(settings, notifiers=notifiers, diagnosis=diagnosis), host="127.0.0.1"
    )
    await server.start_server()
    try:
        for rank in posting:
            connector = aiohttp.TCPConnector(local_addr=(host(rank), 0))
            headers = {"Authorization": f"Bearer {PROBE_TOKEN}"}
            async with (
                aiohttp.ClientSession(connector=connector, headers=headers) as http,
                http.post(
                    server.make_url("/api/v1/hang-triggers"), data=trigger(rank, probes.port)
                ) as answer,
            ):
                assert answer.status in (200, 202), await answer.text()
        posted = time.monotonic()
        await wait_for_a_page(receiver, wait_s)
        return time.monotonic() - posted
    finally:
        await close_in_process(server)
        await probes.stop()


@pytest.mark.parametrize(
    "delays",
    [{"dump": 30.0}, {"dump": 0.9, "stack": 30.0}],
    ids=["no dump answers", "the stacks overrun the deadline"],
)
async def test_the_page_names_the_rank_status_found_when_no_dump_is_read_in_time(
    tmp_path: Path, receiver: Receiver, delays: dict[str, float]
) -> None:
    probes = Probes(delays)
    paged_s = await run_job(tmp_path, receiver, probes, 8.0)
    assert receiver.bodies, "no page"
    payload = receiver.bodies[0]["payload"]
    if "stack" in delays:
        # The stacks never come: whichever gives up first (the stacks' own wait inside the
        # fetch, or the diagnosis' deadline, a race on a loaded machine) the page names
        # rank 2 and its pod, from the dumps or from /status, before the hold ends.
        assert payload["diagnosis"].startswith("rank 2 (pod llama-w-1"), (
            payload["diagnosis"],
            probes.asked,
        )
    else:
        assert payload["diagnosis"].startswith(
            "rank 2 (pod llama-w-1, node gpu-01) never entered all_reduce #10 of pg tp; "
            "3 ranks waiting (from the ranks' /status only"
        ), (payload["diagnosis"], probes.asked)
    assert payload["culprit_ranks"] == [CULPRIT]
    assert paged_s < 3.5, paged_s  # with its verdict, before the end of the 4 s hold
    assert ("status", CULPRIT) in probes.asked


def test_the_status_verdict_is_a_hang_naming_only_the_missing_ranks() -> None:
    key = StalledKey("7", 12, "", "all_reduce 4x16 Float", 100.0, tuple(range(8)), {1: WAITER})
    states = {5: MISSING, 9: MISSING, 2: WAITING, 3: WAITING, 4: PAST}
    located = Located(key, (5, 9), states, 4, identities={5: ("w-5", ""), 2: ("w-2", "n")})
    verdict = located.verdict("ns/job", 16, "no dump was read within the deadline")
    assert verdict is not None and verdict.verdict == "hang" and verdict.culprit_ranks == (5, 9)
    assert verdict.summary == (
        "rank 5 (pod w-5), rank 9 never entered all_reduce #12 of pg 7; 3 ranks waiting "
        "(from the ranks' /status only, 4 asked: no dump was read within the deadline)"
    )
    report = verdict.to_dict()["report"]
    assert report["source"] == "status" and report["hang"]["missing_ranks"] == [5, 9]
    assert report["hang"]["arrived_ranks"] == [1, 2, 3] and report["ranks"] == 16
    assert Located(key, (), states).verdict("ns/job", 16, "x") is None
    assert Located(None).verdict("ns/job", 16, "x") is None


@pytest.mark.parametrize(
    "delays",
    [{"dump": 30.0}, {"dump": 0.9, "stack": 30.0}],
    ids=["no dump answers", "the stacks overrun the deadline"],
)
async def test_a_rank_whose_status_says_it_saves_a_checkpoint_holds_the_page(
    tmp_path: Path,
    receiver: Receiver,
    delays: dict[str, float],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rank 2 never entered the all_reduce because it is inside torch.save, and its
    `/status` says so (`phase`); its dumps, or its stack, do not come in time (a rank
    writing a checkpoint answers slowly). The verdict is `checkpoint`, as when its stack
    says so: the page is held to the checkpoint limit (30 min), not sent at the end of the
    4 s hold. Before, the verdict from `/status` only (or from the dumps) was a `hang`: the
    page went out within 2 s naming rank 2, and every page the incident held for a
    checkpoint with it."""
    caplog.set_level(logging.INFO, logger="trainsentry.diagnosis")
    probes = Probes(delays, saving=True)
    await run_job(tmp_path, receiver, probes, 6.0)
    assert not receiver.bodies, receiver.bodies[0]["payload"].get("diagnosis")
    stored = [r.getMessage() for r in caplog.records if "diagnosis stored" in r.getMessage()]
    assert len(stored) == 1 and "verdict=checkpoint culprits=[2]" in stored[0], stored
    assert "held_until=" in stored[0] and "held_until=-" not in stored[0], stored
    assert ("status", CULPRIT) in probes.asked


def test_the_status_verdict_of_a_rank_saving_a_checkpoint_is_a_checkpoint() -> None:
    """Every missing rank's `/status` says it saves a checkpoint (the probe's `phase`): the
    verdict from `/status` only is `checkpoint`, with how long the peers have waited (what
    the checkpoint limit is measured against); one missing rank that is not saving keeps
    it a `hang`. A dumps' `hang` whose culprit's stack did not come is made a checkpoint by
    its `/status` the same way; one whose stack came and shows no save is not."""
    key = StalledKey("7", 12, "", "all_reduce", 1000.0, tuple(range(8)), {1: WAITER})
    states = {5: MISSING, 2: WAITING}
    marked = {"name": "checkpoint", "since": 990.0, "source": "marked"}
    located = Located(key, (5,), states, 3, identities={5: ("w-5", "n-5")}, phases={5: SAVING})
    verdict = located.verdict("ns/job", 16, "no dump was read within the deadline", now=1030.0)
    assert verdict is not None and verdict.verdict == "checkpoint", verdict
    assert verdict.culprit_ranks == (5,) and verdict.report is not None
    assert verdict.summary == (
        "rank 5 (pod w-5, node n-5) is saving a checkpoint (torch.save); its peers wait for "
        "it: not a hang (from the ranks' /status only, 3 asked: no dump was read within the "
        "deadline)"
    )
    assert verdict.report["hang"]["waited_s"] == 30.0
    _, hold_until = past_checkpoint_limit(verdict, 600.0, datetime(2026, 1, 1, tzinfo=UTC))
    assert hold_until == datetime(2026, 1, 1, 0, 9, 30, tzinfo=UTC)

    both = Located(key, (5, 6), states, 3, phases={5: SAVING, 6: marked})
    assert both.verdict("ns/job", 16, "x").verdict == "checkpoint"  # type: ignore[union-attr]
    one = Located(key, (5, 6), states, 3, phases={5: SAVING})
    assert one.verdict("ns/job", 16, "x").verdict == "hang"  # type: ignore[union-attr]

    dumps = HangVerdict("ns/job", "hang", "rank 5 never entered ...", culprit_ranks=(5,))
    assert located.with_phases(dumps).verdict == "checkpoint"
    stuck = {"phase": None, "threads": [{"thread": "MainThread", "main": True, "frames": []}]}
    answered = dataclasses.replace(dumps, stacks={5: stuck})
    assert located.with_phases(answered) == answered
    assert Located(key, (5,), states).with_phases(dumps) == dumps  # no phase said


async def test_at_the_shipped_deadline_the_wait_for_triggers_leaves_half_of_it(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Only pod 0's ranks post (a large job's probes spread their triggers over 1 s per
    1,000 ranks: most have not posted yet), so the triggers never tell where rank 2 and 3
    listen and the wait for more would run its whole 3 s `settle_seconds`. At the shipped
    deadline (4 s) it stops at half of it, 2 s, and the search and the fetch get the rest:
    the page names rank 2. Before, the wait took 3 s and left 1 s (at 16,384 ranks: too
    little for the /status asked and the fetch; the page went out undiagnosed)."""
    caplog.set_level(logging.INFO, logger="trainsentry.diagnosis")
    probes = Probes({"dump": 30.0})
    paged_s = await run_job(tmp_path, receiver, probes, 8.0, DiagnosisSettings(), (0, 1))
    located = [r.getMessage() for r in caplog.records if "diagnosis located" in r.getMessage()]
    assert len(located) == 1, located
    settle = float(re.search(r"settle_s=([0-9.]+)", located[0]).group(1))  # type: ignore[union-attr]
    assert 1.9 <= settle <= 2.3, located
    assert "missing=[2]" in located[0], located
    assert receiver.bodies and receiver.bodies[0]["payload"]["culprit_ranks"] == [CULPRIT]
    assert paged_s < 4.5, paged_s


async def test_the_status_verdict_does_not_wait_for_the_fetch_to_end(
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The dumps do not come, and the fetch given up on takes 3 s to end (its connections
    and its files closed on a loaded loop): the verdict from `/status` is stored within the
    diagnosis' deadline all the same; the fetch ends on its own. Before, the diagnosis
    waited for it, ran past its deadline, and the page went out at the end of the hold
    saying the diagnosis was late."""
    import trainsentry.gateway.stages.hang.diagnosis as diagnosis

    async def slow_to_end(*args: Any, **kwargs: Any) -> Any:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.shield(asyncio.sleep(3.0))

    monkeypatch.setattr(diagnosis, "enrich_hang", slow_to_end)
    caplog.set_level(logging.INFO, logger="trainsentry.diagnosis")
    paged_s = await run_job(tmp_path, receiver, Probes({}), 8.0)
    assert receiver.bodies, "no page"
    assert receiver.bodies[0]["payload"]["culprit_ranks"] == [CULPRIT]
    assert paged_s < 3.5, paged_s  # with its verdict, before the end of the 4 s hold
    assert not any("diagnosis late" in r.getMessage() for r in caplog.records)


async def test_the_culprits_dump_alone_does_not_cancel_the_page(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Only rank 2's dump comes in time (the others' probes are slow): alone, it shows no
    collective its peers are in, and the analysis says `ok`. `/status` saw rank 2 never
    enter the all_reduce its peers wait in: the page names rank 2 from `/status`. Before,
    the dumps' `ok` won, and a probe stall the dumps "do not confirm" is cancelled: no
    page at all (bench_hang_scale at 4,096 ranks: 1 of 32 dumps read, verdict ok)."""
    probes = Probes({"dump": 30.0}, prompt=CULPRIT)
    paged_s = await run_job(tmp_path, receiver, probes, 8.0)
    assert receiver.bodies, "no page"
    payload = receiver.bodies[0]["payload"]
    assert payload["diagnosis"].startswith(
        "rank 2 (pod llama-w-1, node gpu-01) never entered all_reduce #10 of pg tp; "
        "3 ranks waiting (from the ranks' /status only, 1 asked: the 1 dump read in time said "
    ), payload["diagnosis"]
    assert payload["culprit_ranks"] == [CULPRIT]
    assert paged_s < 3.5, paged_s
    assert ("dump", CULPRIT) in probes.asked
