"""Cordon with a human in the loop (issue 23 item 4), end to end: the real gateway in
process (SQLite), the Kubernetes API as the kmock emulator over HTTP with the real
TrainingJob CRD and built-in schemas, the card's buttons pressed as signed Feishu callbacks
through the gateway's callback route (tests/gateway/stages/cordon_harness.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.stages.cordon_harness import (
    CARD_PATH,
    ENCRYPT_KEY,
    TOKEN,
    VERIFICATION,
    Start,
    create,
    emulated_cluster,
    fault,
    gateways,
    job_condition,
    list_nodes,
    node_events,
    unschedulable,
)
from tests.support.feishu_server import FeishuContractServer
from tests.support.kube_emulator import KubeEmulator
from trainsentry.cli import main as cli_main
from trainsentry.config import ConfigError, Settings, validate_settings
from trainsentry.config.remediation import CordonSettings
from trainsentry.gateway.channels import build
from trainsentry.gateway.stages.services.cordon_cluster import with_node_condition
from trainsentry.notifiers.feishu.callback import CallbackRejected, CardAction, parse_callback
from trainsentry.notifiers.feishu.card import CardOptions, build_card

# The API calls the cordon stage makes, as the emulator records them; the chart's RBAC for
# gateway.remediation is checked against this file (tests/chart/test_rbac.py).
API_CALLS = Path(__file__).resolve().parent / "cordon_api_calls.json"


pytestmark = pytest.mark.e2e  # a real Prometheus per gateway (the evidence)


@pytest.fixture
async def cluster() -> AsyncIterator[KubeEmulator]:
    async with emulated_cluster() as emu:
        yield emu


@pytest.fixture
async def start(cluster: KubeEmulator, tmp_path: Path, db_url: str) -> AsyncIterator[Start]:
    async with gateways(cluster, tmp_path, db_url) as run:
        yield run


# a lemon: gpu-node-0's three falls off the bus (6 each, barely decayed) reach 15, each one
# fired by Prometheus; the job "big" runs on eight nodes (its status lists them)
LEMON = [fault(i, "gpu-node-0", None, 2 + i) for i in range(3)]
SPREAD = [
    fault(10 + i, f"gpu-node-{i}", None, 1, name="NodeFilesystemAlmostFull") for i in range(8)
]


def only_node(card: dict[str, Any]) -> dict[str, Any]:
    [node] = card["cordon"]["nodes"]
    return dict(node)


async def test_a_lemon_gets_one_card_and_approval_cordons_it(
    cluster: KubeEmulator,
    start: Start,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    running = await start(fired=LEMON)
    await running.post(*SPREAD, *LEMON[:2])
    assert running.cards() == []  # 12 < 15: not yet
    await running.post(LEMON[2])
    await running.gateway.settle()  # a second check sends nothing new
    cards = running.cards()
    assert len(cards) == 1, cards
    assert only_node(cards[0])["node"] == "gpu-node-0"
    assert "3 fell_off_bus" in only_node(cards[0])["summary"]
    assert only_node(cards[0])["jobs"] == ["ml/big"]
    card = build_card("cordon", cards[0], CardOptions(actions=True))
    values = [
        b["behaviors"][0]["value"]
        for row in card["body"]["elements"] if row.get("tag") == "column_set"
        for col in row["columns"] for b in col["elements"]
    ]  # fmt: skip
    assert [v["action"] for v in values] == ["cordon_approve", "cordon_dismiss"]
    assert not unschedulable(cluster, "gpu-node-0")

    answer = await running.press_answer(values[0], "ev-approve")
    assert answer["toast"]["content"] == "gpu-node-0: cordoned"
    redrawn = json.dumps(answer["card"]["data"])  # who approved, and no buttons left
    assert "Cordoned: gpu-node-0" in redrawn and "by alice" in redrawn
    assert "cordon_approve" not in redrawn
    assert unschedulable(cluster, "gpu-node-0")
    assert [e["reason"] for e in node_events(cluster, "gpu-node-0")] == ["Cordoned"]
    condition = job_condition(cluster, "big")
    assert condition is not None and condition["status"] == "True"
    assert "gpu-node-0" in condition["message"]
    assert job_condition(cluster, "small") is None
    # a replay of the signed press is acted on once; a second card never comes
    assert await running.press(values[0], "ev-approve") == "already handled"
    await running.gateway.settle()
    assert len(running.cards()) == 1

    # uncordon: the API wants the token; the CLI sends it
    url = running.server.make_url("/api/v1/nodes/gpu-node-0/uncordon")
    async with aiohttp.ClientSession() as http, http.post(url, json={"by": "bob"}) as answer:
        assert answer.status == 401
    monkeypatch.setenv("TRAINSENTRY_API_TOKEN", TOKEN)
    base = str(running.server.make_url("/"))
    argv = ["node", "uncordon", "gpu-node-0", "--by", "bob", "--gateway", base]
    assert await asyncio.to_thread(cli_main, argv) == 0
    assert "uncordoned by bob" in capsys.readouterr().out
    condition = job_condition(cluster, "big")
    assert condition is not None and condition["status"] == "False"
    assert not unschedulable(cluster, "gpu-node-0")
    assert [e["reason"] for e in node_events(cluster, "gpu-node-0")] == ["Cordoned", "Uncordoned"]
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


async def test_dismiss_does_nothing_and_no_new_card(cluster: KubeEmulator, start: Start) -> None:
    warm = fault(50, "gpu-node-0", None, 0.5, name="GPUTemperatureHigh")
    running = await start(fired=[*LEMON, warm])
    # a node trainsentry did not cordon is not its to uncordon
    url = running.server.make_url("/api/v1/nodes/gpu-node-1/uncordon")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"by": "bob"}, headers=headers) as answer:
            assert answer.status == 409
            assert "not cordoned by trainsentry" in (await answer.json())["error"]
        async with http.post(url, json={}, headers=headers) as answer:
            assert answer.status == 400
        bad = running.server.make_url("/api/v1/nodes/Not_A_Node/uncordon")
        async with http.post(bad, json={"by": "bob"}, headers=headers) as answer:
            assert answer.status == 400
    await running.post(*SPREAD, *LEMON)
    assert len(running.cards()) == 1
    answer = await running.press({"action": "cordon_dismiss", "node": "gpu-node-0"}, "ev-dismiss")
    assert answer == "gpu-node-0: dismissed"
    await running.post(warm)
    assert len(running.cards()) == 1
    assert not unschedulable(cluster, "gpu-node-0")
    assert node_events(cluster, "gpu-node-0") == []
    # an approve after the dismiss does nothing either
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-late")
    assert "nothing to decide" in answer
    assert not unschedulable(cluster, "gpu-node-0")


async def test_the_share_guard_holds(cluster: KubeEmulator, start: Start) -> None:
    running = await start(max_job_share=0.25, fired=LEMON)
    # "small" runs on two nodes: cordoning one of them would be half of it
    await list_nodes(cluster, "small", ["gpu-node-0", "gpu-node-1"])
    await running.post(*SPREAD, *LEMON)
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-share")
    assert "max_job_share" in answer and "ml/small" in answer
    assert not unschedulable(cluster, "gpu-node-0")


async def test_auto_mode_cordons_without_a_click_within_the_hourly_rate(
    cluster: KubeEmulator, start: Start
) -> None:
    lemons = [
        fault(100 + 10 * n + i, f"gpu-node-{n}", None, 1 + i) for n in (3, 4) for i in range(3)
    ]
    running = await start(cordon="auto", max_per_hour=1, max_job_share=1, fired=lemons)
    await running.post(*SPREAD, *lemons)
    cordoned = [n for n in ("gpu-node-3", "gpu-node-4") if unschedulable(cluster, n)]
    assert len(cordoned) == 1, cordoned  # the second is over the hourly limit: a card instead
    [card] = running.cards()  # the two nodes of one check share a card
    statuses = sorted(node["status"] for node in card["cordon"]["nodes"])
    assert statuses == ["cordoned", "recommended"]
    held = next(n for n in card["cordon"]["nodes"] if n["status"] == "recommended")
    assert "max_per_hour" in held["reason"]


async def test_off_mode_sends_nothing(cluster: KubeEmulator, start: Start) -> None:
    running = await start(cordon="off", fired=LEMON)
    await running.post(*SPREAD, *LEMON)
    assert running.cards() == []
    assert not unschedulable(cluster, "gpu-node-0")


def cordon_settings_of(raw: dict[str, Any]) -> CordonSettings | None:
    return validate_settings({"remediation": raw}).remediation


def test_bad_config_names_the_field() -> None:
    assert cordon_settings_of({}) is None  # no section: no cordon, no card
    settings = cordon_settings_of({"threshold": 30})
    assert settings is not None and settings.cordon == "approve"  # the default mode
    with pytest.raises(ConfigError, match=r"remediation\.cordon: "):
        cordon_settings_of({"cordon": "sometimes"})
    with pytest.raises(ConfigError, match=r"remediation\.max_job_share: "):
        cordon_settings_of({"max_job_share": 2})
    with pytest.raises(ConfigError, match=r"remediation\.treshold: "):
        cordon_settings_of({"treshold": 3})


async def test_auto_mode_leaves_a_node_under_an_infrastructure_incident_to_a_human(
    cluster: KubeEmulator, start: Start
) -> None:
    """Three nodes under leaf-7 fail together: the switch is suspected, so the lemon among
    them is not cordoned automatically; its card asks a human instead."""
    leaf = {n: {"leaf_switch": "leaf-7"} for n in ("gpu-node-5", "gpu-node-6", "gpu-node-7")}
    before = [fault(200 + i, "gpu-node-5", None, 3 + i) for i in range(2)]
    together = [fault(210 + i, f"gpu-node-{5 + i}", None, 0) for i in range(3)]
    running = await start(
        cordon="auto",
        max_job_share=1,
        topology={"levels": ["leaf_switch"], "nodes": leaf},
        fired=[*before, *together],
    )
    await running.post(*SPREAD, *before)
    await running.post(*together)
    assert not unschedulable(cluster, "gpu-node-5")
    [card] = running.cards()
    assert card["cordon"]["incident"] == "leaf_switch=leaf-7"
    assert only_node(card)["node"] == "gpu-node-5"
    assert only_node(card)["status"] == "recommended"
    assert "leaf_switch=leaf-7" in only_node(card)["reason"]
    # a human may still approve it (the incident guard is for automatic cordons only)
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-5"}, "ev-infra")
    assert answer == "gpu-node-5: cordoned"
    assert unschedulable(cluster, "gpu-node-5")


async def test_two_replicas_send_one_card(cluster: KubeEmulator, start: Start) -> None:
    a = await start(replica="a", fired=LEMON)
    b = await start(replica="b", fired=LEMON)
    await a.post(*SPREAD, *LEMON)
    assert a.gateway.cordon is not None and b.gateway.cordon is not None
    await asyncio.gather(*(g.gateway.cordon.run_once() for g in (a, b, a, b)))
    await asyncio.gather(a.gateway.settle(), b.gateway.settle())
    assert len(a.cards() + b.cards()) == 1


@pytest.mark.parametrize("node", ["Bad_Node", "", "a" * 254, "node\x00", 7])
def test_a_cordon_press_must_name_a_node(node: Any) -> None:
    body = json.dumps(
        {
            "schema": "2.0",
            "header": {"event_id": "ev-1", "token": VERIFICATION},
            "event": {
                "operator": {"open_id": "ou_alice"},
                "action": {"value": {"action": "cordon_approve", "node": node}},
            },
        }
    ).encode()
    with pytest.raises(CallbackRejected, match="not a node name") as caught:
        parse_callback({}, body, verification_token=VERIFICATION, now=time.time())
    assert caught.value.status == 400
    good = body.replace(json.dumps(node).encode(), b'"gpu-node-17"')
    parsed = parse_callback({}, good, verification_token=VERIFICATION, now=time.time())
    assert isinstance(parsed, CardAction)
    assert (parsed.node, parsed.action, parsed.alert_id) == ("gpu-node-17", "cordon_approve", 0)


async def test_the_feishu_app_posts_the_card_with_its_buttons(
    cluster: KubeEmulator, start: Start, db_url: str
) -> None:
    async with FeishuContractServer(apps={"cli_app": "app-secret"}, chats={"oc_infra"}) as feishu:
        settings = Settings.model_validate(
            {
                "channels": {
                    "feishu_app": {
                        "base_url": feishu.base_url,
                        "app_id": "cli_app",
                        "chats": {"oc_infra": ["P0", "P1", "P2", "P3"]},
                        "callback": {"path": CARD_PATH, "encrypt_key_env": "FEISHU_ENCRYPT_KEY"},
                    }
                }
            }
        )
        env = {
            "FEISHU_APP_SECRET": "app-secret",
            "FEISHU_VERIFICATION_TOKEN": VERIFICATION,
            "FEISHU_ENCRYPT_KEY": ENCRYPT_KEY,
        }
        channels = build(settings, env)
        try:
            running = await start(channels=dict(channels.notifiers), fired=LEMON)
            await running.post(*SPREAD, *LEMON)
            cards = [
                json.loads(m["content"])
                for m in feishu.messages.values()
                if m["receive_id"] == "oc_infra" and m["msg_type"] == "interactive"
            ]
            cordon = [c for c in cards if "cordon_approve" in json.dumps(c)]
            assert len(cordon) == 1, cards
            text = json.dumps(cordon[0])
            assert "Cordon recommended: gpu-node-0" in text
            assert '"node": "gpu-node-0"' in text and "ml/big" in text
            assert "cordon_dismiss" in text
        finally:
            assert channels.built is not None
            await channels.built.aclose()


async def test_a_refused_cordon_leaves_the_recommendation_out(
    cluster: KubeEmulator, start: Start
) -> None:
    running = await start(fired=LEMON)
    await running.post(*SPREAD, *LEMON)
    cluster.inject_fault("patch", "nodes", 403)  # RBAC says no: not retried
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-403")
    assert answer == "gpu-node-0 not cordoned: Kubernetes API answered 403"
    assert not unschedulable(cluster, "gpu-node-0")
    assert node_events(cluster, "gpu-node-0") == []
    # still recommended: a second press (a new event) cordons it
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-again")
    assert answer == "gpu-node-0: cordoned"
    assert unschedulable(cluster, "gpu-node-0")


async def test_a_node_gone_from_the_cluster_is_answered_without_a_get(
    cluster: KubeEmulator, start: Start
) -> None:
    """RBAC grants nodes `patch` only: a vanished Node is told by the patch's 404."""
    running = await start(fired=LEMON)
    await running.post(*SPREAD, *LEMON)
    async with cluster.delete("/api/v1/nodes/gpu-node-0") as reply:
        assert reply.status == 200, await reply.text()
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-gone")
    assert answer == "gpu-node-0 not cordoned: no node gpu-node-0 in the cluster"
    assert node_events(cluster, "gpu-node-0") == []
    nodes = {c.resource for c in cluster.recorded_calls(exclude_agent="kmock/") if c.verb == "get"}
    assert "nodes" not in nodes


async def test_the_share_counts_the_nodes_the_trainingjob_lists(
    cluster: KubeEmulator, start: Start
) -> None:
    """The job's status listed only the lemon (1 of 1: refused); once the operator has
    written the job's eight nodes into its status, the share is 1 of 8 and the cordon goes
    ahead."""
    falls = [fault(300 + i, "gpu-node-0", None, 2 + i) for i in range(3)]
    await list_nodes(cluster, "small", ["gpu-node-0"])
    running = await start(max_job_share=0.25, fired=falls)
    await running.post(*falls)
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-one")
    assert "1 of its 1 nodes" in answer
    await list_nodes(cluster, "small", [f"gpu-node-{i}" for i in range(8)])
    answer = await running.press({"action": "cordon_approve", "node": "gpu-node-0"}, "ev-eight")
    assert answer == "gpu-node-0: cordoned"
    assert unschedulable(cluster, "gpu-node-0")
    assert job_condition(cluster, "small") is not None


def test_the_operator_keeps_the_node_cordoned_condition() -> None:
    from trainsentry.operator.status import Condition, merge_conditions

    mine = with_node_condition([], True, "node gpu-node-0 cordoned by ou_alice", "now")
    merged = merge_conditions(mine, [Condition("RulesReady", True, "Applied")], "later", 2)
    assert [c["type"] for c in merged] == ["RulesReady", "NodeCordoned"]
    assert merged[1] == mine[0]


ESCAPING_NODE = "../namespaces/kube-system/secrets/x"


async def test_a_node_label_that_is_no_node_name_never_reaches_the_api(
    cluster: KubeEmulator, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 32, finding 1: alert labels are anyone's. A "node" of `../namespaces/...`
    with enough faults to be cordoned is skipped with a logged reason (no card, no API
    request naming it: `PATCH /api/v1/nodes/../namespaces/kube-system/secrets/x` would be
    a patch of that Secret), and the check goes on: the real lemon beside it is cordoned."""
    cluster.declare("v1/secrets", "Secret")
    await create(
        cluster,
        "/api/v1/namespaces/kube-system/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}, "data": {}},
    )
    forged = [fault(400 + i, ESCAPING_NODE, None, 2 + i) for i in range(3)]
    lemon = [fault(410 + i, "gpu-node-3", None, 2 + i) for i in range(3)]
    running = await start(cordon="auto", max_job_share=1, max_per_hour=5, fired=[*forged, *lemon])
    await running.post(*SPREAD, *forged, *lemon)
    await running.gateway.settle()
    ours = cluster.sent_paths(exclude_agent="kmock/")
    assert not [p for p in ours if "kube-system" in p or "secrets" in p or ".." in p], ours
    secret = cluster.get_live("v1/secrets", "kube-system", "x")
    assert secret is not None and "spec" not in secret
    assert unschedulable(cluster, "gpu-node-3")  # the check went on
    assert [n["node"] for c in running.cards() for n in c["cordon"]["nodes"]] == ["gpu-node-3"]
    assert "not a valid node name" in caplog.text and ESCAPING_NODE in caplog.text
