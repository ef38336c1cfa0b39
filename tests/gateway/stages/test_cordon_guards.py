"""Cordon guards against forged and flooded alerts (issue 32 finding 4), end to end through
the real gateway, the kmock emulator with the real TrainingJob CRD, a real Prometheus (what
it fired is the evidence) and Feishu's contract server. Each test failed on the code before:
the forged alerts got a card that Approve cordoned, the job-label-less alerts cordoned half
of ml/small, the flood sent 300 cards, and ou_mallory's press cordoned."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from tests.gateway.stages.cordon_harness import (
    ONCALL,
    VERIFICATION,
    Start,
    emulated_cluster,
    fault,
    gateways,
    list_nodes,
    unschedulable,
)
from tests.rules.fixture_exporter import make_app as make_exporter
from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer
from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from tests.support.realservers import logs_on_error, start_alertmanager, start_prometheus
from trainsentry.assets import rules_dir
from trainsentry.config import ConfigError, Settings, validate_settings
from trainsentry.gateway.api.app import WEBHOOK_PATH
from trainsentry.gateway.channels import build
from trainsentry.gateway.sections import cordon_approvers_of
from trainsentry.notifiers.feishu.card import CardOptions, build_card
from trainsentry.notifiers.payload_contract import parse_payload

pytestmark = pytest.mark.e2e  # a real Prometheus per gateway (the evidence)


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with emulated_cluster() as emu:
        yield emu


@pytest.fixture
async def start(cluster: KubeEmulator, tmp_path: Path, db_url: str) -> AsyncIterator[Start]:
    async with gateways(cluster, tmp_path, db_url) as run:
        yield run


def falls(node: str, gpus: range, first: int, job: str | None = None) -> list[dict[str, object]]:
    """GPUs of `node` falling off the bus half an hour ago, as the shipped rule's alerts."""
    return [fault(first + gpu, node, job, 0.5, gpu=str(gpu), xid="79") for gpu in gpus]


def copy_of(alert: dict[str, Any], fingerprint: str, seconds: float = 0, **labels: str) -> Any:
    """The alert again, as someone posting to Alertmanager would forge it."""
    at = datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00"))
    starts = (at + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")
    return {
        **alert,
        "labels": {**alert["labels"], **labels},
        "fingerprint": fingerprint,
        "startsAt": starts,
    }


async def test_forged_hardware_alerts_do_not_cordon(cluster: KubeEmulator, start: Start) -> None:
    """Prometheus fired one GPUFellOffBus on gpu-node-3 (GPU 0). Posted with it: three with
    other `gpu` labels, a copy with one more label and a copy a second later (6 alerts, 36,
    over the threshold of 20). Only the real one counts (6): no card, and a press of Approve
    cordons nothing."""
    [real] = falls("gpu-node-3", range(1), 100)
    running = await start(threshold=20, max_job_share=1, fired=[real])
    forged = [
        *falls("gpu-node-3", range(1, 4), 101),
        copy_of(real, "f0f0f0f0f0f0f001", forged="1"),
        copy_of(real, "f0f0f0f0f0f0f002", seconds=1),
    ]
    await running.post(real, *forged)
    assert running.gateway.cordon is not None
    await running.gateway.cordon.run_once()
    assert running.cards() == []
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-3"}, "ev-forged")
    assert "nothing to decide" in answer
    assert not unschedulable(cluster, "gpu-node-3")
    # the same six alerts, all fired by Prometheus: a card (the evidence was what was missing)
    again = await start(replica="b", threshold=20, max_job_share=1, fired=[real, *forged])
    assert again.gateway.cordon is not None
    await again.gateway.cordon.run_once()
    await eventually(lambda: again.cards())
    [card] = again.cards()
    # five of the six: the copy a second later is the same firing as the real one
    assert card["cordon"]["nodes"][0]["faults"] == {"fell_off_bus": 5}


async def test_a_teams_own_hardware_alerts_recommend_no_cordon(
    cluster: KubeEmulator, start: Start
) -> None:
    """Issue 43: a team writes its own PrometheusRule (prometheus-operator gives its alerts
    its namespace) raising `GPUFellOffBus{node="gpu-node-2"}` for four GPUs of a node it
    does not run on; Prometheus did fire them (36, over the threshold of 20). Only trusted
    evidence (the chart's cluster-wide rules: no namespace) counts: no card, and a press of
    Approve cordons nothing. Failed before: a card, and the press cordoned gpu-node-2."""
    forged = falls("gpu-node-2", range(4), 150, job="decoy")
    assert all(alert["labels"]["namespace"] == "ml" for alert in forged)
    running = await start(threshold=20, max_job_share=1, fired=forged)
    await running.post(*forged)
    assert running.gateway.cordon is not None
    assert await running.gateway.cordon.run_once() == []
    assert running.cards() == []
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-2"}, "ev-team")
    assert "nothing to decide" in answer
    assert not unschedulable(cluster, "gpu-node-2")


async def test_the_share_guard_reads_the_trainingjobs_without_job_labels(
    cluster: KubeEmulator, start: Start
) -> None:
    """ml/small runs on gpu-node-6 and gpu-node-7 (its status.nodes); the alerts of the
    cluster-wide rules name no job. Cordoning gpu-node-6 would be half of small."""
    await list_nodes(cluster, "small", ["gpu-node-6", "gpu-node-7"])
    sick = falls("gpu-node-6", range(4), 200)
    running = await start(threshold=20, max_job_share=0.25, fired=sick)
    await running.post(*sick)
    [card] = running.cards()
    [node] = card["cordon"]["nodes"]
    assert node["jobs"] == ["ml/big", "ml/small"]  # the jobs the cluster lists on it
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-6"}, "ev-share")
    assert "job ml/small would have 1 of its 2 nodes cordoned" in answer, answer
    assert not unschedulable(cluster, "gpu-node-6")


async def test_only_configured_approvers_decide(cluster: KubeEmulator, start: Start) -> None:
    """remediation.approvers is [alice] (ou_alice in oncall.people); bob is on call, but no
    approver; ou_mallory is nobody we know."""
    sick = falls("gpu-node-4", range(4), 300)
    running = await start(threshold=20, max_job_share=1, fired=sick)
    await running.post(*sick)
    assert len(running.cards()) == 1
    value = {"action": "cordon_approve", "node": "gpu-node-4"}
    answer = await running.press_answer(value, "ev-mallory", who="ou_mallory")
    assert answer["toast"]["type"] == "error"
    assert "ou_mallory may not decide cordons" in answer["toast"]["content"]
    assert "card" not in answer  # the card keeps its buttons for an approver
    assert not unschedulable(cluster, "gpu-node-4")
    dismiss = {"action": "cordon_dismiss", "node": "gpu-node-4"}
    assert "ou_bob may not decide" in await running.press(dismiss, "ev-bob", who="ou_bob")
    answer = await running.press_answer(value, "ev-alice", who="ou_alice")
    assert answer["toast"]["content"] == "gpu-node-4: cordoned"
    assert "by alice" in json.dumps(answer["card"]["data"])
    assert unschedulable(cluster, "gpu-node-4")


async def test_without_approvers_the_card_has_no_buttons(start: Start) -> None:
    sick = falls("gpu-node-5", range(4), 400)
    running = await start(threshold=20, max_job_share=1, approvers=[], fired=sick)
    await running.post(*sick)
    [card] = running.cards()
    assert card["cordon"]["approvable"] is False
    drawn = json.dumps(build_card("cordon", parse_payload(card), CardOptions(actions=True)))
    assert "cordon_approve" not in drawn and "kubectl cordon gpu-node-5" in drawn
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-5"}, "ev-x")
    assert "ou_alice may not decide cordons" in answer


async def test_an_unreachable_prometheus_confirms_nothing(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    sick = falls("gpu-node-5", range(4), 500)
    running = await start(threshold=20, evidence_url=f"http://127.0.0.1:{free_port()}")
    await running.post(*sick)
    assert running.gateway.cordon is not None
    assert await running.gateway.cordon.run_once() == []
    assert running.cards() == []
    assert "event=evidence_unavailable" in caplog.text


def test_approvers_are_people_or_open_ids() -> None:
    loaded = validate_settings(
        {"remediation": {"approvers": ["alice", "ou_carol7"]}, "oncall": ONCALL}
    )
    approvers = cordon_approvers_of(loaded.remediation, loaded.oncall.rota)
    assert approvers == {"ou_alice": "alice", "ou_carol7": "ou_carol7"}
    for approvers, problem in (
        (["zed"], r"remediation\.approvers\[0\]: 'zed' is neither a person"),
        (["alice", "dave"], r"remediation\.approvers\[1\]: dave has no feishu_open_id"),
    ):
        people = {**ONCALL, "people": {**ONCALL["people"], "dave": {"phone": "+4915100000004"}}}
        with pytest.raises(ConfigError, match=problem):  # when the settings load
            validate_settings({"remediation": {"approvers": approvers}, "oncall": people})
    for url in ("javascript:alert(1)", "http://user:s3cret@prometheus:9090", "prometheus:9090"):
        with pytest.raises(ConfigError, match=r"remediation\.evidence\.prometheus_url: ") as bad:
            validate_settings({"remediation": {"evidence": {"prometheus_url": url}}})
        assert "s3cret" not in str(bad.value)
    with pytest.raises(ConfigError, match=r"remediation\.max_cards_per_hour: "):
        validate_settings({"remediation": {"max_cards_per_hour": 0}})


async def test_a_flood_of_sick_nodes_gives_at_most_the_capped_cards(
    start: Start,
) -> None:
    """1,200 GPUs of 300 nodes fall off the bus in one webhook: at most
    `max_cards_per_hour` "Cordon recommended" cards reach Feishu, each folding several
    nodes, however often the check runs."""
    async with FeishuContractServer(apps={"cli_app": "app-secret"}, chats={"oc_infra"}) as feishu:
        settings = Settings.model_validate(
            {
                "channels": {
                    "feishu_app": {
                        "base_url": feishu.base_url,
                        "app_id": "cli_app",
                        "chats": {"oc_infra": ["P0", "P1", "P2", "P3"]},
                    }
                }
            }
        )
        env = {"FEISHU_APP_SECRET": "app-secret", "FEISHU_VERIFICATION_TOKEN": VERIFICATION}
        channels = build(settings, env)
        try:
            alerts = [a for n in range(300) for a in falls(f"flood-{n}", range(4), 4 * n)]
            running = await start(
                threshold=20, max_cards_per_hour=3, channels=dict(channels.notifiers), fired=alerts
            )
            assert running.gateway.cordon is not None
            # 1,200 alerts no Prometheus fired: no card at all
            forged = [a for n in range(300) for a in falls(f"forged-{n}", range(4), 2000 + 4 * n)]
            await running.post(*forged)
            await running.gateway.cordon.run_once()
            await running.gateway.settle()
            assert [m for m in feishu.messages.values() if "Cordon" in m["content"]] == []
            # 1,200 that Prometheus fired: three cards of ten nodes
            await running.post(*alerts)
            for _ in range(5):
                await running.gateway.cordon.run_once()
                await running.gateway.settle()
            cards = [
                json.loads(m["content"])
                for m in feishu.messages.values()
                if m["msg_type"] == "interactive" and "Cordon recommended" in m["content"]
            ]
            assert len(cards) == 3, len(cards)  # max_cards_per_hour
            named = [re.findall(r"cordon (flood-\d+):", json.dumps(card)) for card in cards]
            assert [len(nodes) for nodes in named] == [10, 10, 10]  # folded, 10 a card
            assert len({node for nodes in named for node in nodes}) == 30
        finally:
            assert channels.built is not None
            await channels.built.aclose()


def prometheus_config(exporter: str, alertmanager: str | None) -> dict[str, Any]:
    """Scrapes the fixture exporter's dcgm series of gpu-node-1 every second (the `node`
    label added by the target, as the chart's PodMonitor relabeling does), evaluates every
    second, and has an external label the alerts carry and `ALERTS` does not."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": "1s",
            "evaluation_interval": "1s",
            "scrape_timeout": "1s",
            "external_labels": {"cluster": "lab"},
        },
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "static_configs": [
                    {
                        "targets": [exporter],
                        "labels": {
                            "node": "gpu-node-1",
                            "__metrics_path__": "/dcgm/gpu-node-1/metrics",
                        },
                    }
                ],
            }
        ],
    }
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the store is not under test
async def test_a_firing_of_the_shipped_rule_is_evidence(
    cluster: KubeEmulator, start: Start, tmp_path: Path
) -> None:
    """The real path: the fixture exporter reports XID 79 on the four GPUs of gpu-node-1; a
    real Prometheus evaluates the shipped rules/gpu.yaml and sends GPUFellOffBus to a real
    Alertmanager, which posts them to the gateway. The gateway asks that Prometheus: the four
    firings are confirmed (4 x 6 = 24, over 20), one card, and Approve cordons the node."""
    exporter = TestServer(make_exporter(), host="127.0.0.1")
    await exporter.start_server()
    address = f"127.0.0.1:{exporter.port}"
    with contextlib.ExitStack() as servers:
        prometheus = servers.enter_context(
            await asyncio.to_thread(
                start_prometheus, tmp_path, prometheus_config(address, None),
                [rules_dir() / "gpu.yaml"],
            )
        )  # fmt: skip
        running = await start(threshold=20, evidence_url=prometheus.url)
        gateway = str(running.server.make_url(WEBHOOK_PATH))
        route = {"receiver": "gateway", "group_by": ["alertname"], "group_wait": "1s",
                 "group_interval": "1s", "repeat_interval": "1h"}  # fmt: skip
        receivers = [{"name": "gateway", "webhook_configs": [{"url": gateway}]}]
        alertmanager = servers.enter_context(
            await asyncio.to_thread(
                start_alertmanager, tmp_path, {"route": route, "receivers": receivers}
            )
        )
        # Prometheus now sends to that Alertmanager (its config reloaded)
        config = prometheus_config(address, alertmanager.address)
        config["rule_files"] = [str(rules_dir() / "gpu.yaml")]
        (prometheus.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{prometheus.url}/-/reload") as answer:
                assert answer.status == 200, await answer.text()
            faults = [{"node": "gpu-node-1", "gpu": gpu, "code": 79} for gpu in range(4)]
            async with http.post(exporter.make_url("/faults"), json={"xid": faults}) as answer:
                assert answer.status == 200
        stage = running.gateway.cordon
        assert stage is not None
        found: list[str] = []

        async def recommended() -> bool:
            found[:] = await stage.run_once()
            return found == ["gpu-node-1"]

        with logs_on_error(prometheus, alertmanager):
            deadline = asyncio.get_running_loop().time() + 60
            while not await recommended():
                assert asyncio.get_running_loop().time() < deadline, "no recommendation"
                await asyncio.sleep(0.5)
        await running.gateway.settle()
        [card] = running.cards()
        [node] = card["cordon"]["nodes"]
        assert node["faults"] == {"fell_off_bus": 4}
        value = {"action": "cordon_approve", "node": "gpu-node-1"}
        assert await running.press(value, "ev-real") == "gpu-node-1: cordoned"
        assert unschedulable(cluster, "gpu-node-1")
    await exporter.close()
