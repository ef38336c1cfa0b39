"""A real 4-rank gloo job with the probe: one rank stops before a collective.

The other ranks' probes (scraped over real HTTP) show the collective in flight and growing
seconds since the last completion; the stalled rank shows the lower enqueued sequence.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from probe.probe_harness import (
    TOKEN,
    GlooJob,
    free_port,
    launch_job,
    prometheus_for_job,
    scrape,
    value,
)
from tests.support.eventually import eventually_sync
from tests.support.realservers import start_prometheus
from trainsentry.gateway.stages.hang.enrichment import RankEndpoint, enrich_hang

pytestmark = [pytest.mark.torch, pytest.mark.e2e]
torch = pytest.importorskip("torch")

WORLD = 4
STALL_RANK = 2
STALL_STEP = 5
PEERS = [r for r in range(WORLD) if r != STALL_RANK]
P = "trainsentry_probe_"


@pytest.fixture(scope="module")
def stalled_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GlooJob]:
    """One 4-rank job for the module: rank 2 stops before an all_reduce; peers wait > 2 s."""
    job = launch_job(
        tmp_path_factory.mktemp("stalled"),
        WORLD,
        {"STALL_RANK": str(STALL_RANK), "STALL_STEP": str(STALL_STEP)},
    )
    try:
        eventually_sync(
            lambda: _peers_waiting(job),
            60,
            "peers to wait >2 s in a collective, the stalled rank idle",
            interval=0.2,
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        yield job
    finally:
        job.stop()


def _peers_waiting(job: GlooJob) -> bool:
    # The stalled rank's own last all_reduce must have settled as completed in its recorder too:
    # on a loaded machine gloo can retire it a moment after its peers already wait in the next.
    s = scrape(job.ports[STALL_RANK])
    if value(s, P + "inflight_seq", pg="0") != -1:
        return False
    for rank in PEERS:
        s = scrape(job.ports[rank])
        age = value(s, P + "inflight_seconds", rank=str(rank), pg="0")
        if age is None or age < 2.0:
            return False
    return True


def test_stalled_rank_shows_in_probe_metrics_and_dump(stalled_job: GlooJob) -> None:
    job = stalled_job
    peers = PEERS

    stalled = scrape(job.ports[STALL_RANK])
    stalled_enqueued = value(stalled, P + "last_enqueued_seq", pg="0")
    assert stalled_enqueued is not None
    # Each step all-reduces 2 gradients on the default group before the stall.
    assert stalled_enqueued == 2 * STALL_STEP
    assert value(stalled, P + "inflight_seq", pg="0") == -1
    assert value(stalled, P + "step") == STALL_STEP
    assert value(stalled, P + "healthy") == 1

    for rank in peers:
        s = scrape(job.ports[rank])
        labels = {"rank": str(rank), "pg": "0", "trainingjob": "llama", "namespace": "team-a"}
        assert value(s, P + "last_enqueued_seq", **labels) == stalled_enqueued + 1
        assert value(s, P + "last_completed_seq", **labels) == stalled_enqueued
        assert value(s, P + "inflight_seq", **labels) == stalled_enqueued + 1
        assert value(s, P + "inflight_info", op="all_reduce", **labels) == 1

        # Grows while the rank waits; polled, since a loaded machine may scrape it early.
        def waited_2s(port: int = job.ports[rank], labels: dict[str, str] = labels) -> bool:
            since = value(scrape(port), P + "seconds_since_last_completion", **labels)
            return since is not None and since >= 2.0

        eventually_sync(
            waited_2s,
            20,
            f"rank {rank}'s seconds_since_last_completion >= 2 s",
            interval=0.2,
            not_yet=(httpx.HTTPError,),
            detail=job.output,
        )
        assert value(s, P + "node", **labels) is None  # node is a label, not a metric
        assert value(s, P + "info", node=f"node-{rank // 2}", world_size=str(WORLD)) == 1
        # The named sub-group carries its description.
        assert value(s, P + "last_completed_seq", pg_desc="tp-0") == STALL_STEP
        waited = value(s, P + "collective_wait_seconds_total", pg="0", rank=str(rank))
        assert waited is not None and waited > 1.0

    # /dump: bearer token required, then a valid Flight Recorder JSON.
    url = f"http://127.0.0.1:{job.ports[0]}/dump"
    assert httpx.get(url, timeout=5).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
    response = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert response.status_code == 200
    assert response.headers["X-Trainsentry-Rank"] == "0"
    assert response.headers["X-Trainsentry-Pod"] == "llama-w-0"
    dump = json.loads(response.content)
    assert {"entries", "pg_status", "version"} <= set(dump)
    assert dump["pg_status"]["0"]["last_enqueued_collective"] == str(int(stalled_enqueued + 1))
    last = max(
        (e for e in dump["entries"] if e["process_group"][0] == "0"),
        key=lambda e: e["collective_seq_id"],
    )
    assert last["profiling_name"].endswith("all_reduce")
    assert last["retired"] is False

    status = httpx.get(f"http://127.0.0.1:{job.ports[1]}/status", timeout=5).json()
    assert status["rank"] == 1 and status["healthy"] is True
    assert status["process_groups"]["0"]["in_flight"]["seq"] == stalled_enqueued + 1


async def test_hang_enrichment_names_the_rank_that_never_arrived(stalled_job: GlooJob) -> None:
    endpoints = [
        RankEndpoint(f"127.0.0.1:{stalled_job.ports[rank]}", pod="hint-ignored", rank=rank)
        for rank in range(WORLD)
    ]
    # A fifth "rank" whose pod is gone: the verdict comes from the others, promptly.
    endpoints.append(RankEndpoint(f"127.0.0.1:{free_port()}", pod="llama-w-9", rank=9))
    started = time.monotonic()
    verdict = await enrich_hang("team-a/llama", endpoints, TOKEN, timeout_s=3, deadline_s=5)
    assert time.monotonic() - started < 8
    assert verdict.verdict == "hang", verdict.to_dict()
    assert verdict.culprit_ranks == (STALL_RANK,)
    assert verdict.ranks_answered == WORLD
    assert len(verdict.ranks_failed) == 1 and "llama-w-9" in verdict.ranks_failed[0]
    expected_seq = 2 * STALL_STEP + 1
    assert verdict.summary.startswith(
        f"rank {STALL_RANK} (pod llama-w-{STALL_RANK}, node node-{STALL_RANK // 2}) "
        f"never entered all_reduce #{expected_seq} of pg default_pg; 3 ranks waiting "
    ), verdict.summary
    assert verdict.summary.endswith("(1 of 5 ranks did not answer)")
    assert verdict.report is not None and verdict.report["hang"]["seq"] == expected_seq


async def test_hang_enrichment_with_a_wrong_token_says_so(stalled_job: GlooJob) -> None:
    endpoints = [RankEndpoint(f"127.0.0.1:{stalled_job.ports[r]}", rank=r) for r in range(WORLD)]
    verdict = await enrich_hang("team-a/llama", endpoints, "wrong", timeout_s=3, deadline_s=5)
    assert verdict.verdict == "unknown"
    assert verdict.ranks_answered == 0
    assert all("HTTP 401" in failure for failure in verdict.ranks_failed)


def test_tp_dp_groups_are_named_alike_on_every_rank(gloo_job: Callable[..., GlooJob]) -> None:
    """Megatron-style TP pairs and DP groups: torch's pg_status keys are rank-local ids (rank
    2's id 1 is tp-1, rank 0's is tp-0), so every series must carry the global group name.

    Rank 3 stops before its TP all_reduce: its partner rank 2 waits in tp-1 (group "2"),
    ranks 0 and 1 run on into their DP groups and wait there for ranks 2 and 3.
    """
    job = gloo_job(WORLD, LAYOUT="tpdp", STALL_RANK="3", STALL_STEP="4")
    # default "0", then tp-0 "1", tp-1 "2", dp-0 "3", dp-1 "4", in creation order.
    expect = {0: ("3", "dp-0"), 1: ("4", "dp-1"), 2: ("2", "tp-1")}

    def all_waiting() -> bool:
        for rank, (pg, desc) in expect.items():
            age = value(scrape(job.ports[rank]), P + "inflight_seconds", pg=pg, pg_desc=desc)
            if age is None or age < 1.0:
                return False
        return True

    eventually_sync(
        all_waiting,
        60,
        "ranks 0-2 to wait in their own groups",
        interval=0.2,
        not_yet=(httpx.HTTPError,),
        detail=job.output,
    )
    for rank, (pg, desc) in expect.items():
        samples = scrape(job.ports[rank])
        assert value(samples, P + "inflight_info", pg=pg, pg_desc=desc, op="all_reduce") == 1
        status = httpx.get(f"http://127.0.0.1:{job.ports[rank]}/status", timeout=5).json()
        in_flight = {n: g["pg_desc"] for n, g in status["process_groups"].items() if g["in_flight"]}
        assert in_flight == {pg: desc}, status
    stalled = scrape(job.ports[3])
    partner = scrape(job.ports[2])
    behind = value(stalled, P + "last_enqueued_seq", pg="2", pg_desc="tp-1")
    assert behind is not None
    assert value(partner, P + "last_enqueued_seq", pg="2", pg_desc="tp-1") == behind + 1
    # Every rank's groups are the ones it belongs to, by their global names.
    for rank in range(WORLD):
        status = httpx.get(f"http://127.0.0.1:{job.ports[rank]}/status", timeout=5).json()
        names = {n: g["pg_desc"] for n, g in status["process_groups"].items()}
        tp_name, dp_name = str(1 + rank // 2), str(3 + rank % 2)
        assert names == {tp_name: f"tp-{rank // 2}", dp_name: f"dp-{rank % 2}"}, (rank, names)


def test_real_prometheus_fires_hang_and_names_the_stalled_rank(
    stalled_job: GlooJob, tmp_path: Path
) -> None:
    """The shipped rules, rendered for the job with short thresholds, on a real Prometheus."""
    config, rule_files = prometheus_for_job(stalled_job, tmp_path)
    with start_prometheus(tmp_path, config, rule_files) as prom:
        alerts: list[dict[str, Any]] = []

        def firing() -> bool:
            nonlocal alerts
            data = httpx.get(f"{prom.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
            alerts = [a for a in data if a["state"] == "firing"]
            names = {a["labels"]["alertname"] for a in alerts}
            return {"TrainingJobHang", "TrainingRankStalledBehindPeers"} <= names

        eventually_sync(
            firing,
            30,
            "hang and stalled-rank alerts to fire",
            interval=0.2,
            not_yet=(httpx.HTTPError,),
            detail=stalled_job.output,
        )
    stalled = [a for a in alerts if a["labels"]["alertname"] == "TrainingRankStalledBehindPeers"]
    assert [a["labels"]["rank"] for a in stalled] == [str(STALL_RANK)]
    assert stalled[0]["labels"]["pod"] == f"llama-w-{STALL_RANK}"
    assert stalled[0]["labels"]["trainingjob"] == "llama"
    hang = next(a for a in alerts if a["labels"]["alertname"] == "TrainingJobHang")
    assert hang["labels"]["pg"] == "0" and hang["labels"]["priority"] == "P0"
    assert hang["annotations"]["thresholds"] == "hang_seconds=3"


def _is_page(payload: dict[str, Any]) -> bool:
    """The job's P0 card: the hang alert's own, or the job incident's that the hang joined
    (TrainingRankStalledBehindPeers, P1, may reach the gateway first and lead the incident;
    the hang makes it P0 and the card carries the hang's diagnosis)."""
    return payload.get("priority") == "P0" and payload.get("alertname") in (
        "TrainingJobHang",
        "TrainingRankStalledBehindPeers",
    )


def test_hang_page_through_alertmanager_and_gateway_names_the_stalled_rank(
    stalled_job: GlooJob, tmp_path: Path
) -> None:
    """The whole loop: probes → Prometheus (hang fires) → Alertmanager → gateway, which
    fetches every rank's dump, stores the verdict and sends the page naming rank 2."""
    from tests.support.gateway_process import start_gateway
    from tests.support.realservers import start_alertmanager
    from tests.support.receiver import ThreadedReceiver

    gateway_token = "gw-token"
    with ThreadedReceiver() as chat:
        config_file = tmp_path / "gateway.yaml"
        config_file.write_text(
            yaml.safe_dump(
                {
                    "webhooks": {"feishu": {"url": chat.url}},
                    "diagnosis": {
                        "static_endpoints": {
                            "team-a/llama": [
                                f"127.0.0.1:{stalled_job.ports[r]}" for r in range(WORLD)
                            ]
                        },
                    },
                }
            )
        )
        db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
        env = {"TRAINSENTRY_PROBE_TOKEN": TOKEN}
        with start_gateway(
            tmp_path, db_url, token=gateway_token, config=config_file, env=env
        ) as gw:
            am_config = {
                "route": {
                    "receiver": "gateway",
                    "group_by": ["alertname", "trainingjob"],
                    "group_wait": "0s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {
                        "name": "gateway",
                        "webhook_configs": [
                            {
                                "url": f"{gw.url}/api/v1/alertmanager",
                                "send_resolved": True,
                                "http_config": {"authorization": {"credentials": gateway_token}},
                            }
                        ],
                    }
                ],
            }
            with start_alertmanager(tmp_path, am_config) as am:
                config, rule_files = prometheus_for_job(stalled_job, tmp_path, am.address)
                with start_prometheus(tmp_path, config, rule_files):

                    def paged() -> bool:
                        return any(_is_page(b["payload"]) for b in chat.bodies)

                    def detail() -> str:  # what the chain did, when the page never came
                        sent = [b["payload"].get("alertname") for b in chat.bodies]
                        return f"chat got {sent}\n{gw.logs()[-6000:]}\n{stalled_job.output()}"

                    eventually_sync(
                        paged, 90, "the hang page at the chat channel", interval=0.2,
                        not_yet=(httpx.HTTPError,), detail=detail,
                    )  # fmt: skip
            page = next(b for b in chat.bodies if _is_page(b["payload"]))
            headers = {"Authorization": f"Bearer {gateway_token}"}
            stored = httpx.get(
                f"{gw.url}/api/v1/alerts?priority=P0", headers=headers, timeout=5
            ).json()["items"]
    diagnosis = page["payload"].get("diagnosis", "")
    assert f"rank {STALL_RANK}" in diagnosis, page["payload"]
    assert page["payload"]["culprit_ranks"] == [STALL_RANK]
    hang = next(a for a in stored if a["alertname"] == "TrainingJobHang")
    assert hang["verdict"]["verdict"] == "hang"
    assert hang["verdict"]["culprit_ranks"] == [STALL_RANK]
