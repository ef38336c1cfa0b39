"""Card JSON 2.0 rendering: required fields, colours, trimming, storms."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.notifiers.helpers import alert_payload
from tests.support.feishu_server import card_problems
from trainsentry.alerts import Alert, AlertStatus, Priority
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.storm import StormEntry, build_summary
from trainsentry.notifiers.feishu.card import (
    MAX_BOT_BODY_BYTES,
    CardOptions,
    alert_card,
    build_card,
    card_bytes,
    storm_card,
)
from trainsentry.notifiers.payload_contract import parse_payload


def _texts(card: dict[str, Any]) -> str:
    return json.dumps(card, ensure_ascii=False)


def _buttons(card: dict[str, Any]) -> list[dict[str, Any]]:
    """The buttons in the card's button rows, the ack form's included."""
    found = []
    for element in card["body"]["elements"]:
        for row in [element, *element.get("elements", [])]:
            for column in row.get("columns", []):
                found.extend(e for e in column["elements"] if e["tag"] == "button")
    return found


@pytest.mark.parametrize(
    ("priority", "status", "template"),
    [
        ("P0", "firing", "red"),
        ("P1", "firing", "orange"),
        ("P2", "firing", "yellow"),
        ("P3", "firing", "blue"),
        ("P0", "resolved", "green"),
        ("P3", "resolved", "green"),
    ],
)
def test_header_colour(priority: str, status: str, template: str) -> None:
    card = alert_card(parse_payload(alert_payload(priority, status)))
    assert card["header"]["template"] == template
    assert card_problems(card) == []


def test_alert_card_has_the_fields_people_need() -> None:
    now = datetime(2026, 11, 22, 1, 30, tzinfo=UTC)
    payload = parse_payload(alert_payload(mentions=["ou_alice", "all"], count=3))
    card = alert_card(payload, CardOptions(actions=True), now=now)
    assert card_problems(card) == []
    text = _texts(card)
    assert card["schema"] == "2.0"
    assert card["header"]["title"]["content"].startswith("[P0] FIRING: GpuXidError")
    for needle in (
        "team-a/llama-70b", "**Rank:** 27", "**Node:** gpu-node-07", "**GPU:** 3",
        "**Value:** 79", "2026-11-22 01:00:00 UTC (30m ago)", "hardware fault",
        "**Count:** 3", "<at id=ou_alice></at>", "component=gpu",
    ):  # fmt: skip
        assert needle in text, needle
    assert "<at id=all>" not in text  # mentions only for configured open_ids
    urls = [b["behaviors"][0].get("default_url") for b in _buttons(card)]
    assert "https://runbooks.example/gpu-xid" in urls
    assert "https://grafana.example/d/job?var-job=llama-70b" in urls
    callbacks = [
        b["behaviors"][0]["value"]
        for b in _buttons(card)
        if b["behaviors"][0]["type"] == "callback"
    ]
    assert {"action": "ack", "alert_id": 42} in callbacks
    assert {"action": "silence", "alert_id": 42, "duration_s": 3600} in callbacks


def test_a_title_names_the_job_else_the_node() -> None:
    """A cluster-wide alert (no TrainingJob; its scrape `job` is "dcgm-exporter") is titled by
    its node; an alert of a job, by the job."""
    payload = alert_payload()
    assert _title_of(payload).endswith("GpuXidError — team-a/llama-70b")
    labels = {k: v for k, v in payload["labels"].items() if k not in ("trainingjob", "namespace")}
    cluster = {**payload, "labels": {**labels, "job": "dcgm-exporter"}}
    assert _title_of(cluster).endswith("GpuXidError — gpu-node-07")
    del cluster["labels"]["node"]
    assert _title_of(cluster).endswith("FIRING: GpuXidError")


def _title_of(payload: dict[str, Any]) -> str:
    card = alert_card(parse_payload(payload), CardOptions())
    return str(card["header"]["title"]["content"])


def test_no_action_buttons_without_app_or_when_resolved_or_acked() -> None:
    def callbacks(card: dict[str, Any]) -> list[Any]:
        return [b for b in _buttons(card) if b["behaviors"][0]["type"] == "callback"]

    assert callbacks(alert_card(parse_payload(alert_payload()))) == []
    resolved = parse_payload(alert_payload(status="resolved", ends_at="2026-11-22T02:30:00Z"))
    card = alert_card(resolved, CardOptions(actions=True))
    assert callbacks(card) == []
    assert "lasted 1h30m" in _texts(card)
    acked = parse_payload(alert_payload(acked_by="ou_bob", silenced_until="2026-11-22T05:00:00Z"))
    card = alert_card(acked, CardOptions(actions=True))
    assert callbacks(card) == []
    assert "Acknowledged by ou_bob" in _texts(card)  # a name, never a mention
    assert "<at" not in _texts(card)
    assert "Silenced until 2026-11-22 05:00 UTC" in _texts(card)


def test_label_values_cannot_inject_markup() -> None:
    payload = alert_payload()
    payload["labels"]["node"] = "<at id=all></at>"
    card = alert_card(parse_payload(payload))
    assert "<at id=all>" not in _texts(card)
    assert "&lt;at id=all&gt;" in _texts(card)


# Feishu's mention forms (card markdown and text messages) and what makes text clickable or
# styled in card markdown: none may form from text the gateway did not write.
HOSTILE = (
    "<at id=all></at>",
    "<at ids=ou_a,ou_b></at>",
    "<at email=boss@example.com></at>",
    '<at user_id="all"></at>',
    "[ACK HERE](https://evil.example/ack)",
    "![i](img_v2_1)",
    "<a href='https://evil.example'>x</a>",
    "<link url='https://evil.example'>y</link>",
    "<font color='red'>URGENT</font>",
    "<text_tag color='red'>P0</text_tag>",
)
MARKUP = ("<at", "](", "![", "<a ", "<a>", "<link", "<font color='red'", "<text_tag")


def _markdown(card: dict[str, Any]) -> str:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("tag") == "markdown":
                found.append(node["content"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(card)
    return "\n".join(found)


def test_outside_text_forms_no_mention_link_or_tag_on_any_card() -> None:
    evil = " ".join(HOSTILE)
    alert = alert_payload(
        mentions=["all", "ou_x></at><at id=all", "ou_owner"],
        acked_by=evil, ack_comment=evil, on_call=evil, diagnosis=evil, reason=evil,
        annotations={"summary": evil, "description": evil, "value": evil},
    )  # fmt: skip
    alert["labels"] = {"node": evil, "extra": evil, evil: "key"}
    storm = _storm_payload(
        {"total": 2, "items": [{"alertname": evil, "node": evil, "summary": evil}],
         "by_alertname": {evil: 2}, "by_node": {evil: 2}, "by_gpu": {evil: 1}}
    )  # fmt: skip
    handoff = {"priority": "P3", "status": "firing",
               "handoff": {"schedule": evil, "to": evil, "layer": evil, "previous": evil,
                           "until": evil, "next": [{"name": evil, "layer": evil}]}}  # fmt: skip
    cordon = {
        "priority": "P1",
        "status": "firing",
        "cordon": {
            "nodes": [
                {"node": "gpu-1", "summary": evil, "jobs": [evil], "reason": evil},
                {"node": "gpu-2", "summary": evil, "status": "cordoned", "by": evil},
            ],
            "incident": evil,
            "approvable": True,
        },
    }
    for kind, payload in (("alert", alert), ("storm", storm), ("handoff", handoff),
                          ("cordon", cordon)):  # fmt: skip
        card = build_card(kind, parse_payload(payload), CardOptions(actions=True))
        text = _markdown(card)
        assert card_problems(card) == []
        for needle in MARKUP:
            assert needle not in text.replace("<at id=ou_owner></at>", ""), (kind, needle, text)
        assert "&#91;ACK HERE&#93;" in text, kind  # shown as words
    # the configured open_id alone is mentioned
    assert _markdown(build_card("alert", parse_payload(alert))).count("<at ") == 1


def test_link_buttons_take_only_http_urls() -> None:
    bad = ("javascript:alert(1)", "JavaScript:alert(1)", "lark://applink.feishu.cn/x",
           "data:text/html,x", "//evil.example", "https://a b.example", "http://[")  # fmt: skip
    for url in bad:
        payload = alert_payload(annotations={"runbook_url": url, "dashboard_url": url})
        payload["generator_url"] = payload["grafana_url"] = url
        card = alert_card(parse_payload(payload))
        assert _buttons(card) == [], url
        storm = storm_card(parse_payload(_storm_payload({"total": 1, "list_url": url})))
        assert _buttons(storm) == [], url
    good = alert_payload(annotations={"runbook_url": " https://runbooks.example/x "})
    urls = [b["behaviors"][0]["default_url"] for b in _buttons(alert_card(parse_payload(good)))]
    assert urls == ["https://runbooks.example/x", "https://grafana.example/d/job?var-job=llama-70b"]


def test_oversized_alert_is_trimmed_and_says_so() -> None:
    payload = alert_payload(annotations={"summary": "s", "description": "x" * 100_000})
    payload["labels"].update({f"extra_{i}": "y" * 100 for i in range(500)})
    card = alert_card(parse_payload(payload))
    assert card_bytes(card) <= MAX_BOT_BODY_BYTES - 256
    assert "more labels not shown" in _texts(card)
    assert card_problems(card) == []


def _storm_payload(summary: dict[str, Any], priority: str = "P0") -> dict[str, Any]:
    return {
        "priority": priority,
        "status": "firing",
        "event": "started",
        "job": "team-a/llama-70b",
        "reason": "alert storm: 2000 new alerts",
        "rule_id": "storm",
        "storm": summary,
        "labels": {},
    }


def test_storm_of_2000_from_the_policy_fits_20kb() -> None:
    policy = load_policy(overrides={"storm": {"top_lines": 100}})
    start = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
    entries = []
    for i in range(2000):
        labels = {
            "alertname": f"GpuXid{i % 7}",
            "trainingjob": "llama-70b",
            "namespace": "team-a",
            "node": f"gpu-node-{i:04d}",
            "gpu": str(i % 8),
            "priority": "P0",
        }
        alert = Alert(
            fingerprint=f"fp{i:05d}",
            status=AlertStatus.FIRING,
            labels=labels,
            annotations={"summary": f"XID on node {i} " + "detail " * 10},
            starts_at=start,
            ends_at=None,
        )
        entries.append(StormEntry(alert, Priority.P0, AlertStatus.FIRING, start, alert_id=i))
    summary = build_summary(
        entries, policy, job="team-a/llama-70b", start=start, end=start + timedelta(minutes=2)
    )
    assert summary["total"] == 2000
    card = build_card("storm", parse_payload(_storm_payload(summary)))
    body = json.dumps({"msg_type": "interactive", "card": card, "timestamp": "1", "sign": "x" * 44},
                      ensure_ascii=False, separators=(",", ":"))  # fmt: skip
    assert len(body.encode()) <= 20 * 1024
    assert card_problems(card) == []
    text = _texts(card)
    assert "2000 alerts" in card["header"]["title"]["content"]
    assert "more alerts not shown" in text
    [by_node] = [
        e["content"] for e in card["body"]["elements"] if "**By node**" in e.get("content", "")
    ]
    counts = [int(line.rsplit(": ", 1)[1]) for line in by_node.splitlines()[1:] if ": " in line]
    assert sum(counts) == 2000  # the policy folds the tail into "(other)"; nothing lost
    [listed] = [
        e["content"] for e in card["body"]["elements"] if "**Alerts**" in e.get("content", "")
    ]
    shown = listed.count("\n- P0")
    cut = int(listed.rsplit("- … ", 1)[1].split(" ")[0])
    assert shown == len(summary["items"]) and shown + cut == 2000


def test_storm_with_2000_listed_items_fits_and_counts_the_cut() -> None:
    items = [
        {"alert_id": i, "alertname": "NcclTimeout", "priority": "P1", "node": f"n{i}",
         "rank": str(i), "summary": "collective stuck " * 5}
        for i in range(2000)
    ]  # fmt: skip
    summary = {"total": 2000, "items": items, "by_alertname": {"NcclTimeout": 2000}}
    card = storm_card(parse_payload(_storm_payload(summary, "P1")))
    assert card_bytes(card) <= MAX_BOT_BODY_BYTES - 256
    text = _texts(card)
    shown = sum(1 for item in items if f"node {item['node']}," in text)
    match = text.split("- … ")[-1].split(" more alerts not shown")[0]
    assert shown > 10 and shown + int(match) == 2000
    assert card["header"]["template"] == "orange"


def test_small_storm_is_not_trimmed() -> None:
    summary = {"total": 3, "items": [{"alertname": "A", "node": "n1"}] * 3, "by_node": {"n1": 3}}
    card = storm_card(parse_payload(_storm_payload(summary)))
    assert "not shown" not in _texts(card)


def test_an_incidents_card_counts_and_names_its_nodes_and_links_its_page() -> None:
    """Issue 34: the card of a 20-node incident says so in its title, names the first nodes
    with "and N more", and links the incident's page; a lone alert's card does not change."""
    from trainsentry.notifiers.feishu.card import alert_card

    names = [f"gpu-node-{i:02d}" for i in range(1, 11)]
    incident = {
        "id": 12, "status": "firing", "alerts": 20, "firing": 20, "resolved": 0,
        "nodes": 20, "node_names": names, "gpus": 0, "gpu_names": [], "untracked": 0,
        "cause": "NodeFilesystemSpaceLow", "url": "https://ts.example/ui/incidents/12",
    }  # fmt: skip
    card = alert_card(parse_payload(alert_payload("P1", incident=incident)))
    title = card["header"]["title"]["content"]
    assert title.endswith("· 20 nodes"), title
    text = json.dumps(card, ensure_ascii=False)
    assert "20 (20 firing, 0 resolved)" in text
    assert "gpu-node-01, gpu-node-02" in text and "and 10 more" in text
    assert "https://ts.example/ui/incidents/12" in text and card_problems(card) == []
    lone = {**incident, "alerts": 1, "firing": 1, "nodes": 1, "node_names": ["gpu-node-07"]}
    plain = alert_card(parse_payload(alert_payload("P1")))
    alone = alert_card(parse_payload(alert_payload("P1", incident={**lone, "url": ""})))
    assert alone == plain, "a lone alert's incident: the card as it always was"


def test_a_storm_card_lists_the_incidents_it_folded() -> None:
    summary = {"total": 30, "firing": 30, "resolved": 0, "by_alertname": {"DiskFull": 30},
               "by_incident": {"#7 DiskFull": 25, "#9 NodeOOMKills": 5}}  # fmt: skip
    payload = {"priority": "P1", "status": "firing", "job": "ml/llama-70b", "storm": summary}
    text = json.dumps(storm_card(parse_payload(payload)), ensure_ascii=False)
    assert "By incident" in text and "#7 DiskFull: 25" in text and "#9 NodeOOMKills: 5" in text
    assert "trainingjob:" not in text


def test_an_hca_port_is_shown_as_an_hca_port_never_as_a_gpu() -> None:
    """Issue 44: node_exporter's IB series carry `device` (the HCA) and `port`; the card
    showed "GPU: mlx5_0" and counted an incident's HCAs under "GPUs"."""
    labels = {
        "alertname": "IBPhysicalLinkDown", "priority": "P0", "component": "fabric",
        "node": "gpu-node-00", "device": "mlx5_0", "port": "1",
    }  # fmt: skip
    incident = {
        "id": 7, "status": "firing", "alerts": 3, "firing": 3, "resolved": 0, "nodes": 1,
        "node_names": ["gpu-node-00"], "gpus": 0, "gpu_names": [], "untracked": 0,
        "ports": 3, "port_names": ["gpu-node-00 mlx5_0 port 1", "gpu-node-00 mlx5_1 port 1"],
        "cause": "IBPhysicalLinkDown",
    }  # fmt: skip
    said = {"summary": "IB link down on gpu-node-00 mlx5_0 port 1", "description": "Down."}
    payload = alert_payload(
        "P0", alertname="IBPhysicalLinkDown", labels=labels, incident=incident, annotations=said
    )
    text = _texts(alert_card(parse_payload(payload)))
    assert "GPU" not in text, text
    assert "**HCA:** mlx5_0 port 1" in text
    assert (
        "**HCA ports:** 3: gpu-node-00 mlx5_0 port 1, gpu-node-00 mlx5_1 port 1 and 1 more" in text
    )
    # dcgm-exporter's `device` (nvidia3) is still a GPU
    gpu = {**labels, "alertname": "GPUFellOffBus", "component": "gpu", "device": "nvidia3"}
    del gpu["port"]
    assert "**GPU:** nvidia3" in _texts(alert_card(parse_payload(alert_payload(labels=gpu))))
