"""A probe's hang trigger at the gateway: validation, one alert per (job, pg, seq) across
ranks and restarts, and what the card says about the culprit's stack."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.dump_probes import addresses, start_dump_probes
from tests.support.gateway_process import close_in_process
from trainsentry.alerts import JobRef
from trainsentry.gateway.stages.hang.enrichment import HangVerdict, with_stacks
from trainsentry.gateway.stages.hang.stacks import checkpointing, stack_phrase
from trainsentry.gateway.stages.hang.trigger import (
    MAX_TRIGGER_BYTES,
    HangTrigger,
    JobHangs,
    TriggerRejected,
    parse_trigger,
    trigger_webhook,
)
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.probe.identity import ProbeConfig
from trainsentry.probe.runtime import Probe
from trainsentry.probe.stacks import phase
from trainsentry.probe.stall import Stall

NOW = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)


def probe_body(rank: int, waited: float) -> bytes:
    """What a real probe posts (Probe.trigger_body), for one rank."""
    probe = Probe(
        ProbeConfig(
            rank=rank,
            world_size=4,
            pod=f"llama-w-{rank}",
            node="gpu-07",
            trainingjob="llama",
            namespace="team-a",
            port=0,
            bind="127.0.0.1",
        )
    )
    try:
        stall = Stall("3", "tp-1", 4812, "all_reduce", "started", waited, 20.0)
        return json.dumps(probe.trigger_body(stall)).encode()
    finally:
        probe.server.stop()


def test_triggers_of_different_collectives_from_different_ranks_are_one_alert() -> None:
    alerts = []
    for rank, waited, pg, seq in ((0, 21.3, "3", 4812), (1, 22.9, "7", 12), (3, 20.1, "3", 4813)):
        body = json.loads(probe_body(rank, waited))
        body.update({"pg": pg, "seq": seq})
        trigger = parse_trigger(json.dumps(body).encode())
        receipt = parse_webhook(trigger_webhook(trigger, NOW), received_at=NOW)
        (alert,) = receipt.alerts
        alerts.append(alert)
    assert len({(a.fingerprint, a.starts_at) for a in alerts}) == 1
    labels = alerts[0].labels
    assert labels == {
        "alertname": "TrainingCollectiveStalled",
        "namespace": "team-a",
        "trainingjob": "llama",
        "priority": "P0",
        "component": "training",
        "source": "probe",
    }
    assert "tp-1" in alerts[0].annotations["summary"]
    assert (alerts[0].annotations["pg"], alerts[0].annotations["seq"]) == ("3", "4812")
    # When the stall began, for the weekly report's time to detection: NOW - waited.
    assert alerts[0].annotations["stalled_since"] == (NOW - timedelta(seconds=21.3)).isoformat()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"namespace": "Team A"}, "namespace"),
        ({"trainingjob": "x" * 300}, "trainingjob"),
        ({"seq": -1}, "seq"),
        ({"seq": "twenty"}, "seq"),
        ({"waited_s": None}, "waited_s"),
        ({"pg": ""}, "pg"),
        ({"pod": "p" * 1000}, "pod"),
    ],
)
def test_bad_triggers_are_refused_with_the_field_named(change: dict, reason: str) -> None:
    body = json.loads(probe_body(0, 21.0))
    body.update(change)
    with pytest.raises(TriggerRejected, match=reason):
        parse_trigger(json.dumps(body).encode())


def test_oversized_and_non_json_triggers_are_refused() -> None:
    with pytest.raises(TriggerRejected, match="larger than"):
        parse_trigger(b"{" + b" " * MAX_TRIGGER_BYTES + b"}")
    with pytest.raises(TriggerRejected, match="not a hang trigger"):
        parse_trigger(b"\xff\xfe")


def test_unknown_keys_never_become_labels() -> None:
    body = json.loads(probe_body(0, 21.0))
    body["labels"] = {"priority": "P3", "team": "evil"}
    body["receiver"] = "elsewhere"
    trigger = parse_trigger(json.dumps(body).encode())
    (alert,) = parse_webhook(trigger_webhook(trigger, NOW), received_at=NOW).alerts
    assert "team" not in alert.labels and alert.labels["priority"] == "P0"


class HangStore:
    """The store as `JobHangs` sees it (`lookup`, `submit`): the hang alerts it was sent
    (`written`) and the firing ones by fingerprint, with their startsAt and annotations."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.firing: dict[str, tuple[datetime, dict[str, str]]] = {}

    async def lookup(self, fingerprint: str) -> tuple[datetime, dict[str, str]] | None:
        return self.firing.get(fingerprint)

    async def submit(self, body: bytes) -> int:
        self.written.append(body)
        (alert,) = parse_webhook(body, received_at=NOW).alerts
        if alert.status.value == "firing":
            self.firing[alert.fingerprint] = (alert.starts_at, dict(alert.annotations))
        else:
            self.firing.pop(alert.fingerprint, None)
        return 1


def test_a_jobs_later_triggers_join_its_hang_without_a_write_also_after_a_restart() -> None:
    """The first trigger is stored; every later one of the job, whatever its (pg, seq), is
    answered "known" from memory; after a restart the store's firing hang is adopted once."""
    store = HangStore()
    written, firing, lookup, submit = store.written, store.firing, store.lookup, store.submit

    def trigger(rank: int, pg: str, seq: int, *, resolved: bool = False) -> HangTrigger:
        body = json.loads(probe_body(rank, 21.0))
        body.update({"pg": pg, "seq": seq, "resolved": resolved})
        return parse_trigger(json.dumps(body).encode())

    async def scenario() -> None:
        hangs = JobHangs(lookup, submit)
        first = await hangs.take(trigger(0, "3", 4812), "10.0.0.1", NOW)
        assert (first.status, first.body["first"], first.body["hang"]) == (202, True, "known")
        for rank, pg, seq in ((1, "3", 4812), (2, "7", 12), (3, "9", 1)):
            later = await hangs.take(trigger(rank, pg, seq), "10.0.0.1", NOW)
            assert (later.status, later.body["status"]) == (200, "known")
        assert len(written) == 1
        evidence = hangs.evidence(JobRef("team-a", "llama"))
        assert evidence is not None and {(k.pg, k.seq) for k in evidence.keys} == {
            ("3", 4812),
            ("7", 12),
            ("9", 1),
        }
        restarted = JobHangs(lookup, submit)  # memory gone: the store's firing hang joins
        again = await restarted.take(trigger(1, "7", 13), "10.0.0.1", NOW)
        assert (again.status, again.body["status"], len(written)) == (200, "known", 1)
        # the end of another key is noted, not stored; the end of the hang's key resolves it
        other = await restarted.take(trigger(1, "7", 13, resolved=True), "10.0.0.1", NOW)
        assert (other.body["status"], len(written)) == ("noted", 1)
        end = await restarted.take(trigger(1, "3", 4812, resolved=True), "10.0.0.1", NOW)
        assert (end.status, len(written), firing) == (202, 2, {})
        fresh = await restarted.take(trigger(1, "3", 4900), "10.0.0.1", NOW)
        assert fresh.body["first"] is True and len(written) == 3

    asyncio.run(scenario())


def test_a_job_that_keeps_opening_and_ending_hangs_runs_out_of_its_write_budget() -> None:
    async def lookup(fingerprint: str) -> None:
        return None

    async def submit(body: bytes) -> int:
        return 1

    async def scenario() -> list[int]:
        hangs = JobHangs(lookup, submit, writes_per_minute=6, clock=lambda: 100.0)
        statuses = []
        for seq in range(5):
            body = json.loads(probe_body(0, 21.0))
            body["seq"] = seq
            statuses.append(
                (await hangs.take(parse_trigger(json.dumps(body).encode()), "h", NOW)).status
            )
            body["resolved"] = True
            answer = await hangs.take(parse_trigger(json.dumps(body).encode()), "h", NOW)
            statuses.append(answer.status)
            if answer.status == 429:
                assert answer.retry_after_s
        return statuses

    assert asyncio.run(scenario()) == [202] * 6 + [429, 200] * 2  # no hang: its end is ignored


# ------------------------------------------------------------- what the culprit is doing


def _stack_of(target: threading.Thread, ready: threading.Event) -> dict:
    """A real /stack answer, taken while `target` (made the "main" thread) is blocked."""
    target.start()
    ready.wait(5)
    time.sleep(0.2)
    probe = Probe(ProbeConfig(rank=2, pod="llama-w-2", node="gpu-07", port=0, bind="127.0.0.1"))
    try:
        stack = probe.stack()
    finally:
        probe.server.stop()
    threads = stack["threads"]
    mine = next(t for t in threads if t["thread"] == target.name)
    for t in threads:
        t["main"] = t is mine
    stack["threads"] = [mine] + [t for t in threads if t is not mine]
    return stack


def fetch_next_batch(ready: threading.Event, stop: threading.Event) -> None:
    ready.set()
    while not stop.is_set():
        time.sleep(0.05)


def test_the_card_says_where_the_culprit_is() -> None:
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=fetch_next_batch, args=(ready, stop), name="trainer")
    try:
        stack = _stack_of(thread, ready)
    finally:
        stop.set()
        thread.join()
    phrase = stack_phrase(stack)
    assert phrase.startswith("test_hang_trigger.py:")
    assert "fetch_next_batch: time.sleep(0.05)" in phrase and checkpointing(stack) == ""
    verdict = HangVerdict("team-a/llama", "hang", "rank 2 never entered all_reduce #9", (2,))
    told = with_stacks(verdict, {2: stack}, {2: ("llama-w-2", "gpu-07")})
    assert told.verdict == "hang"
    assert told.summary == f"rank 2 never entered all_reduce #9; rank 2 is in {phrase}"


def test_a_culprit_in_a_checkpoint_phase_is_not_a_hang() -> None:
    ready, stop = threading.Event(), threading.Event()

    def save() -> None:
        with phase("checkpoint"):
            fetch_next_batch(ready, stop)

    thread = threading.Thread(target=save, name="saver")
    try:
        stack = _stack_of(thread, ready)
    finally:
        stop.set()
        thread.join()
    assert checkpointing(stack) == "a marked checkpoint phase"
    verdict = HangVerdict("team-a/llama", "hang", "rank 2 never entered barrier #3", (2,))
    told = with_stacks(verdict, {2: stack}, {2: ("llama-w-2", "gpu-07")})
    assert told.verdict == "checkpoint"
    assert told.summary.startswith("rank 2 (pod llama-w-2, node gpu-07) is saving a checkpoint")
    two = HangVerdict("team-a/llama", "hang", "ranks 1, 2 never entered barrier #3", (1, 2))
    assert with_stacks(two, {2: stack}, {}).verdict == "hang"  # rank 1 unexplained: a hang


# ------------------------------------------------------------- the endpoint


async def _post(server: Any, body: bytes, token: str | None = "probe-token") -> tuple[int, str]:
    import aiohttp

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.post(server.make_url("/api/v1/hang-triggers"), data=body) as answer,
    ):
        return answer.status, await answer.text()


async def _gateway(tmp_path: Path, hosts: list[str] | None) -> Any:
    from aiohttp.test_utils import TestServer
    from pydantic import SecretStr

    from trainsentry.config import GatewaySettings
    from trainsentry.config.diagnosis import DiagnosisSettings
    from trainsentry.gateway.assemble import Diagnosis, create_app
    from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints

    settings = GatewaySettings(
        listen="127.0.0.1:0", db=f"sqlite:///{tmp_path / 'gw.db'}", webhook_token=SecretStr("w")
    )
    diagnosis = None
    if hosts is not None:
        endpoints = StaticEndpoints({"team-a/llama": [f"{h}:9401" for h in hosts]})
        diagnosis = Diagnosis(DiagnosisSettings(hold_seconds=1), endpoints, "probe-token")
    server = TestServer(create_app(settings, diagnosis=diagnosis), host="127.0.0.1")
    await server.start_server()
    return server


async def test_the_endpoint_takes_triggers_only_from_the_jobs_ranks(tmp_path: Path) -> None:
    body = probe_body(1, 21.0)
    server = await _gateway(tmp_path, ["127.0.0.1", "127.0.0.3"])
    try:
        assert (await _post(server, body, token=None))[0] == 401
        assert (await _post(server, body, token="wrong"))[0] == 401
        status, text = await _post(server, b'{"namespace": "team-a"}')
        assert status == 400 and "trainingjob" in text
        assert (await _post(server, b"x" * (MAX_TRIGGER_BYTES + 1)))[0] == 413
        other = json.loads(body)
        other["trainingjob"] = "someone-elses-job"
        status, text = await _post(server, json.dumps(other).encode())
        assert status == 403 and "team-a/someone-elses-job" in text
        status, text = await _post(server, body)
        assert status == 202, text
        assert json.loads(text)["first"] is True
        status, text = await _post(server, probe_body(3, 24.0))
        assert (status, json.loads(text)["first"], json.loads(text)["new"]) == (200, False, 0)
    finally:
        await close_in_process(server)
    (tmp_path / "other").mkdir()
    server = await _gateway(tmp_path / "other", ["10.0.0.7"])  # the sender is not a rank
    try:
        status, text = await _post(server, body)
        assert status == 403 and "127.0.0.1 is not a rank of TrainingJob team-a/llama" in text
    finally:
        await close_in_process(server)


async def test_a_jobs_own_token_pages_that_job_and_no_other(tmp_path: Path) -> None:
    """The operator gives each TrainingJob's namespace its job's token (HMAC of the master,
    `trainsentry.probe.token.job_token`): the gateway recomputes it per trigger. Team B's
    token cannot page team A's job, even from an address of team A's ranks."""
    from trainsentry.probe.token import job_token

    body = probe_body(1, 21.0)
    server = await _gateway(tmp_path, ["127.0.0.1"])
    try:
        team_b = job_token("probe-token", "team-b", "llama")
        assert (await _post(server, body, token=team_b))[0] == 401
        wrong_master = job_token("another-master", "team-a", "llama")
        assert (await _post(server, body, token=wrong_master))[0] == 401
        own = job_token("probe-token", "team-a", "llama")
        status, text = await _post(server, body, token=own)
        assert status == 202 and json.loads(text)["first"] is True, text
        status, text = await _post(server, probe_body(3, 24.0), token="probe-token")
        assert status == 200 and json.loads(text)["first"] is False, text  # the master too
    finally:
        await close_in_process(server)


async def test_a_jobs_triggers_in_many_collectives_are_one_stored_hang(tmp_path: Path) -> None:
    """Every waiting rank posts for each group it waits in: 60 distinct (pg, seq) keys of one
    job are one alert; all but the first are answered "known" (the probe stops posting)."""
    import aiohttp

    server = await _gateway(tmp_path, ["127.0.0.1"])
    answers = []
    try:
        for i in range(60):
            body = json.loads(probe_body(i % 4, 21.0 + i / 10))
            body.update({"pg": str(i % 7), "seq": 100 + i})
            answers.append(await _post(server, json.dumps(body).encode()))
        async with (
            aiohttp.ClientSession(headers={"Authorization": "Bearer w"}) as http,
            http.get(server.make_url("/api/v1/alerts")) as answer,
        ):
            items = (await answer.json())["items"]
    finally:
        await close_in_process(server)
    assert len(items) == 1, [i["labels"] for i in items]
    assert answers[0][0] == 202
    assert {(status, json.loads(text)["hang"]) for status, text in answers[1:]} == {(200, "known")}


async def test_without_diagnosis_the_endpoint_says_it_is_off(tmp_path: Path) -> None:
    server = await _gateway(tmp_path, None)
    try:
        status, text = await _post(server, probe_body(1, 21.0))
        assert status == 404 and "no hang diagnosis" in text
    finally:
        await close_in_process(server)


async def test_the_end_of_a_stall_resolves_its_alert_and_an_unknown_end_is_ignored(
    tmp_path: Path,
) -> None:
    server = await _gateway(tmp_path, ["127.0.0.1"])
    ended = json.loads(probe_body(1, 40.0))
    ended["resolved"] = True
    try:
        status, text = await _post(server, json.dumps(ended).encode())
        assert (status, json.loads(text)["status"]) == (200, "ignored")
        assert (await _post(server, probe_body(1, 21.0)))[0] == 202
        status, text = await _post(server, json.dumps(ended).encode())
        assert status == 202, text
        import aiohttp

        async with (
            aiohttp.ClientSession(headers={"Authorization": "Bearer w"}) as http,
            http.get(server.make_url("/api/v1/alerts")) as answer,
        ):
            items = (await answer.json())["items"]
        assert [(a["alertname"], a["status"]) for a in items] == [
            ("TrainingCollectiveStalled", "resolved")
        ]
    finally:
        await close_in_process(server)


def test_the_analysis_measures_waits_against_each_dumps_own_capture_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe says when it took the dump (X-Trainsentry-Captured-At-Ns); the dump files the
    analyzer reads carry that time as their mtime, not the time the gateway wrote them."""
    import os

    import trainsentry.diagnostics as diagnostics
    from trainsentry.gateway.stages.hang.enrichment import (
        FetchResult,
        RankEndpoint,
        _captured_ns,
        diagnose,
    )

    seen: dict[str, int] = {}

    class Report:
        def to_dict(self) -> dict:
            return {"verdict": "ok", "ranks": 2}

    def analyze(paths: list[str], format: str, in_place: bool = False) -> Report:
        assert in_place, "the gateway must say its files carry the capture times"
        for name in os.listdir(paths[0]):
            seen[name] = os.stat(os.path.join(paths[0], name)).st_mtime_ns
        return Report()

    monkeypatch.setattr(diagnostics, "analyze", analyze)
    taken = time.time_ns() - 90 * 10**9
    results = [
        FetchResult(RankEndpoint("a:1"), 0, "p0", "n0", b"{}", captured_ns=taken),
        FetchResult(RankEndpoint("a:2"), 1, "p1", "n1", b"{}"),
    ]
    before = time.time_ns()
    diagnose("team-a/llama", results)
    assert seen["rank_0.json"] == taken
    assert seen["rank_1.json"] >= before - 10**9  # no header: the time it arrived
    assert _captured_ns(str(taken)) == taken
    assert _captured_ns("12") == 0 and _captured_ns("-5") == 0 and _captured_ns("") == 0


@pytest.mark.parametrize(("scenario", "paged"), [("ok", False), ("hang", True)])
async def test_a_probe_stall_the_dumps_do_not_confirm_is_not_paged(
    tmp_path: Path, scenario: str, paged: bool
) -> None:
    from aiohttp.test_utils import TestServer
    from pydantic import SecretStr

    from tests.support.receiver import Receiver
    from trainsentry.config import GatewaySettings
    from trainsentry.config.diagnosis import DiagnosisSettings
    from trainsentry.gateway.assemble import Diagnosis, create_app
    from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints
    from trainsentry.notifiers.webhook import WebhookNotifier

    runners = await start_dump_probes(4, scenario=scenario, culprit=2, entries=30)
    receiver = Receiver()
    await receiver.start()
    probes = addresses(runners)
    settings = GatewaySettings(
        listen="127.0.0.1:0", db=f"sqlite:///{tmp_path / 'gw.db'}", webhook_token=SecretStr("w")
    )
    diagnosis = Diagnosis(
        # the shipped deadline (4 s): with 2 s, a loaded CI machine read the dumps late, and a
        # late diagnosis pages unconfirmed (as it must), failing the "ok" case
        DiagnosisSettings(hold_seconds=5, deadline_seconds=4, request_timeout_seconds=1),
        StaticEndpoints({"team-a/llama": probes}),
        "probe-token",
    )
    notifiers = {"feishu": WebhookNotifier(receiver.url, name="feishu")}
    server = TestServer(
        create_app(settings, notifiers=notifiers, diagnosis=diagnosis), host="127.0.0.1"
    )
    await server.start_server()
    try:
        assert (await _post(server, probe_body(1, 21.0)))[0] == 202
        await asyncio.sleep(6.5)  # past the hold: a page would have gone out
        assert bool(receiver.bodies) is paged, receiver.bodies
    finally:
        await close_in_process(server)
        await receiver.stop()
        for runner in runners:
            await runner.cleanup()


async def test_a_probe_told_the_hang_is_known_stops_posting_until_a_stall_ends(
    tmp_path: Path,
) -> None:
    """The probe's own client against the real endpoint: after the gateway said "known",
    this rank's next stall triggers are not sent; the end of a stall is, and re-arms it."""
    from trainsentry.probe.trigger import TriggerClient

    server = await _gateway(tmp_path, ["127.0.0.1"])
    client = TriggerClient(str(server.make_url("")), "probe-token", jitter_s=0)
    posted: list[dict[str, Any]] = []
    send = client.send

    def counting(body: dict[str, Any]) -> bool:
        posted.append(body)
        return send(body)

    client.send = counting  # type: ignore[method-assign]
    try:
        first = json.loads(probe_body(1, 21.0))
        assert await asyncio.to_thread(client.send, first) and client.known
        for seq in (4813, 4814):
            client.submit({**first, "seq": seq})
        await asyncio.sleep(1.0)
        assert [b["seq"] for b in posted] == [4812] and client.stats.suppressed == 2
        client.submit({**first, "resolved": True})
        await asyncio.sleep(1.5)
        assert [(b["seq"], b.get("resolved")) for b in posted] == [(4812, None), (4812, True)]
        assert not client.known
    finally:
        await asyncio.to_thread(client.stop)
        await close_in_process(server)


@pytest.mark.parametrize(
    "ranks",
    [[0, 1, 2, 3], list(range(5, 16384, 128)), [0, 2, 3, 9, 10, 11, 40], [7], []],
)
def test_the_probes_member_list_reads_back_at_the_gateway(ranks: list[int]) -> None:
    from trainsentry.gateway.stages.hang.evidence import parse_ranks
    from trainsentry.probe.trigger import compact_ranks

    text = compact_ranks(ranks)
    assert len(text) < 40 and sorted(parse_ranks(text)) == sorted(ranks)
    assert parse_ranks("0-99999999") == () and parse_ranks("3-1") == () and parse_ranks("x") == ()


def test_what_the_trigger_ports_process_is_told_of_a_jobs_hang_and_hosts() -> None:
    """`known_for`: the rest of the hang's window (the child answers "known" that long);
    `noted`: a trigger answered elsewhere becomes the hang's evidence; `on_forget`: the
    hang's end is told at once; `TriggerSources.remembered`: the hosts and their freshness."""
    from trainsentry.gateway.stages.hang.trigger import TriggerSources

    store = HangStore()
    lookup, submit = store.lookup, store.submit
    now = [0.0]

    def trigger(rank: int, *, resolved: bool = False) -> HangTrigger:
        body = json.loads(probe_body(rank, 21.0)) | {"resolved": resolved}
        return parse_trigger(json.dumps(body).encode())

    async def resolve(job: JobRef) -> list[str]:
        return ["10.0.0.1", "10.0.0.2"]

    async def scenario() -> None:
        job = JobRef("team-a", "llama")
        hangs = JobHangs(lookup, submit, window_s=600.0, clock=lambda: now[0])
        forgotten: list[JobRef] = []
        stop = hangs.on_forget(forgotten.append)
        assert hangs.known_for(job) is None and not hangs.noted(trigger(1), "10.0.0.2")
        assert (await hangs.take(trigger(0), "10.0.0.1", NOW)).status == 202
        assert hangs.known_for(job) == 600.0
        now[0] = 100.0
        assert hangs.known_for(job) == 500.0
        assert hangs.noted(trigger(3), "10.0.0.2")
        evidence = hangs.evidence(job)
        assert evidence is not None and set(evidence.waiters) == {0, 3}
        assert (await hangs.take(trigger(0, resolved=True), "10.0.0.1", NOW)).status == 202
        assert forgotten == [job] and hangs.known_for(job) is None
        stop()
        assert (await hangs.take(trigger(0), "10.0.0.1", NOW)).status == 202
        assert (await hangs.take(trigger(0, resolved=True), "10.0.0.1", NOW)).status == 202
        assert forgotten == [job]  # no longer watched
        now[0] = 700.0
        assert hangs.known_for(job) is None  # past its window: the store is asked again

        sources = TriggerSources(resolve, ttl_s=30.0, clock=lambda: now[0])
        assert sources.remembered(job) is None
        assert await sources.allowed(job, "10.0.0.1")
        now[0] = 710.0
        assert sources.remembered(job) == (frozenset({"10.0.0.1", "10.0.0.2"}), 20.0)
        now[0] = 731.0
        assert sources.remembered(job) is None

    asyncio.run(scenario())
