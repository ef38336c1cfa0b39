"""The fast hang path end to end: real 4-rank gloo jobs with the probe, the real gateway.

A waiting rank's probe posts a trigger to the gateway (`/api/v1/hang-triggers`); the
gateway stores one alert per (job, pg, seq), fetches every rank's dump and the culprits'
stacks, and sends one card naming the rank, its pod, node and the frame it is stuck in.
A rank saving a checkpoint while its peers wait gets no page, and its alert resolves when
the save ends; a slow job gets no alert at all.

The stall threshold is lowered to 2 s (floor and start-up) so that a test takes seconds;
the detector's adaptive rule itself is tested in test_stall.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from probe.probe_harness import TOKEN, GlooJob, free_port, launch_job
from tests.support.eventually import eventually_sync

pytestmark = [pytest.mark.torch, pytest.mark.e2e]
torch = pytest.importorskip("torch")

WORLD = 4
API = "gw-token"
FAST = {"TRAINSENTRY_PROBE_STALL_FLOOR": "2", "TRAINSENTRY_PROBE_STALL_STARTUP": "2"}


# A voice gateway for P0 escalations: each step 3 s after the last, two layers.
VOICE_TEMPLATE = '{"phone": {{ phone|tojson }}, "text": {{ text|tojson }}}'


def phone_channels() -> dict[str, Any]:
    member = {"name": "alice", "phone": "+8613800000001"}
    hook = {"url_env": "VOICE_URL", "body_template": VOICE_TEMPLATE}
    return {
        "phone": {"provider": "webhook", "webhook": hook},
        "escalation": {
            "min_priority": "P0",
            "ack_timeout_min": 0.05,
            "calls_per_layer": 2,
            "layers": [
                {"name": "primary", "members": [member]},
                {"name": "leads", "members": [member]},
            ],
        },
    }


@contextmanager
def job_with_gateway(
    tmp_path: Path, *, voice: Any = None, checkpoint_limit: float | None = None, **env: str
) -> Iterator[tuple[GlooJob, Any, Any]]:
    """A gateway (diagnosis on, the job's probes as static endpoints, a chat receiver, and
    with `voice` a phone escalation calling that receiver), then the job, whose probes post
    their triggers to it."""
    from tests.support.gateway_process import start_gateway
    from tests.support.receiver import ThreadedReceiver

    ports = {rank: free_port() for rank in range(WORLD)}
    with ThreadedReceiver() as chat:
        config = tmp_path / "gateway.yaml"
        endpoints = [f"127.0.0.1:{ports[r]}" for r in range(WORLD)]
        settings: dict[str, Any] = {
            "webhooks": {"feishu": {"url": chat.url}},
            "diagnosis": {"static_endpoints": {"team-a/llama": endpoints}},
        }
        if voice is not None:
            settings["channels"] = phone_channels()
        if checkpoint_limit is not None:
            settings["diagnosis"]["checkpoint_limit_seconds"] = checkpoint_limit
        config.write_text(yaml.safe_dump(settings))
        with start_gateway(
            tmp_path,
            f"sqlite:///{tmp_path / 'gateway.db'}",
            token=API,
            config=config,
            env={"TRAINSENTRY_PROBE_TOKEN": TOKEN, "VOICE_URL": voice.url if voice else ""},
        ) as gw:
            job = launch_job(
                tmp_path / "job",
                WORLD,
                {"TRAINSENTRY_GATEWAY_URL": gw.url, **FAST, **env},
                rank_env={
                    r: {"LOCAL_RANK": "0", "TRAINSENTRY_PROBE_PORT": str(ports[r])}
                    for r in range(WORLD)
                },
            )
            try:
                yield job, gw, chat
            finally:
                job.stop()


def cards(chat: Any) -> list[dict[str, Any]]:
    return [b["payload"] for b in chat.bodies if isinstance(b.get("payload"), dict)]


def stored(gw: Any) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{gw.url}/api/v1/alerts", headers={"Authorization": f"Bearer {API}"}, timeout=5
    )
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def stalled_at(tmp_path: Path, rank: int) -> float:
    return float((tmp_path / "job" / "ports" / f"stalled.{rank}").read_text())


def test_the_card_names_the_rank_its_pod_node_and_frame_once(tmp_path: Path) -> None:
    with job_with_gateway(tmp_path, STALL_RANK="2", STALL_STEP="5") as (job, gw, chat):
        eventually_sync(
            lambda: bool(cards(chat)),
            60,
            "the hang card",
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        arrived = time.time()
        time.sleep(3)  # the other waiting ranks' triggers arrive too: still one card
        sent, alerts = cards(chat), stored(gw)
    assert len(sent) == 1, sent
    card = sent[0]
    assert card["alertname"] == "TrainingCollectiveStalled"
    assert card["culprit_ranks"] == [2]
    diagnosis = card["diagnosis"]
    assert "rank 2 (pod llama-w-2, node node-1) never entered" in diagnosis, diagnosis
    assert "load_batch: time.sleep(1)" in diagnosis and "train_worker.py:" in diagnosis
    assert len(alerts) == 1 and alerts[0]["verdict"]["verdict"] == "hang"
    assert set(alerts[0]["verdict"]["stacks"]) == {"2"}
    # Stall -> card with a 2 s threshold: detection, trigger, dumps, stacks, analysis, send.
    assert arrived - stalled_at(tmp_path, 2) < 20


def test_two_ranks_stalled_in_different_places_are_both_named(tmp_path: Path) -> None:
    env = {"STALL_RANK": "1", "STALL_RANKS": "2", "STALL_STEP": "5"}
    with job_with_gateway(tmp_path, **env) as (job, _gw, chat):
        eventually_sync(
            lambda: bool(cards(chat)),
            60,
            "the hang card",
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        card = cards(chat)[0]
    assert card["culprit_ranks"] == [1, 2]
    diagnosis = card["diagnosis"]
    assert "rank 1 is in train_worker.py:" in diagnosis and "load_batch" in diagnosis
    assert "rank 2 is in train_worker.py:" in diagnosis and "read_shard" in diagnosis


def test_a_rank_saving_a_checkpoint_is_not_paged(tmp_path: Path) -> None:
    """No card and no call: the first call is cancelled with the card, and the escalation
    stops (its next steps, 3 s apart, would otherwise ring while the save goes on)."""
    from tests.support.receiver import ThreadedReceiver

    env = {"STALL_RANK": "2", "STALL_STEP": "3", "STALL_MODE": "save", "STALL_SECONDS": "25"}
    with (
        ThreadedReceiver() as voice,
        job_with_gateway(tmp_path, voice=voice, **env) as (
            job,
            gw,
            chat,
        ),
    ):

        def diagnosed() -> bool:
            return any(a.get("verdict") for a in stored(gw))

        eventually_sync(
            diagnosed, 60, "the stall's diagnosis", not_yet=(httpx.HTTPError,), detail=job.output
        )
        time.sleep(2)
        alerts, sent = stored(gw), cards(chat)

        def over() -> bool:  # the save ends, the barrier completes: the probes say so
            return [a["status"] for a in stored(gw)] == ["resolved"]

        eventually_sync(
            over,
            60,
            "the stall's end to resolve the alert",
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        assert cards(chat) == []
        assert voice.bodies == []
        # The pages held for the checkpoint limit (30 min) were cancelled when it ended.
        assert outbox(gw, "pending") == []
        cancelled = {(n["channel"], n["payload"].get("status")) for n in outbox(gw, "cancelled")}
        assert {("feishu", "firing"), ("phone", "firing")} <= cancelled, cancelled
    assert sent == []
    verdict = alerts[0]["verdict"]
    assert verdict["verdict"] == "checkpoint", verdict
    assert (
        "rank 2 (pod llama-w-2, node node-1) is saving a checkpoint (torch.save)"
        in (verdict["summary"])
    )


def test_a_checkpoint_past_its_limit_is_paged(tmp_path: Path) -> None:
    """Rank 2 saves for 40 s; the job's checkpoint limit is 8 s: once its peers have waited
    8 s the card and the first call go out, saying so; the save's end then resolves it."""
    from tests.support.receiver import ThreadedReceiver

    env = {"STALL_RANK": "2", "STALL_STEP": "3", "STALL_MODE": "save", "STALL_SECONDS": "40"}
    with (
        ThreadedReceiver() as voice,
        job_with_gateway(tmp_path, voice=voice, checkpoint_limit=8, **env) as (job, _gw, chat),
    ):
        eventually_sync(
            lambda: bool(cards(chat)),
            60,
            "the checkpoint's card",
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        arrived = time.time()
        eventually_sync(
            lambda: bool(voice.bodies),
            20,
            "the first call",
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        card = cards(chat)[0]
        started = stalled_at(tmp_path, 2)
    assert card["culprit_ranks"] == [2]
    assert (
        "rank 2 (pod llama-w-2, node node-1) is saving a checkpoint (torch.save) past the "
        "job's checkpoint limit (8 s); its peers still wait"
    ) in card["diagnosis"], card
    # Not before the limit (the peers began waiting at the stall), and not much after it.
    assert 8 <= arrived - started < 25, arrived - started


def outbox(gw: Any, status: str) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"{gw.url}/api/v1/notifications",
        params={"status": status},
        headers={"Authorization": f"Bearer {API}"},
        timeout=5,
    )
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def test_a_slow_job_is_not_paged(tmp_path: Path) -> None:
    """Rank 2 is 1 s late every step: its peers wait about 1 s in each all_reduce, which
    the detector learns; with a 5 s floor (factor 10: threshold 10 s) nothing is a stall."""
    env = {"SLOW_RANK": "2", "SLOW_SECONDS": "1", "TRAINSENTRY_PROBE_STALL_FLOOR": "5"}
    with job_with_gateway(tmp_path, **env) as (job, gw, chat):
        time.sleep(20)
        status = httpx.get(f"http://127.0.0.1:{job.ports[0]}/status", timeout=5).json()
        sent, alerts = cards(chat), stored(gw)
    assert status["step"] >= 10, status
    assert sent == [] and alerts == []


def test_a_hang_right_after_a_checkpoint_is_paged_naming_its_rank(tmp_path: Path) -> None:
    """Rank 0 saves for 15 s (a real torch.save into slow storage) while its peers wait;
    3 s after training resumes, rank 2 stops for good: no card during the save, then the
    card naming rank 2 within 30 s of its stall (issue 48)."""
    env = {
        "STALL_RANK": "0",
        "STALL_MODE": "save",
        "STALL_STEP": "3",
        "STALL_SECONDS": "15",
        "THEN_STALL_RANK": "2",
        "THEN_STALL_DELAY": "3",
    }
    ports = tmp_path / "job" / "ports"
    with job_with_gateway(tmp_path, **env) as (job, _gw, chat):
        eventually_sync(
            lambda: (ports / "stalled.2").exists(),
            80,
            "rank 2's stall after the checkpoint",
            detail=job.output,
        )
        during = cards(chat)

        def names_rank_2() -> bool:
            return any(c.get("culprit_ranks") == [2] for c in cards(chat))

        eventually_sync(
            names_rank_2,
            40,
            "the card naming rank 2",
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        arrived = time.time()
        sent = cards(chat)
    assert during == [], during
    assert not any("checkpoint" in str(c.get("diagnosis", "")) for c in sent), sent
    assert arrived - stalled_at(tmp_path, 2) < 30
