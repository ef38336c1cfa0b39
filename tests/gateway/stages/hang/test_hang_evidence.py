"""What a job's triggers say (`hang_evidence`) at the cost a 16,384-rank job allows: the
endpoints' addresses read without `urlsplit` where they are plain (the same answers), the
snapshot rebuilt only when a trigger changed something, and the static endpoints built
once per job."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from trainsentry.alerts import JobRef
from trainsentry.gateway.stages.hang.diagnosis import StaticEndpoints
from trainsentry.gateway.stages.hang.evidence import JobEvidence, Waiter, host_port


def by_urlsplit(url: str) -> tuple[str, int]:
    split = urlsplit(url)
    try:
        return split.hostname or "", split.port or 0
    except ValueError:
        return split.hostname or "", 0


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.7:9401",
        "http://10.0.0.7:9401/",
        "https://Gpu-7.Example:443/x",
        "http://h_1:80",
        "http://h:0",
        "http://h:65535",
        "http://h:65536",
        "http://h:99999",
        "http://h:08",
        "http://[::1]:9401",
        "http://user@h:80",
        "http://h:80?x=1",
        "http://h:80#f",
        "http://h",
        "http://:80",
        "http://h:+80",
        "http://\nh:80",
        "HTTP://h:80",
        "ftp://h:21",
        "h:80",
        "",
    ],
)
def test_host_port_reads_what_urlsplit_reads(url: str) -> None:
    assert host_port(url) == by_urlsplit(url)


def note(evidence: JobEvidence, rank: int, seq: int) -> None:
    evidence.note(
        pg="1",
        seq=seq,
        pg_desc="tp",
        op="all_reduce",
        since=100.0,
        members="0-7",
        waiter=Waiter(rank, "10.0.0.1", 9401 + rank),
        world_size=8,
    )


def test_the_snapshot_is_rebuilt_only_when_a_trigger_changed_it() -> None:
    evidence = JobEvidence(first_at=100.0)
    note(evidence, 0, 5)
    note(evidence, 1, 6)
    first = evidence.snapshot()
    assert evidence.snapshot() is first  # nothing new: the same copy
    note(evidence, 2, 6)
    second = evidence.snapshot()
    assert second is not first and set(second.waiters) == {0, 1, 2}
    (five,) = [k for k in second.keys if k.seq == 5]
    assert five is next(k for k in first.keys if k.seq == 5)  # the unchanged key is reused
    (six,) = [k for k in second.keys if k.seq == 6]
    assert set(six.waiting) == {1, 2} and set(
        next(k for k in first.keys if k.seq == 6).waiting
    ) == {1}  # the copy taken before stays as it was
    evidence.ended("1", 5)
    assert [k.seq for k in evidence.snapshot().keys] == [6]


async def test_static_endpoints_are_built_once_per_configured_job() -> None:
    static = StaticEndpoints({"ns/job": ["10.0.0.1:9401", "10.0.0.2:9401"], "bare": ["h:1"]})
    first = await static(JobRef("ns", "job"))
    assert await static(JobRef("ns", "job")) is first and len(first.endpoints) == 2
    assert (await static(JobRef("other", "bare"))).endpoints[0].address == "h:1"
    unknown = await static(JobRef("ns", "unknown"))
    assert unknown.endpoints == () and await static(JobRef("ns", "unknown")) is not unknown
