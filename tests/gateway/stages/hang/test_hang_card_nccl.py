"""The hang card on the real NCCL dumps in tests/fixtures/nccl (H100, torch 2.11, NCCL 2.28.9).

Each rank's dump goes through the gateway's `diagnose` as its probe serves it (the watchdog's
Flight Recorder, as JSON), with the probe's capture time: the card's sentence must name the
rank to blame, its pod and node, for the three NCCL hang classes: a rank that never entered
the collective, a pipeline stage that never posted its send/recv, and a rank whose GPU never
started a collective every rank enqueued (TORCH_NCCL_ENABLE_TIMING=1).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support.nccl_artifacts import watchdog_dump
from trainsentry.gateway.stages.hang.enrichment import FetchResult, RankEndpoint, diagnose

WORLD = 4


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return value.decode("latin-1")
    if isinstance(value, set | tuple):
        return list(value)
    return str(value)


def _latest_ns(dump: dict[str, Any]) -> int:
    return max(int(e.get("time_created_ns") or 0) for e in dump.get("entries") or [{}])


def _fetched(case: str, after_s: int) -> list[FetchResult]:
    """Every rank's dump, taken `after_s` seconds after the job's last recorded entry."""
    dumps = [watchdog_dump(case, r) for r in range(WORLD)]
    captured = max(_latest_ns(d) for d in dumps) + after_s * 10**9
    return [
        FetchResult(
            RankEndpoint(f"10.0.0.{r}:9401"),
            r,
            f"llama-w-{r}",
            f"gpu-0{r}",
            json.dumps(d, default=_plain).encode(),
            captured_ns=captured,
        )
        for r, d in enumerate(dumps)
    ]


def _waiting(summary: str) -> tuple[int, int]:
    found = re.search(r"(\d+) ranks? waiting (\d+) s", summary)
    assert found, summary
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize(
    ("case", "culprit", "phrase", "waiting"),
    [
        ("hang", 2, "never entered all_reduce #20 of pg default_pg", 3),
        (
            "pp",
            2,
            "never posted its side of a send/recv: rank 1 waits in send to 2, "
            "rank 3 waits in recv from 2",
            2,
        ),
        (
            "compute_timing",
            3,
            "never started all_reduce #20 of pg default_pg (every rank enqueued it; "
            "the GPU is stuck in earlier work)",
            3,
        ),
    ],
)
def test_the_nccl_hang_card_names_the_rank_its_pod_and_node(
    case: str, culprit: int, phrase: str, waiting: int
) -> None:
    verdict = diagnose("team-a/llama", _fetched(case, after_s=90))
    assert verdict.verdict == "hang"
    assert verdict.culprit_ranks == (culprit,)
    who = f"rank {culprit} (pod llama-w-{culprit}, node gpu-0{culprit})"
    assert verdict.summary.startswith(f"{who} {phrase}"), verdict.summary
    ranks_waiting, waited_s = _waiting(verdict.summary)
    assert ranks_waiting == waiting
    # Measured against the probe's capture time, not the analysis clock (months later).
    assert 60 <= waited_s <= 600, verdict.summary
