"""Issue 37 through a real gateway: a node's death is one incident that tells its story.

The webhooks are what Alertmanager sends (webhook v4, the shipped route's groupKeys:
webhook_factory.am_group_key) for the issue's scenario: GPU 3 of gpu-node-05 falls off the
bus (XID 79; the cluster-wide alert and its job-scoped copy, both let through at
`group_wait: 0s`), the node dies, the GPU alert resolves only because the node's series
went stale, the exporters' `up` alerts and KubeNodeNotReady follow, NCCL RAS declares the
job's processes dead and ranks missing, the 8 probes on the node are down, the job hangs.
Time is compressed (the webhooks come in order, a fraction of a second apart; the
resolution's confirmation and the follow-up interval are seconds). Feishu (a bot group) and
the phone provider are the contract servers (tests/support/), the escalation is
docs/channels.md's example.

The real Prometheus + Alertmanager chain of the same scenario is tests/e2e/test_node_death.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import start_gateway
from tests.support.paging_config import VOICE_KEY, write_paging_config
from tests.support.phone_server import PhoneContractServer
from tests.support.webhook_factory import am_group_key, encode, make_body
from trainsentry.gateway.api.app import WEBHOOK_PATH

pytestmark = pytest.mark.e2e
TOKEN = "correlation-token"
NODE = "gpu-node-05"
JOB = {"namespace": "ml", "trainingjob": "llama-70b"}
CONFIRM_S = 4  # policy.correlation.confirm_resolved for the test (300 s shipped)


def alert(
    name: str,
    labels: dict[str, str],
    started: datetime,
    *,
    status: str = "firing",
    ends: datetime | None = None,
) -> dict[str, Any]:
    """One alert as Alertmanager's webhook carries it; the fingerprint from its labels."""
    full = {"alertname": name, **labels}
    fingerprint = f"{abs(hash(tuple(sorted(full.items())))) % 16**16:016x}"
    end = ends if status == "resolved" else None
    return {
        "status": status,
        "labels": full,
        "annotations": {"summary": f"{name} on {labels.get('node', '')}", "description": "t"},
        "startsAt": started.isoformat().replace("+00:00", "Z"),
        "endsAt": end.isoformat().replace("+00:00", "Z") if end else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.local/graph",
        "fingerprint": fingerprint,
    }


def body(*alerts: dict[str, Any]) -> dict[str, Any]:
    return make_body(list(alerts), group_key=am_group_key(alerts[0]["labels"]))


GPU = {"priority": "P0", "component": "gpu", "node": NODE, "gpu": "3", "xid": "79"}
NOT_READY = {"priority": "P0", "component": "kubernetes", "node": NODE}


def gpu_alerts(started: datetime, status: str = "firing") -> list[dict[str, Any]]:
    """The cluster-wide GPUFellOffBus and its job-scoped copy."""
    ends = started + timedelta(seconds=67)
    return [
        alert("GPUFellOffBus", GPU, started, status=status, ends=ends),
        alert("GPUFellOffBus", {**GPU, **JOB}, started, status=status, ends=ends),
    ]


def node_down(started: datetime, status: str = "firing") -> list[dict[str, Any]]:
    """What a dead node raises about itself (and its job's copy of NotReady)."""
    ends = started + timedelta(minutes=5)
    labels = {"node": NODE, "priority": "P1"}
    return [
        alert(
            "NodeExporterDown", {**labels, "component": "node"}, started, status=status, ends=ends
        ),
        alert(
            "DCGMExporterDown", {**labels, "component": "gpu"}, started, status=status, ends=ends
        ),
        alert("KubeNodeNotReady", NOT_READY, started, status=status, ends=ends),
        alert("KubeNodeNotReady", {**NOT_READY, **JOB}, started, status=status, ends=ends),
    ]


def probes(started: datetime) -> list[dict[str, Any]]:
    """TrainingProbeDown of the 8 ranks on the node (one pod per rank, ranks 40-47)."""
    return [
        alert(
            "TrainingProbeDown",
            {
                **JOB,
                "priority": "P2",
                "component": "training",
                "node": NODE,
                "pod": f"llama-70b-worker-{rank}",
                "instance": f"10.0.5.{rank}:9400",
                "job": "ml/llama-70b-trainsentry-probe",
            },
            started,
        )
        for rank in range(40, 48)
    ]


def job_alert(name: str, priority: str, started: datetime, **labels: str) -> dict[str, Any]:
    return alert(name, {**JOB, "priority": priority, "component": "training", **labels}, started)


def write_config(tmp_path: Path, bot_url: str, voice_url: str) -> tuple[Path, dict[str, str]]:
    policy = {
        "grouping": {"follow_up_interval": 5, "url": "https://ts.example/incidents/{incident}"},
        "correlation": {"confirm_resolved": CONFIRM_S},
        # the GPU fires, resolves (stale), fires, resolves: with the shipped 4
        # transitions that is flapping, whose resolution is held 10 minutes
        "dedup": {"flap_transitions": 6},
    }
    escalation = {  # docs/channels.md's example
        "min_priority": "P0",
        "ack_timeout_min": 5,
        "calls_per_layer": 2,
        "layers": [
            {
                "name": "primary",
                "rotation_start": "2026-11-02T09:00:00Z",
                "shift_hours": 168,
                "members": [
                    {"name": "alice", "phone": "+8613800000001"},
                    {"name": "bob", "phone": "+8613800000002"},
                ],
            },
            {"name": "leads", "members": [{"name": "carol", "phone": "+8613800000003"}]},
        ],
    }
    return write_paging_config(
        tmp_path,
        token=TOKEN,
        policy=policy,
        groups={"oncall": {"priorities": ["P0", "P1", "P2"], "url_env": "BOT_URL"}},
        voice_url=voice_url,
        escalation=escalation,
        env={"BOT_URL": bot_url},
    )


async def until(check: Callable[[], Any], within: float, what: str) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if found := check():
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {within} s waiting for {what}")


def cards(feishu: FeishuContractServer) -> list[tuple[str, str]]:
    """(title, the whole card as text) of each card the bot group got, in order."""
    return [
        (b["card"]["header"]["title"]["content"], json.dumps(b["card"], ensure_ascii=False))
        for _, b in feishu.accepted["oncall"]
    ]


class Scenario:
    """A gateway with a Feishu bot group and the phone provider; posts webhooks."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.feishu = FeishuContractServer(hooks={"oncall": Hook()})
        self.phones = PhoneContractServer(gateway_token=VOICE_KEY)

    async def run(self, steps: Callable[[Callable[[dict[str, Any]], Any]], Any]) -> None:
        async with self.feishu, self.phones:
            config, env = write_config(
                self.tmp_path,
                self.feishu.hook_url("oncall"),
                f"{self.phones.base_url}/voice/call",
            )
            db = f"sqlite:///{self.tmp_path / 'store.db'}"
            gateway = await asyncio.to_thread(
                start_gateway, self.tmp_path, db, config=config, env=env
            )
            url = f"{gateway.url}{WEBHOOK_PATH}"
            try:
                async with aiohttp.ClientSession(
                    headers={"Authorization": f"Bearer {TOKEN}"}
                ) as http:

                    async def post(payload: dict[str, Any]) -> None:
                        async with http.post(url, data=encode(payload)) as response:
                            assert response.status == 200, await response.text()

                    await steps(post)
                self.calls = list(self.phones.gateway_calls)
            finally:
                await asyncio.to_thread(gateway.stop)

    def report(self, label: str) -> list[tuple[str, str]]:
        got = cards(self.feishu)
        titles = [t for t, _ in got]
        print(f"{label}: feishu_bot {len(got)} messages {titles}; calls {len(self.calls)}")
        return got


async def node_death(post: Callable[[dict[str, Any]], Any], now: datetime) -> None:
    """The scenario's webhooks, in the order Alertmanager sends them."""
    for one in gpu_alerts(now):  # +0 s: each copy in its own group, both let through
        await post(body(one))
    await asyncio.sleep(1.0)
    for one in gpu_alerts(now, status="resolved"):  # +67 s: the dead node's series went stale
        await post(body(one))
    await asyncio.sleep(0.5)
    await post(body(job_alert("NCCLRasDeadProcesses", "P0", now + timedelta(seconds=80))))
    for one in node_down(now + timedelta(seconds=161)):
        await post(body(one))
    await post(body(job_alert("NCCLRasMissingRanks", "P1", now + timedelta(seconds=200))))
    await post(body(*probes(now + timedelta(seconds=320))))
    await asyncio.sleep(0.5)
    await post(body(job_alert("TrainingJobHang", "P0", now + timedelta(seconds=337), pg="0")))


async def test_a_dead_node_is_one_incident_one_page_and_its_gpu_is_not_resolved(
    tmp_path: Path,
) -> None:
    scenario = Scenario(tmp_path)
    now = datetime.now(UTC).replace(microsecond=0)

    async def steps(post: Callable[[dict[str, Any]], Any]) -> None:
        started = time.monotonic()
        await node_death(post, now)
        first = await until(lambda: cards(scenario.feishu), 10, "the first card")
        assert NODE in first[0][1], "the first message names the node"
        # longer than the confirmation and a follow-up interval: nothing more is owed
        await asyncio.sleep(max(0.0, 2 * CONFIRM_S + 3 - (time.monotonic() - started)))
        await until(lambda: len(scenario.phones.gateway_calls) >= 1, 10, "the page")

    await scenario.run(steps)
    got = scenario.report("node death")
    assert len(got) <= 5, [t for t, _ in got]
    assert len(scenario.calls) == 1, "one paged incident, its first call (no repeat yet)"
    assert not [t for t, _ in got if "RESOLVED" in t], "no RESOLVED while the node is dead"
    hang = [text for _, text in got if "hung" in text]
    assert hang, "a card tells the job's hang"
    assert "llama-70b-worker-40" in hang[-1] and NODE in hang[-1], "it names the gone ranks"
    assert "fell off the bus" in got[0][1], "the first card is about the root cause"
    assert scenario.feishu.rejections == []


async def test_a_node_back_with_its_gpu_missing_stays_open_then_resolves_once(
    tmp_path: Path,
) -> None:
    scenario = Scenario(tmp_path)
    now = datetime.now(UTC).replace(microsecond=0)

    async def steps(post: Callable[[dict[str, Any]], Any]) -> None:
        await node_death(post, now)
        await until(lambda: cards(scenario.feishu), 10, "the first card")
        # the node comes back: exporters answer, NotReady clears; the GPU is still missing
        back = now + timedelta(minutes=6)
        for one in node_down(now + timedelta(seconds=161), status="resolved"):
            await post(body(one))
        # the job restarts without the node's ranks: its alerts resolve
        for name, prio, after in (
            ("NCCLRasDeadProcesses", "P0", 80),
            ("NCCLRasMissingRanks", "P1", 200),
            ("TrainingJobHang", "P0", 337),
        ):
            extra = {"pg": "0"} if name == "TrainingJobHang" else {}
            gone = job_alert(name, prio, now + timedelta(seconds=after), **extra)
            gone["status"], gone["endsAt"] = "resolved", gone["startsAt"]
            await post(body(gone))
        gone_probes = probes(now + timedelta(seconds=320))
        for one in gone_probes:
            one["status"], one["endsAt"] = "resolved", one["startsAt"]
        await post(body(*gone_probes))
        for one in gpu_alerts(back):
            await post(body(one))
        await asyncio.sleep(CONFIRM_S + 2)
        assert not [t for t, _ in cards(scenario.feishu) if "RESOLVED" in t], (
            "the incident stays open on the GPU"
        )
        for one in gpu_alerts(back, status="resolved"):  # the GPU returns
            await post(body(one))
        await until(
            lambda: [t for t, _ in cards(scenario.feishu) if "RESOLVED" in t],
            3 * CONFIRM_S + 10,
            f"the resolution: {cards(scenario.feishu)[-1][1]}",
        )
        await asyncio.sleep(2)

    await scenario.run(steps)
    got = scenario.report("node back")
    resolved = [t for t, _ in got if "RESOLVED" in t]
    assert len(resolved) == 1, resolved
    assert len(scenario.calls) == 1
