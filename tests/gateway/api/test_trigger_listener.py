"""The probes' hang triggers on a port of their own (`gateway.trigger_listen`,
api/trigger_listener.py, api/trigger_process.py; issue 42, "other jobs' intake unaffected").

A known hang's triggers are answered by the gateway's child process, from its memory: the
tests post them while the gateway's event loop is blocked outright and still get the
"known" answers, which reach the gateway's `JobHangs` as the hang's evidence once the loop
runs again. What needs the store or the cluster API (a job's first trigger, an unremembered
sender, a stall's end) is handed to the gateway: the first trigger is stored once, however
many ranks post it at once to either port, and a hang the gateway ends is no longer
answered "known" by the child. Every refusal is the gateway port's, byte for byte. The
child starts with the gateway, is started again when it dies, and ends with the gateway,
also when the gateway is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from tests.support.eventually import eventually, eventually_sync
from tests.support.gateway_process import close_in_process
from tests.support.gateway_process import start_gateway as start_gateway_process
from tests.support.hang_triggers import trigger_json
from trainsentry.alerts import JobRef
from trainsentry.gateway.api.app import HANG_TRIGGER_PATH
from trainsentry.gateway.api.trigger_listener import CHILD, TRIGGER_LISTENER_KEY
from trainsentry.gateway.api.trigger_process import NICENESS
from trainsentry.gateway.pipeline import GATEWAY_KEY, HangTriggers
from trainsentry.gateway.stages.hang.trigger import KNOWN_BODY, MAX_TRIGGER_BYTES
from trainsentry.probe.token import job_token

PROBE_TOKEN = "probe-token"
JOB = JobRef("team-a", "llama")


def trigger(rank: int, seq: int = 100, **changes: Any) -> bytes:
    return trigger_json(JOB.namespace, JOB.name, rank, seq, **changes)


def post(url: str, body: bytes, token: str | None = PROBE_TOKEN) -> tuple[int, bytes]:
    """A blocking POST from this thread (the gateway's loop may be blocked meanwhile)."""
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def start_gateway(
    tmp_path: Path, hosts: list[str] | None = None, trigger_listen: str | None = "127.0.0.1:0"
) -> TestServer:
    from pydantic import SecretStr

    from trainsentry.config import GatewaySettings
    from trainsentry.config.diagnosis import DiagnosisSettings
    from trainsentry.gateway.assemble import Diagnosis, create_app
    from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints

    settings = GatewaySettings(
        listen="127.0.0.1:0",
        trigger_listen=trigger_listen,
        db=f"sqlite:///{tmp_path / 'gw.db'}",
        webhook_token=SecretStr("w"),
    )
    diagnosis = None
    if hosts is not None:
        endpoints = StaticEndpoints({str(JOB): [f"{h}:9401" for h in hosts]})
        diagnosis = Diagnosis(DiagnosisSettings(hold_seconds=1), endpoints, PROBE_TOKEN)
    server = TestServer(create_app(settings, diagnosis=diagnosis), host="127.0.0.1")
    await server.start_server()
    return server


def urls(server: TestServer) -> tuple[str, str]:
    """The trigger URL on the gateway's port and on the trigger port."""
    port = server.app[TRIGGER_LISTENER_KEY].port
    return str(server.make_url(HANG_TRIGGER_PATH)), f"http://127.0.0.1:{port}{HANG_TRIGGER_PATH}"


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[TestServer]:
    server = await start_gateway(tmp_path, ["127.0.0.1"])
    try:
        yield server
    finally:
        await close_in_process(server)


def children(parent: int | None = None) -> set[int]:
    """The trigger port's processes whose parent is `parent` (this process by default)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if ppid == parent and CHILD.encode() in argv:
            found.add(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def test_known_triggers_are_answered_while_the_gateways_loop_is_blocked(
    gateway: TestServer,
) -> None:
    """The job's first trigger is stored (202, through the gateway's loop); then the gateway's
    loop is blocked (a synchronous wait inside it) while 200 of the job's triggers are
    posted to the trigger port: every one is answered "known" (by the child), and noted as
    the hang's evidence in the gateway's `JobHangs` (the child's batches)."""
    _, triggers = urls(gateway)
    first = await asyncio.to_thread(post, triggers, trigger(0))
    assert first[0] == 202 and json.loads(first[1])["first"] is True, first
    answers: list[tuple[int, bytes]] = []

    def flood() -> None:
        with ThreadPoolExecutor(8) as pool:
            bodies = [trigger(1 + i % 63, seq=101 + i) for i in range(200)]
            answers.extend(pool.map(lambda body: post(triggers, body), bodies))

    poster = threading.Thread(target=flood)
    poster.start()
    poster.join(timeout=30)  # blocks the gateway's event loop until the flood is answered
    assert not poster.is_alive(), f"{len(answers)} of 200 answered with the loop blocked"
    assert set(answers) == {(200, KNOWN_BODY)}
    hang = gateway.app[GATEWAY_KEY].hang
    assert isinstance(hang, HangTriggers)

    def noted() -> bool:  # the child's batches, read once the gateway's loop runs again
        evidence = hang.hangs.evidence(JOB)
        return evidence is not None and len(evidence.keys) == 201

    await eventually(noted, within=10, what="the known triggers noted as evidence")
    evidence = hang.hangs.evidence(JOB)
    assert evidence is not None and set(evidence.waiters) == set(range(64))


async def test_a_jobs_first_trigger_is_stored_once_whichever_port_its_ranks_post_to(
    gateway: TestServer,
) -> None:
    """32 ranks post their job's first stall at once, half to each port: one 202 stores the
    hang (through the gateway's loop), the others join it (known, or pending while it is
    being stored); the store holds one alert."""
    ports = urls(gateway)

    def first_posts() -> list[tuple[int, bytes]]:
        with ThreadPoolExecutor(32) as pool:
            return list(pool.map(lambda r: post(ports[r % 2], trigger(r)), range(32)))

    answers = await asyncio.to_thread(first_posts)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200] * 31 + [202], answers
    stored = [json.loads(body) for status, body in answers if status == 202]
    assert stored[0]["first"] is True
    joined = {json.loads(body)["hang"] for status, body in answers if status == 200}
    assert joined <= {"known", "pending"}
    http = gateway.app[GATEWAY_KEY]
    await http.settle()
    alerts = await asyncio.to_thread(_alerts, str(gateway.make_url("/api/v1/alerts")))
    assert [a["alertname"] for a in alerts] == ["TrainingCollectiveStalled"]


def _alerts(url: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(url, headers={"Authorization": "Bearer w"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        items: list[dict[str, Any]] = json.loads(answer.read())["items"]
    return items


CASES = {
    "no token": (trigger(1), None),
    "wrong token": (trigger(1), "wrong"),
    "another job's token": (trigger(1), job_token(PROBE_TOKEN, "team-b", "llama")),
    "not a trigger": (b'{"namespace": "team-a"}', PROBE_TOKEN),
    "not json": (b"\xff\xfe", PROBE_TOKEN),
    "oversize": (b"x" * (MAX_TRIGGER_BYTES + 1), PROBE_TOKEN),
    "a job of no rank here": (trigger(1, trainingjob="someone-elses-job"), PROBE_TOKEN),
}


async def test_every_refusal_is_the_gateway_ports_own(gateway: TestServer) -> None:
    """Token, schema, size, sender: the trigger port answers each as the gateway's port
    does (status and body), before the job's hang exists and after (remembered), and each
    is counted in the gateway's receipts metric as the gateway's port counts it."""
    main, triggers = urls(gateway)
    registry = gateway.app[GATEWAY_KEY].metrics.registry

    def counted() -> tuple[float, ...]:  # the refusals in the gateway's receipts metric
        name = "trainsentry_webhook_receipts_total"
        return tuple(
            registry.get_sample_value(name, {"outcome": label}) or 0.0
            for label in ("unauthorized", "rejected")
        )

    for stage in ("before the hang", "after"):
        for case, (body, token) in CASES.items():
            before = counted()
            here = await asyncio.to_thread(post, main, body, token)
            mid = counted()
            there = await asyncio.to_thread(post, triggers, body, token)
            assert there == here, (stage, case)
            assert here[0] in (400, 401, 403, 413), (stage, case, here)
            # the child's refusals reach the gateway's metric too (in its batches)
            wanted = tuple(2 * m - b for m, b in zip(mid, before, strict=True))
            await eventually(
                lambda wanted=wanted: counted() == wanted, within=5, what=f"{case} counted"
            )
        if stage == "before the hang":
            assert (await asyncio.to_thread(post, triggers, trigger(0)))[0] == 202


async def test_a_sender_that_is_no_rank_is_refused_by_both_ports(tmp_path: Path) -> None:
    """The job's ranks are elsewhere: the first answer asks them (the gateway's loop), the
    next comes from the listener's memory; both 403 as on the gateway's port."""
    server = await start_gateway(tmp_path, ["10.0.0.7"])
    try:
        main, triggers = urls(server)
        answers = [await asyncio.to_thread(post, url, trigger(1)) for url in (triggers, main)]
        answers.append(await asyncio.to_thread(post, triggers, trigger(1)))  # remembered
    finally:
        await close_in_process(server)
    assert {status for status, _ in answers} == {403}
    assert len(set(answers)) == 1
    assert b"127.0.0.1 is not a rank of TrainingJob team-a/llama" in answers[0][1]


async def test_without_diagnosis_the_trigger_port_says_triggers_are_off(tmp_path: Path) -> None:
    server = await start_gateway(tmp_path, None)
    try:
        main, triggers = urls(server)
        answers = [await asyncio.to_thread(post, url, trigger(1)) for url in (main, triggers)]
    finally:
        await close_in_process(server)
    assert answers[0] == answers[1] and answers[0][0] == 404


async def test_the_child_starts_with_the_gateway_and_ends_with_it(tmp_path: Path) -> None:
    before = children()
    server = await start_gateway(tmp_path, ["127.0.0.1"])
    listener = server.app[TRIGGER_LISTENER_KEY]
    port, pid = listener.port, listener.pid
    assert port and pid and children() == before | {pid}
    # the flood's process yields the CPU to the gateway's own work
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, mine + NICENESS)
    _, triggers = urls(server)
    assert (await asyncio.to_thread(post, triggers, trigger(0)))[0] == 202
    await close_in_process(server)
    assert not alive(pid) and children() == before
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


async def test_a_trigger_port_in_use_fails_the_gateways_start_and_leaves_no_child(
    tmp_path: Path,
) -> None:
    before = children()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=r"gateway\.trigger_listen"):
            await start_gateway(tmp_path, ["127.0.0.1"], f"127.0.0.1:{port}")
    assert children() == before


async def test_without_a_trigger_port_the_gateway_runs_no_listener(tmp_path: Path) -> None:
    before = children()
    server = await start_gateway(tmp_path, ["127.0.0.1"], None)
    try:
        assert TRIGGER_LISTENER_KEY not in server.app and children() == before
        main = str(server.make_url(HANG_TRIGGER_PATH))
        assert (await asyncio.to_thread(post, main, trigger(0)))[0] == 202
    finally:
        await close_in_process(server)


async def test_a_killed_child_is_started_again_on_the_same_port(gateway: TestServer) -> None:
    """SIGKILL to the child: the gateway logs it and starts another (after a backoff) on the
    port it kept bound; the job's triggers are answered there again, "known" as before."""
    listener = gateway.app[TRIGGER_LISTENER_KEY]
    _, triggers = urls(gateway)
    assert (await asyncio.to_thread(post, triggers, trigger(0)))[0] == 202
    killed = listener.pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    await eventually(lambda: listener.restarts == 1, within=20, what="the child restarted")
    assert listener.pid not in (None, killed) and children() == {listener.pid}
    for rank in (1, 2):  # the new child asks the gateway once, then knows the hang itself
        assert await asyncio.to_thread(post, triggers, trigger(rank)) == (200, KNOWN_BODY)


async def test_a_hang_the_gateway_ends_is_not_answered_known_by_the_child(
    gateway: TestServer,
) -> None:
    """The child answers the job's stall "known"; the stall's end reaches the gateway on its
    own port (202, resolved): the gateway tells the child, whose next answer to a stall of
    the job is the gateway's again (a new hang stored: 202, first)."""
    main, triggers = urls(gateway)
    assert (await asyncio.to_thread(post, triggers, trigger(0)))[0] == 202
    assert await asyncio.to_thread(post, triggers, trigger(1)) == (200, KNOWN_BODY)
    ended = await asyncio.to_thread(post, main, trigger(0, resolved=True))
    assert ended[0] == 202 and json.loads(ended[1])["resolved"] is True, ended
    again = await asyncio.to_thread(post, triggers, trigger(2, seq=300))
    assert again[0] == 202 and json.loads(again[1])["first"] is True, again


def test_the_child_ends_when_the_gateway_is_killed(tmp_path: Path) -> None:
    """The real gateway (`trainsentry gateway`, a trigger port set) killed with SIGKILL: its
    child sees the control socket close and exits; no orphan keeps the port."""
    env = {"TRAINSENTRY_TRIGGER_LISTEN": "127.0.0.1:0", "PYTHONPATH": os.pathsep.join(sys.path)}
    server = start_gateway_process(tmp_path, f"sqlite:///{tmp_path / 'gw.db'}", env=env)
    pid = 0
    try:
        gateway = server.process.pid
        child = eventually_sync(lambda: children(gateway), within=20, what="the child")
        (pid,) = child
        os.kill(gateway, signal.SIGKILL)
        server.process.wait(timeout=10)
        started = time.monotonic()
        eventually_sync(lambda: not alive(pid), within=10, what="the child's exit")
        assert time.monotonic() - started < 5
    finally:
        server.stop()
        if pid and alive(pid):  # an orphan: not left behind by the test
            os.kill(pid, signal.SIGKILL)
