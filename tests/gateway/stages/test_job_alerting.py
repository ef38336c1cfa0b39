"""TrainingJobs route their own alerts (spec.alerting), end to end: the real gateway, the
Kubernetes API as the kmock emulator over HTTP (objects checked against the real CRD and the
built-in schemas), Feishu as the contract server (app messages, custom bots, contact API,
urgent_phone)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import kmock
import pytest
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from tests.operator.operator_harness import TJ, Validator, declare_cluster
from tests.support.eventually import eventually
from tests.support.feishu_server import FeishuContractServer, Hook
from tests.support.gateway_process import close_in_process, post_alerts
from tests.support.kube_emulator import KubeEmulator
from tests.support.ports import free_port
from tests.support.webhook_factory import make_alert
from trainsentry.config import Settings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.assemble import build_job_alerting, build_topology, create_app
from trainsentry.gateway.channels import Channels, build
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.sections import default_escalator, oncall_of
from trainsentry.gateway.stages.services.job_alerting import JobAlerting

# The API calls the job alerting stage makes, as the emulator records them; the chart's RBAC
# for gateway.jobAlerting is checked against this file (tests/chart/test_rbac.py).
API_CALLS = Path(__file__).resolve().parent / "job_alerting_api_calls.json"
SIGNING = "team-b-signing-secret"
GLOBAL_CHAT = "oc_global"
ROSTER = """
layers:
  - name: team-a-primary
    members: [{name: carol, feishu_open_id: ou_carol}]
"""


def tj_path(namespace: str, name: str = "") -> str:
    base = f"/apis/{TJ.rsplit('/', 1)[0]}/namespaces/{namespace}/trainingjobs"
    return f"{base}/{name}" if name else base


def trainingjob(namespace: str, name: str, alerting: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "trainsentry.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"job": name}}, "alerting": alerting},
    }


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def create(cluster: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    async with cluster.post(path, json=body) as answer:
        assert answer.status == 201, await answer.text()


async def merge(cluster: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    headers = {"Content-Type": "application/merge-patch+json"}
    async with cluster.patch(path, json=body, headers=headers) as answer:
        assert answer.status == 200, await answer.text()


def condition(cluster: KubeEmulator, namespace: str, name: str) -> dict[str, Any]:
    body = cluster.get_live(TJ, namespace, name) or {}
    conditions = body.get("status", {}).get("conditions", [])
    found = [c for c in conditions if c["type"] == "AlertingReady"]
    assert len(found) == 1, body.get("status")
    return found[0]


def events(cluster: KubeEmulator, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.live("v1/events", namespace) if e["involvedObject"]["name"] == name]


def alert(index: int, namespace: str, job: str, name: str) -> dict[str, Any]:
    return make_alert(index, name=name, labels={"namespace": namespace, "trainingjob": job})


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emu, kmock.Server(emu):
        declare_cluster(emu, workloads=False)
        emu.declare("v1/secrets", "Secret")
        emu.validator = Validator()
        yield emu


@pytest.fixture
async def feishu() -> AsyncIterator[FeishuContractServer]:
    async with FeishuContractServer(
        hooks={"team-b": Hook(secret=SIGNING)},
        apps={"cli_app": "app-secret"},
        chats={GLOBAL_CHAT, "oc_team_a", "oc_team_a_new"},
        emails={"alice@example.com": "ou_alice"},
    ) as server:
        yield server


@dataclass
class Running:
    server: TestServer
    gateway: Gateway
    stage: JobAlerting
    channels: Channels

    async def post(self, *alerts: dict[str, Any]) -> None:
        await post_alerts(self.server, list(alerts))
        await self.stage.settle()


@asynccontextmanager
async def gateway_with(
    cluster: KubeEmulator,
    feishu: FeishuContractServer,
    tmp_path: Path,
    policy: str | None = None,
    oncall: dict[str, Any] | None = None,
    job_alerting: dict[str, Any] | None = None,
    *,
    escalation: list[dict[str, Any]] | None = None,
    gateway: dict[str, Any] | None = None,
    clock: Callable[[], datetime] | None = None,
    topology: dict[str, Any] | None = None,
) -> AsyncIterator[Any]:
    """(start, an unreachable bot URL prefix) of a gateway with job alerting and the global
    Feishu chat; `policy` is a policy file merged over the shipped one, `oncall` the
    gateway's `oncall:` section, `job_alerting` more keys of its `job_alerting:` section,
    `escalation` the global escalation's layers (default: gus alone), `gateway` more keys
    of its `gateway:` section, `clock` the gateway's clock, `topology` its `topology:`
    section."""
    unreachable = f"http://127.0.0.1:{free_port()}/open-apis/bot/v2/hook/"
    gateway_settings: dict[str, Any] = {"db": f"sqlite:///{tmp_path / 'gw.db'}", **(gateway or {})}
    if policy is not None:
        (tmp_path / "policy.yaml").write_text(policy)
        gateway_settings["policy_file"] = str(tmp_path / "policy.yaml")
    settings = Settings.model_validate(
        {
            "gateway": gateway_settings,
            "channels": {
                "feishu_app": {
                    "base_url": feishu.base_url,
                    "app_id": "cli_app",
                    "chats": {GLOBAL_CHAT: ["P0", "P1", "P2", "P3"]},
                },
                "phone": {"provider": "feishu"},
                "escalation": {
                    "layers": escalation
                    or [
                        {"name": "global", "members": [{"name": "gus", "feishu_open_id": "ou_gus"}]}
                    ]
                },
            },
            "job_alerting": {
                "enabled": True,
                "refresh_seconds": 0.2,
                "webhook_prefixes": [feishu.hook_url(""), unreachable],
                **(job_alerting or {}),
            },
            "oncall": oncall,
        }
    )
    channels = build(settings, {"FEISHU_APP_SECRET": "app-secret"})

    async def api() -> ApiClient:
        return ApiClient(Configuration(host=str(cluster.url).rstrip("/")))

    stage = build_job_alerting(settings.job_alerting, channels, api)
    assert stage is not None and "feishu_job" in channels.notifiers
    assert channels.built is not None
    app = create_app(
        settings.gateway,
        notifiers=channels.notifiers,
        rate_limits=channels.rate_limits,
        escalator=default_escalator(settings),
        job_alerting=stage,
        oncall=oncall_of(settings),
        **({"clock": clock} if clock is not None else {}),
        **(
            {"topology": build_topology(TopologySettings.model_validate(topology))}
            if topology is not None
            else {}
        ),
    )
    server = TestServer(app, host="127.0.0.1")

    async def start() -> Running:
        await server.start_server()
        await stage.refresh()  # the loop does it too; the test does not wait for its tick
        await stage.settle()
        return Running(server, server.app[GATEWAY_KEY], stage, channels)

    try:
        yield start, unreachable
    finally:
        await close_in_process(server)
        await channels.built.aclose()


@pytest.fixture
async def gateway(
    cluster: KubeEmulator, feishu: FeishuContractServer, tmp_path: Path
) -> AsyncIterator[Any]:
    async with gateway_with(cluster, feishu, tmp_path) as running:
        yield running


async def create_bot_secret(cluster: KubeEmulator, feishu: FeishuContractServer) -> None:
    """team-b's Secret `bot`: its custom bot's URL (`url`) and signing secret (`sign`)."""
    await create(
        cluster,
        "/api/v1/namespaces/team-b/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bot"},
         "data": {"url": b64(feishu.hook_url("team-b")), "sign": b64(SIGNING)}},
    )  # fmt: skip


def chat_cards(feishu: FeishuContractServer, chat: str) -> list[dict[str, Any]]:
    return [
        json.loads(m["content"])
        for m in feishu.messages.values()
        if m["receive_id"] == chat and m["msg_type"] == "interactive"
    ]


def jobs_in(cards: list[dict[str, Any]]) -> list[str]:
    text = [json.dumps(card) for card in cards]
    jobs = ("team-a/a", "team-b/b", "team-c/c")
    return sorted(job for job in jobs if any(job in t for t in text))


def names_in(cards: list[dict[str, Any]]) -> list[str]:
    """The alert names on `cards`, one per card (each card here is about one alert)."""
    names = ("TrainingJobDown", "TrainingJobSlow", "NodeDiskDegraded")
    found = [[n for n in names if n in json.dumps(card)] for card in cards]
    assert all(len(f) == 1 for f in found), found
    return sorted(f[0] for f in found)


async def test_each_job_gets_its_own_chat_bot_owners_and_oncall(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    start, _ = gateway
    await create(
        cluster,
        "/api/v1/namespaces/team-a/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "oncall"},
         "data": {"roster.yaml": ROSTER}},
    )  # fmt: skip
    await create_bot_secret(cluster, feishu)
    await create(
        cluster,
        tj_path("team-a"),
        trainingjob(
            "team-a",
            "a",
            {
                "owners": ["alice@example.com", "ou_bob"],
                "feishu": {"chatId": "oc_team_a"},
                "onCallRosterRef": {"name": "oncall", "key": "roster.yaml"},
            },
        ),
    )
    await create(
        cluster,
        tj_path("team-b"),
        trainingjob(
            "team-b",
            "b",
            {
                "feishu": {
                    "webhookSecretRef": {"name": "bot", "key": "url", "secretKey": "sign"},
                    "chatId": "oc_team_a_new",  # with both, the bot is used
                }
            },
        ),
    )
    # owners alone: mentioned on the cards of the gateway's own Feishu channels
    await create(cluster, tj_path("team-c"), trainingjob("team-c", "c", {"owners": ["ou_dan"]}))
    running = await start()
    await running.post(
        alert(1, "team-a", "a", "TrainingJobDown"),  # P0: card, mentions, a call
        alert(2, "team-b", "b", "TrainingJobSlow"),  # P1
        alert(3, "team-c", "c", "TrainingJobSlow"),  # a job without settings: global route
    )
    # Each job's card reaches its own chat or bot, and only there.
    assert jobs_in(chat_cards(feishu, "oc_team_a")) == ["team-a/a"]
    assert jobs_in(chat_cards(feishu, GLOBAL_CHAT)) == ["team-c/c"]
    assert chat_cards(feishu, "oc_team_a_new") == []
    assert "<at id=ou_dan></at>" in json.dumps(chat_cards(feishu, GLOBAL_CHAT))
    bot_cards = [body["card"] for _, body in feishu.accepted["team-b"]]
    assert jobs_in(bot_cards) == ["team-b/b"]  # accepted: the signature was checked
    assert all("sign" in body for _, body in feishu.accepted["team-b"])
    # The owners are mentioned on the P0 card: an open_id as given, an e-mail looked up.
    [card_a] = chat_cards(feishu, "oc_team_a")
    assert "<at id=ou_alice></at>" in json.dumps(card_a)
    assert "<at id=ou_bob></at>" in json.dumps(card_a)
    assert feishu.contact_calls == [["alice@example.com"]]
    # The P0 page rings the job's own on-call (from its ConfigMap), not the global one.
    rung = [user for _, users in feishu.urgent_calls for user in users]
    assert rung == ["ou_carol"]
    for namespace, name in (("team-a", "a"), ("team-b", "b"), ("team-c", "c")):
        ready = condition(cluster, namespace, name)
        assert (ready["status"], ready["reason"]) == ("True", "Ready"), ready
    assert feishu.rejections == []


async def test_the_admins_policy_forbids_and_forces_through_the_real_gateway(
    cluster: KubeEmulator, feishu: FeishuContractServer, tmp_path: Path
) -> None:
    """routing.jobs: P2 is not a job's to redirect (it stays in the gateway's chat only), every
    P0 also reaches the gateway's chat (force), and an alert of another namespace naming the
    same job gets nothing of the job's route."""
    policy = "routing:\n  jobs: {allow: [P0, P1, P3], force: {P0: [feishu]}}\n"
    await create(
        cluster, tj_path("team-a"), trainingjob("team-a", "a", {"feishu": {"chatId": "oc_team_a"}})
    )
    async with gateway_with(cluster, feishu, tmp_path, policy) as (start, _):
        running = await start()
        await running.post(
            alert(1, "team-a", "a", "TrainingJobDown"),  # P0: forced to the gateway's chat too
            alert(2, "team-a", "a", "TrainingJobSlow"),  # P1: the job's chat only
            alert(3, "team-a", "a", "NodeDiskDegraded"),  # P2: forbidden, the gateway's chat
            alert(4, "team-x", "a", "TrainingJobSlow"),  # same job name, another namespace
        )
        names = {chat: names_in(chat_cards(feishu, chat)) for chat in (GLOBAL_CHAT, "oc_team_a")}
    assert names["oc_team_a"] == ["TrainingJobDown", "TrainingJobSlow"]
    assert names[GLOBAL_CHAT] == ["NodeDiskDegraded", "TrainingJobDown", "TrainingJobSlow"]
    assert "team-x/a" in json.dumps(chat_cards(feishu, GLOBAL_CHAT))
    assert "team-x/a" not in json.dumps(chat_cards(feishu, "oc_team_a"))
    assert feishu.rejections == []


async def test_a_changed_chat_is_used_for_the_next_card_without_a_restart(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    start, _ = gateway
    await create(
        cluster, tj_path("team-a"), trainingjob("team-a", "a", {"feishu": {"chatId": "oc_team_a"}})
    )
    running = await start()
    await running.post(alert(1, "team-a", "a", "TrainingJobSlow"))
    assert len(chat_cards(feishu, "oc_team_a")) == 1
    change = {"spec": {"alerting": {"feishu": {"chatId": "oc_team_a_new"}}}}
    await merge(cluster, tj_path("team-a", "a"), change)
    # the stage's own loop (refresh_seconds 0.2) picks the change up
    await eventually(lambda: running.stage.destination("team-a/a").chat_id == "oc_team_a_new")
    # another alertname: another incident, whose card goes to the new chat
    await running.post(alert(2, "team-a", "a", "TrainingJobStraggler"))
    assert len(chat_cards(feishu, "oc_team_a")) == 1
    assert len(chat_cards(feishu, "oc_team_a_new")) == 1


async def test_bad_settings_get_a_condition_an_event_and_the_global_route(
    cluster: KubeEmulator,
    feishu: FeishuContractServer,
    gateway: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    start, unreachable = gateway
    caplog.set_level(logging.DEBUG)
    # a Secret of another namespace: the job cannot name it (refs have no namespace)
    await create(
        cluster,
        "/api/v1/namespaces/team-b/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "shared"},
         "data": {"url": b64(feishu.hook_url("team-b"))}},
    )  # fmt: skip
    await create(
        cluster,
        "/api/v1/namespaces/team-a/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "down"},
         "data": {"url": b64(unreachable + "token-never-logged"),
                  "elsewhere": b64("https://collector.example/steal")}},
    )  # fmt: skip
    await create(
        cluster,
        "/api/v1/namespaces/team-a/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bad-roster"},
         "data": {"roster.yaml": "layers: [{name: x}]"}},
    )  # fmt: skip
    ref = {"name": "shared", "key": "url"}
    bad = {
        "nosecret": {"feishu": {"webhookSecretRef": ref}},
        "notjoined": {"feishu": {"chatId": "oc_not_joined"}},
        "unreachable": {"feishu": {"webhookSecretRef": {"name": "down", "key": "url"}}},
        "badroster": {"onCallRosterRef": {"name": "bad-roster", "key": "roster.yaml"}},
        "nokey": {"onCallRosterRef": {"name": "bad-roster", "key": "missing"}},
        "elsewhere": {"feishu": {"webhookSecretRef": {"name": "down", "key": "elsewhere"}}},
        "nobody": {"owners": ["nobody@example.com"]},
    }
    for name, alerting in bad.items():
        await create(cluster, tj_path("team-a"), trainingjob("team-a", name, alerting))
    running = await start()
    await running.post(*(alert(i, "team-a", name, "TrainingJobDown") for i, name in enumerate(bad)))
    expected = {
        "nosecret": "SecretNotFound",
        "notjoined": "ChatNotJoined",
        "unreachable": "WebhookUnreachable",
        "badroster": "InvalidRoster",
        "nokey": "ConfigMapKeyMissing",
        "elsewhere": "InvalidWebhook",
        "nobody": "OwnerNotFound",
    }
    for name, reason in expected.items():
        ready = condition(cluster, "team-a", name)
        assert (ready["status"], ready["reason"]) == ("False", reason), ready
        assert reason in {e["reason"] for e in events(cluster, "team-a", name)}
    # every card took the global route; nothing lost, nothing went to the other namespace's bot
    global_text = json.dumps(chat_cards(feishu, GLOBAL_CHAT))
    assert all(f"team-a/{name}" in global_text for name in bad)
    assert feishu.accepted["team-b"] == []
    # the pages of the job whose roster is malformed call the global on-call
    assert {user for _, users in feishu.urgent_calls for user in users} == {"ou_gus"}
    # Secrets were read in the job's namespace only
    secret_reads = [
        ns for call, ns in zip(cluster.calls, cluster.namespaces, strict=True)
        if call.resource == "secrets" and call.verb == "get"
    ]  # fmt: skip
    assert secret_reads and set(secret_reads) == {"team-a"}
    metrics = running.gateway.metrics
    assert metrics.job_alerting_not_ready._value.get() == len(bad)
    fallbacks = {
        s.labels["reason"]: s.value
        for m in metrics.job_route_fallbacks.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert fallbacks == {"ChatNotJoined": 1.0, "WebhookUnreachable": 1.0}
    # every API call the stage made is one the chart grants (tests/chart/test_rbac.py)
    made = sorted(
        [
            call.verb,
            call.group,
            call.resource + (f"/{call.subresource}" if call.subresource else ""),
        ]
        for call in cluster.recorded_calls(exclude_agent="kmock/")
    )
    assert made == json.loads(API_CALLS.read_text())
    # the secret values reach no log line, condition or event
    seen = caplog.text + json.dumps(cluster.live(TJ)) + json.dumps(cluster.live("v1/events"))
    assert "token-never-logged" not in seen and feishu.hook_url("team-b") not in seen
    assert "collector.example" not in seen


async def test_without_job_alerting_nothing_changes(tmp_path: Path) -> None:
    settings = Settings.model_validate({"gateway": {"db": f"sqlite:///{tmp_path / 'g.db'}"}})
    channels = build(settings, {})

    async def no_cluster() -> ApiClient:
        raise AssertionError("no Kubernetes API call without job_alerting")

    assert build_job_alerting(settings.job_alerting, channels, no_cluster) is None
    assert "feishu_job" not in channels.notifiers


def test_the_operator_keeps_the_gateways_condition() -> None:
    from trainsentry.operator.status import Condition, merge_conditions

    old = [
        {"type": "RulesReady", "status": "True", "reason": "Applied"},
        {"type": "AlertingReady", "status": "False", "reason": "SecretNotFound", "message": "m"},
    ]
    merged = merge_conditions(old, [Condition("RulesReady", True, "Applied")], "now", 2)
    assert [c["type"] for c in merged] == ["RulesReady", "AlertingReady"]
    assert merged[1] == old[1]


async def test_an_api_failure_keeps_a_known_jobs_route_and_names_a_new_ones(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    start, _ = gateway
    await create(
        cluster,
        "/api/v1/namespaces/team-b/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bot"},
         "data": {"url": b64(feishu.hook_url("team-b"))}},
    )  # fmt: skip
    ref = {"webhookSecretRef": {"name": "bot", "key": "url"}}
    await create(cluster, tj_path("team-b"), trainingjob("team-b", "b", {"feishu": ref}))
    running = await start()
    known = running.stage.destination("team-b/b")
    assert known is not None and known.webhook is not None
    await running.stage.stop()  # no background refresh: this test drives them
    cluster.inject_fault("get", "secrets", 503, times=6)  # every retry of one read
    await running.stage.refresh()
    assert running.stage.destination("team-b/b") == known
    roster = {"onCallRosterRef": {"name": "oncall", "key": "roster.yaml"}}
    await create(cluster, tj_path("team-b"), trainingjob("team-b", "new", roster))
    cluster.inject_fault("get", "configmaps", 503, times=6)
    await running.stage.refresh()
    await running.stage.settle()
    assert condition(cluster, "team-b", "new")["reason"] == "ApiError"
    assert condition(cluster, "team-b", "b")["status"] == "True"


async def test_a_secret_the_gateway_may_not_read_is_named_and_the_global_route_taken(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    """The chart grants no Secret reads cluster-wide (only in the namespaces an admin lists):
    a job elsewhere naming its bot's Secret is told so (SecretNotReadable, not a passing API
    error) and its cards go to the global chat; a roster ConfigMap likewise."""
    start, _ = gateway
    await create_bot_secret(cluster, feishu)
    ref = {"webhookSecretRef": {"name": "bot", "key": "url", "secretKey": "sign"}}
    await create(cluster, tj_path("team-b"), trainingjob("team-b", "b", {"feishu": ref}))
    roster = {"onCallRosterRef": {"name": "oncall", "key": "roster.yaml"}}
    await create(cluster, tj_path("team-c"), trainingjob("team-c", "c", roster))
    cluster.inject_fault("get", "secrets", 403, times=100)
    cluster.inject_fault("get", "configmaps", 403, times=100)
    running = await start()
    await running.post(alert(1, "team-b", "b", "TrainingJobSlow"))
    secret = condition(cluster, "team-b", "b")
    assert (secret["status"], secret["reason"]) == ("False", "SecretNotReadable"), secret
    assert "secretNamespaces" in secret["message"]
    configmap = condition(cluster, "team-c", "c")
    assert (configmap["status"], configmap["reason"]) == ("False", "ConfigMapNotReadable")
    assert [e["reason"] for e in events(cluster, "team-b", "b")] == ["SecretNotReadable"]
    assert jobs_in(chat_cards(feishu, GLOBAL_CHAT)) == ["team-b/b"]
    assert feishu.accepted.get("team-b", []) == []


async def ack(running: Running, alert_id: int, who: str) -> None:
    """The ack the API, the console and the card button share (stages/services/ack.py)."""
    assert running.gateway.ack is not None
    assert await running.gateway.ack.acknowledge(alert_id, who) is not None
    await running.gateway.settle()


async def test_a_jobs_alert_is_acked_where_its_cards_went(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    """The ack of a job's alert is shown the way its card went: the card in the job's own
    chat redrawn in place, the job's bot told; the global chat, which the job's route
    replaced, hears nothing. An alert of a job without a route is acked in the global chat;
    one whose route failed (its card fell back to the global chat) has that card redrawn."""
    start, _ = gateway
    await create_bot_secret(cluster, feishu)
    await create(
        cluster,
        tj_path("team-a"),
        trainingjob("team-a", "a", {"feishu": {"chatId": "oc_team_a"}, "owners": ["ou_bob"]}),
    )
    bot = {"webhookSecretRef": {"name": "bot", "key": "url", "secretKey": "sign"}}
    await create(cluster, tj_path("team-b"), trainingjob("team-b", "b", {"feishu": bot}))
    lost = {"feishu": {"chatId": "oc_not_joined"}}
    await create(cluster, tj_path("team-d"), trainingjob("team-d", "d", lost))
    running = await start()
    await running.post(
        alert(1, "team-a", "a", "TrainingJobSlow"),
        alert(2, "team-b", "b", "TrainingJobSlow"),
        alert(3, "team-c", "c", "TrainingJobSlow"),  # no TrainingJob: the global route
        alert(4, "team-d", "d", "TrainingJobSlow"),  # its chat refuses: the fallback
    )
    global_before = len(chat_cards(feishu, GLOBAL_CHAT))
    assert global_before == 2 and len(feishu.accepted["team-b"]) == 1
    [fell_back] = [m for m in feishu.messages.values() if "team-d/d" in m["content"]]
    [job_message] = [m for m in feishu.messages.values() if m["receive_id"] == "oc_team_a"]
    assert "<at id=ou_bob></at>" in job_message["content"]  # P1: the owners are mentioned
    for alert_id, who in ((1, "ou_amy"), (2, "ou_ben"), (3, "ou_cid"), (4, "ou_dee")):
        await ack(running, alert_id, who)
    # team-a: its card in its chat is redrawn, nothing new is posted anywhere
    assert len(chat_cards(feishu, "oc_team_a")) == 1
    [redrawn] = job_message["updates"]
    assert "ou_amy" in json.dumps(redrawn) and "Acknowledged by" in json.dumps(redrawn)
    assert "<at id=ou_bob></at>" not in json.dumps(redrawn)  # owners are not pinged again
    # team-b: a custom bot cannot update a card; its bot gets the ack card
    acked_b = feishu.accepted["team-b"][1:]
    assert len(acked_b) == 1 and "ou_ben" in json.dumps(acked_b[0][1])
    # the global chat hears only of its own alert's ack
    in_global = [m for m in feishu.messages.values() if m["receive_id"] == GLOBAL_CHAT]
    global_text = json.dumps(in_global)
    assert "ou_amy" not in global_text and "ou_ben" not in global_text
    assert "ou_cid" in global_text
    assert len(chat_cards(feishu, GLOBAL_CHAT)) == global_before  # redrawn, not re-posted
    [redrawn_d] = fell_back["updates"]
    assert "ou_dee" in json.dumps(redrawn_d)
    assert {code for _, code in feishu.rejections} == {230002}  # only team-d's chat


async def create_unchecked(cluster: KubeEmulator, path: str, body: dict[str, Any]) -> None:
    """Stores `body` without the schema check: an object kept from before the CRD refused
    it (or a cluster whose CRD is older), which the gateway must still not trust."""
    validator, cluster.validator = cluster.validator, None
    try:
        await create(cluster, path, body)
    finally:
        cluster.validator = validator


TEAM_B_ROSTER = """
layers:
  - name: team-b-primary
    members: [{name: bella, feishu_open_id: ou_bella}]
"""
# References that climb out of the job's namespace (issue 32, finding 1): as written, and
# with the dots percent-encoded (an HTTP client decodes and collapses both).
ESCAPES = {
    "dots": {
        "feishu": {
            "webhookSecretRef": {
                "name": "../../team-b/secrets/bot", "key": "url", "secretKey": "sign"
            }
        }
    },
    "encoded": {
        "feishu": {
            "webhookSecretRef": {
                "name": "%2e%2e/%2e%2e/team-b/secrets/bot", "key": "url", "secretKey": "sign"
            }
        }
    },
    "roster": {
        "onCallRosterRef": {"name": "../../team-b/configmaps/oncall", "key": "roster.yaml"}
    },
}  # fmt: skip
ESCAPING_FIELDS = {
    "dots": "spec.alerting.feishu.webhookSecretRef.name",
    "encoded": "spec.alerting.feishu.webhookSecretRef.name",
    "roster": "spec.alerting.onCallRosterRef.name",
}


async def test_a_reference_cannot_climb_into_another_namespace(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    """Issue 32, finding 1: team-a's TrainingJobs name team-b's Secret and roster through
    `../` (plain and percent-encoded). The gateway reads nothing of team-b's (no request
    even names its namespace), team-b's bot and on-call person hear nothing, and each job
    says why: AlertingReady=False, reason InvalidReference, naming the field."""
    start, _ = gateway
    await create_bot_secret(cluster, feishu)
    await create(
        cluster,
        "/api/v1/namespaces/team-b/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "oncall"},
         "data": {"roster.yaml": TEAM_B_ROSTER}},
    )  # fmt: skip
    for name, alerting in ESCAPES.items():
        await create_unchecked(cluster, tj_path("team-a"), trainingjob("team-a", name, alerting))
    running = await start()
    await running.post(
        *(alert(i, "team-a", name, "TrainingJobDown") for i, name in enumerate(ESCAPES))
    )
    assert feishu.accepted.get("team-b", []) == []  # team-b's bot got no card
    rung = {user for _, users in feishu.urgent_calls for user in users}
    assert "ou_bella" not in rung and rung == {"ou_gus"}  # the global on-call, not team-b's
    ours = cluster.sent_paths(exclude_agent="kmock/")
    assert ours and not [p for p in ours if "team-b" in p or "%2" in p.lower() or ".." in p]
    assert not [
        call for call in cluster.recorded_calls(exclude_agent="kmock/")
        if call.resource in ("secrets", "configmaps")
    ]  # fmt: skip
    for name, field in ESCAPING_FIELDS.items():
        ready = condition(cluster, "team-a", name)
        assert (ready["status"], ready["reason"]) == ("False", "InvalidReference"), ready
        assert field in ready["message"], ready
        assert "InvalidReference" in {e["reason"] for e in events(cluster, "team-a", name)}
    global_text = json.dumps(chat_cards(feishu, GLOBAL_CHAT))  # every card took the global route
    assert all(f"team-a/{name}" in global_text for name in ESCAPES)


def node_alert(index: int, namespace: str, job: str, name: str, **labels: str) -> dict[str, Any]:
    """An alert of a tenant's own PrometheusRule about node gpu-node-17: prometheus-operator's
    `enforcedNamespaceLabel` gives it its own namespace; every other label is the team's."""
    base = {"namespace": namespace, "trainingjob": job, "node": "gpu-node-17"}
    alert = make_alert(index, name=name, labels={**base, **labels})
    if "gpu" not in labels:
        del alert["labels"]["gpu"]
    return alert


async def test_a_teams_decoy_on_a_node_captures_no_other_teams_page(
    cluster: KubeEmulator, feishu: FeishuContractServer, gateway: Any
) -> None:
    """Issue 43 finding 2: team-a raises `KubeNodeNotReady` on gpu-node-17 from its own rule
    and acknowledges it; team-b's P0 `GPUFellOffBus` on that node then still pages team-b
    through team-b's own route (its bot), rings the on-call team-b's page follows (the
    global one: team-b names no roster), and team-a's chat, owners and roster get nothing
    of team-b. Before, it joined team-a's acknowledged incident: no call, no card for b."""
    start, _ = gateway
    await create(
        cluster,
        "/api/v1/namespaces/team-a/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "oncall"},
         "data": {"roster.yaml": ROSTER}},
    )  # fmt: skip
    await create_bot_secret(cluster, feishu)
    team_a = {
        "owners": ["ou_bob"],
        "feishu": {"chatId": "oc_team_a"},
        "onCallRosterRef": {"name": "oncall", "key": "roster.yaml"},
    }
    await create(cluster, tj_path("team-a"), trainingjob("team-a", "a", team_a))
    bot = {"webhookSecretRef": {"name": "bot", "key": "url", "secretKey": "sign"}}
    await create(cluster, tj_path("team-b"), trainingjob("team-b", "b", {"feishu": bot}))
    running = await start()
    decoy = node_alert(1, "team-a", "a", "KubeNodeNotReady", priority="P3", component="kubernetes")
    await running.post(decoy)
    await ack(running, 1, "ou_amy")
    a_before = json.dumps(chat_cards(feishu, "oc_team_a"))
    await running.post(
        node_alert(
            2, "team-b", "b", "GPUFellOffBus", priority="P0", component="gpu", gpu="3", xid="79"
        )
    )
    bot_cards = [json.dumps(body["card"]) for _, body in feishu.accepted.get("team-b", [])]
    assert len(bot_cards) == 1 and "GPUFellOffBus" in bot_cards[0], bot_cards
    assert "team-b/b" in bot_cards[0] and "team-a/a" not in bot_cards[0]
    assert "ou_amy" not in bot_cards[0], "team-a's ack covers none of team-b's alerts"
    # team-a's chat, owners and roster hear nothing of team-b's page
    a_cards = json.dumps(chat_cards(feishu, "oc_team_a"))
    assert a_cards == a_before and "GPUFellOffBus" not in a_cards and "team-b" not in a_cards
    rung = [user for _, users in feishu.urgent_calls for user in users]
    assert rung == ["ou_gus"], rung
    assert running.gateway.ack is not None
    answer = await running.gateway.ack.acknowledge(2, "ou_ben")
    assert answer is not None and not answer.already_acked, "team-a's ack covered it"
    assert answer.acked_by != "ou_amy"
