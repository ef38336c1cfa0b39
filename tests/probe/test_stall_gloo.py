"""Real 4-rank gloo jobs: the probe's fast hang path and what a rank is doing.

- Rank 2 stops in its data loader before an all_reduce its peers enter: every waiting
  rank posts one trigger for that collective to the gateway URL, rank 2 none; rank 2's
  `/stack` names the frame it is stuck in.
- Rank 2 writes a checkpoint (a real `torch.save`, or a marked phase) while its peers wait
  in a barrier: its `/stack` and `/status` say "checkpoint".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from probe.probe_harness import TOKEN, GlooJob
from probe.test_trigger import Gateway
from tests.support.eventually import eventually_sync
from trainsentry.probe.trigger import TRIGGER_PATH

pytestmark = [pytest.mark.torch, pytest.mark.e2e]
torch = pytest.importorskip("torch")

WORLD = 4
STALLED = 2
FAST = {"TRAINSENTRY_PROBE_STALL_FLOOR": "2", "TRAINSENTRY_PROBE_STALL_STARTUP": "2"}


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    yield server
    server.close()


def get(job: GlooJob, rank: int, path: str, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"http://127.0.0.1:{job.ports[rank]}{path}", headers=headers, timeout=5)


def test_waiting_ranks_post_one_trigger_each_and_the_stack_names_the_stalled_frame(
    gloo_job: Callable[..., GlooJob], gateway: Gateway
) -> None:
    job = gloo_job(
        WORLD,
        STALL_RANK=str(STALLED),
        STALL_STEP="5",
        TRAINSENTRY_GATEWAY_URL=gateway.url,
        **FAST,
    )
    peers = {r for r in range(WORLD) if r != STALLED}

    def hung() -> list[dict[str, Any]]:
        """Triggers of the collective rank 2 never entered (on a loaded machine an earlier
        collective may pass the test's 2 s threshold too, and then end)."""
        firing = [b for _, _, b in gateway.seen if not b.get("resolved")]
        last = max((b["seq"] for b in firing), default=-1)
        return [b for b in firing if b["seq"] == last]

    eventually_sync(
        lambda: {b["rank"] for b in hung()} >= peers,
        60,
        "triggers",
        not_yet=(httpx.HTTPError,),
        detail=job.output,
    )
    time.sleep(2.0)  # several more polls: nobody posts the same collective twice
    bodies = hung()
    assert {path for path, _, _ in gateway.seen} == {TRIGGER_PATH}
    assert {auth for _, auth, _ in gateway.seen} == {f"Bearer {TOKEN}"}
    assert sorted(b["rank"] for b in bodies) == sorted(peers), bodies
    assert len({(b["pg"], b["seq"]) for b in bodies}) == 1, bodies
    first = bodies[0]
    # The stalled rank never posts the collective it never entered (on a loaded machine one
    # of its earlier collectives may pass the 2 s threshold too, and then end).
    assert all(b["seq"] < first["seq"] for _, _, b in gateway.seen if b["rank"] == STALLED)
    assert first["namespace"] == "team-a" and first["trainingjob"] == "llama"
    assert first["pg_desc"] == "default_pg" and first["waited_s"] >= first["threshold_s"] >= 2
    assert {b["pod"] for b in bodies} == {f"llama-w-{r}" for r in peers}

    status = get(job, 0, "/status").json()
    assert [s["seq"] for s in status["stalls"]] == [first["seq"]]
    ended = [b for _, _, b in gateway.seen if b.get("resolved")]
    assert all(b["seq"] < first["seq"] for b in ended), ended  # only earlier ones ended
    assert status["process_groups"][first["pg"]]["stall_threshold_seconds"] >= 2

    assert get(job, STALLED, "/stack", token=None).status_code == 401
    assert get(job, STALLED, "/stack", token="wrong").status_code == 401
    stack = get(job, STALLED, "/stack").json()
    main = stack["threads"][0]
    assert main["main"] is True and stack["rank"] == STALLED and stack["phase"] is None
    mine = [f for f in main["frames"] if not f["library"]]
    assert [f["function"] for f in mine[-2:]] == ["main", "load_batch"], mine
    assert mine[-1]["file"].endswith("train_worker.py")
    assert mine[-1]["code"] == "time.sleep(1)"


@pytest.mark.parametrize("mode", ["save", "phase"])
def test_a_rank_writing_a_checkpoint_says_so(gloo_job: Callable[..., GlooJob], mode: str) -> None:
    job = gloo_job(
        WORLD, STALL_RANK=str(STALLED), STALL_STEP="3", STALL_MODE=mode, STALL_SECONDS="8"
    )
    seen: dict[str, object] = {}

    def saving() -> bool:
        answer = get(job, STALLED, "/stack")
        assert answer.status_code == 200, (answer.status_code, answer.text)
        seen["stack"] = answer.json()
        return seen["stack"]["phase"] is not None  # type: ignore[index]

    eventually_sync(
        saving, 60, "the checkpoint phase", not_yet=(httpx.HTTPError,), detail=job.output
    )
    phase = seen["stack"]["phase"]  # type: ignore[index]
    assert phase["name"] == "checkpoint"
    assert phase["source"] == ("stack" if mode == "save" else "marked")
    status = get(job, STALLED, "/status").json()
    assert (status["phase"] or {}).get("name") == "checkpoint"
    if mode == "save":
        frames = seen["stack"]["threads"][0]["frames"]  # type: ignore[index]
        assert any(f["file"].endswith("torch/serialization.py") for f in frames)
