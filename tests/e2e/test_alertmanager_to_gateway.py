"""A real Alertmanager posts to the real gateway process: alerts arrive, are stored, resolve."""

from __future__ import annotations

import json
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.gateway_process import start_gateway
from tests.support.realservers import http_json, logs_on_error, start_alertmanager, wait_for

pytestmark = pytest.mark.e2e
TOKEN = "am-token-123"


def am_config(gateway_url: str, group_interval: str = "1s") -> dict[str, Any]:
    return {
        "route": {
            "receiver": "trainsentry",
            "group_by": ["alertname", "trainingjob"],
            "group_wait": "0s",
            "group_interval": group_interval,
            "repeat_interval": "1s",
        },
        "receivers": [
            {
                "name": "trainsentry",
                "webhook_configs": [
                    {
                        "url": f"{gateway_url}/api/v1/alertmanager",
                        "send_resolved": True,
                        "http_config": {"authorization": {"type": "Bearer", "credentials": TOKEN}},
                    }
                ],
            }
        ],
    }


def post_am_alerts(am_url: str, alerts: list[dict[str, Any]]) -> None:
    http_json(f"{am_url}/api/v2/alerts", alerts)


def am_alert(node: str, ends_at: datetime | None = None) -> dict[str, Any]:
    now = datetime.now(UTC)
    alert: dict[str, Any] = {
        "labels": {
            "alertname": "DCGMXidFellOffBus",
            "priority": "P0",
            "trainingjob": "llama",
            "namespace": "ml",
            "node": node,
        },
        "annotations": {"summary": f"GPU fell off the bus on {node}"},
        "startsAt": (now - timedelta(seconds=30)).isoformat(),
    }
    if ends_at is not None:
        alert["endsAt"] = ends_at.isoformat()
    return alert


def test_alertmanager_delivers_stores_and_resolves(tmp_path: Path, db_url: str) -> None:
    console = tmp_path / "console.jsonl"
    with start_gateway(tmp_path, db_url, token=TOKEN, console_file=console) as gateway:
        with start_alertmanager(tmp_path, am_config(gateway.url)) as am, logs_on_error(am, gateway):
            post_am_alerts(am.url, [am_alert("gpu-01"), am_alert("gpu-02")])

            def stored(status: str) -> list[dict[str, Any]] | None:
                items = http_json(f"{gateway.url}/api/v1/alerts?status={status}", token=TOKEN)[
                    "items"
                ]
                # Priorities are written by the planning stage after intake stored the alert.
                planned = all(a["priority"] is not None for a in items)
                return items if len(items) == 2 and planned else None

            firing = wait_for(lambda: stored("firing"), 20, "two firing alerts, planned")
            assert {a["labels"]["node"] for a in firing} == {"gpu-01", "gpu-02"}
            assert {a["priority"] for a in firing} == {"P0"}
            now = datetime.now(UTC)
            post_am_alerts(am.url, [am_alert(n, ends_at=now) for n in ("gpu-01", "gpu-02")])
            resolved = wait_for(lambda: stored("resolved"), 20, "two resolved alerts")
            assert all(a["resolved_at"] for a in resolved)
            ids = {a["id"] for a in resolved}
            assert ids == {a["id"] for a in firing}  # the same occurrences, now resolved
            # one Alertmanager group (alertname, trainingjob): one incident, its card when it
            # fires and when it resolves (the second node a member: no card of its own)
            lines = wait_for(
                lambda: (lambda ls: ls if len(ls) == 2 else None)(
                    console.read_text().splitlines() if console.exists() else []
                ),
                10,
                "two console notifications",
            )
            payloads = [json.loads(line)["payload"] for line in lines]
            assert [p["event"] for p in payloads] == ["firing", "resolved"]
            assert payloads[-1]["incident"]["alerts"] == 2


def test_unchanged_alert_repeated_by_alertmanager_notifies_once(tmp_path: Path) -> None:
    """group_interval 1s + repeat_interval 1s: Alertmanager re-sends the same firing alert
    every second; the gateway stores one occurrence and sends one notification."""
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    with start_gateway(tmp_path, db_url, token=TOKEN) as gateway:
        with start_alertmanager(tmp_path, am_config(gateway.url)) as am, logs_on_error(am, gateway):
            post_am_alerts(am.url, [am_alert("gpu-07")])

            def receipts() -> float:
                text = urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5).read().decode()
                total = 0.0
                for line in text.splitlines():
                    if line.startswith("trainsentry_webhook_receipts_total{"):
                        total += float(line.rsplit(" ", 1)[1])
                return total

            wait_for(lambda: receipts() >= 4, 30, "Alertmanager to repeat the notification")
            items = http_json(f"{gateway.url}/api/v1/alerts", token=TOKEN)["items"]
            assert len(items) == 1
            sent = http_json(f"{gateway.url}/api/v1/notifications", token=TOKEN)["items"]
            assert [n["payload"]["event"] for n in sent] == ["firing"]


def receipt_outcomes(gateway_url: str) -> dict[str, float]:
    """trainsentry_webhook_receipts_total by outcome, from the gateway's /metrics."""
    text = urllib.request.urlopen(f"{gateway_url}/metrics", timeout=5).read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('trainsentry_webhook_receipts_total{outcome="'):
            outcome = line.split('"', 2)[1]
            found[outcome] = float(line.rsplit(" ", 1)[1])
    return found


def test_a_group_alertmanager_repeats_unchanged_is_recognised(tmp_path: Path) -> None:
    """Issue 34 item 5, with Alertmanager's own webhooks: 50 alerts of one group, repeated
    every second (repeat_interval 1s). The repeats are answered as unchanged resends: no
    policy work, no notification, every alert planned once."""
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    with start_gateway(tmp_path, db_url, token=TOKEN) as gateway:
        with start_alertmanager(tmp_path, am_config(gateway.url)) as am, logs_on_error(am, gateway):
            post_am_alerts(am.url, [am_alert(f"gpu-{n:02d}") for n in range(50)])

            def planned() -> list[dict[str, Any]] | None:
                items = http_json(f"{gateway.url}/api/v1/alerts?limit=100", token=TOKEN)["items"]
                done = len(items) == 50 and all(a["priority"] for a in items)
                return items if done else None

            wait_for(planned, 30, "50 alerts stored and planned")
            wait_for(
                lambda: receipt_outcomes(gateway.url).get("resend", 0) >= 1,
                30,
                "Alertmanager to repeat the group",
            )
            sent = http_json(f"{gateway.url}/api/v1/notifications?limit=1000", token=TOKEN)
            seen = receipt_outcomes(gateway.url)
            wait_for(
                lambda: receipt_outcomes(gateway.url).get("resend", 0) >= seen["resend"] + 2,
                30,
                "two more repeats",
            )
            outcomes = receipt_outcomes(gateway.url)
            assert outcomes.get("stored", 0) == seen.get("stored", 0), "nothing new recorded"
            again = http_json(f"{gateway.url}/api/v1/notifications?limit=1000", token=TOKEN)
            assert again["items"] == sent["items"], "the repeats notified nothing"
            items = planned() or []
            assert {a["labels"]["node"] for a in items} == {f"gpu-{n:02d}" for n in range(50)}


def test_truncated_webhook_is_completed_from_alertmanager_api(tmp_path: Path) -> None:
    """`max_alerts: 3` makes Alertmanager cut the list; the gateway fetches the rest."""
    import yaml

    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    config = am_config("http://127.0.0.1:9")  # placeholder until the gateway's port is known
    with start_alertmanager(tmp_path, config) as am:
        env = {"TRAINSENTRY_ALERTMANAGER_URL": am.url}
        with start_gateway(tmp_path, db_url, token=TOKEN, env=env) as gateway:
            real = am_config(gateway.url)
            real["receivers"][0]["webhook_configs"][0]["max_alerts"] = 3
            (am.workdir / "alertmanager.yml").write_text(yaml.safe_dump(real))
            urllib.request.urlopen(
                urllib.request.Request(f"{am.url}/-/reload", method="POST"), timeout=5
            ).close()
            with logs_on_error(am, gateway):
                # A silenced alert is never notified: completing the group must not bring it in.
                now = datetime.now(UTC)
                silence = {
                    "matchers": [{"name": "node", "value": "gpu-10", "isRegex": False}],
                    "startsAt": now.isoformat(),
                    "endsAt": (now + timedelta(hours=1)).isoformat(),
                    "createdBy": "test",
                    "comment": "maintenance",
                }
                http_json(f"{am.url}/api/v2/silences", silence)
                post_am_alerts(am.url, [am_alert(f"gpu-{n:02d}") for n in range(11)])

                def stored() -> list[dict[str, Any]] | None:
                    items = http_json(f"{gateway.url}/api/v1/alerts?limit=100", token=TOKEN)[
                        "items"
                    ]
                    return items if len(items) >= 10 else None

                wait_for(stored, 30, "all 10 alerts, 7 of them fetched from the API")
                time.sleep(2)  # a completion that wrongly took the silenced one would be in
                items = stored() or []
                assert {a["labels"]["node"] for a in items} == {f"gpu-{n:02d}" for n in range(10)}
                metrics = urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5).read()
                cut = next(
                    float(line.rsplit(b" ", 1)[1])
                    for line in metrics.splitlines()
                    if line.startswith(b"trainsentry_webhook_truncated_alerts_total ")
                )
                # 7 left out of each truncated webhook (Alertmanager may have re-sent it)
                assert cut >= 7 and cut % 7 == 0


def test_the_group_keys_tests_build_are_the_ones_alertmanager_sends(tmp_path: Path) -> None:
    """The test factory's groupKey (webhook_factory.am_group_key: the incident key by
    default, issue 34) is what a real Alertmanager sends under the shipped route (its
    group_by and its child routes by priority) and under a route of our own."""
    import yaml

    from tests.support.receiver import ThreadedReceiver
    from tests.support.webhook_factory import am_group_key, shipped_route

    with ThreadedReceiver() as receiver:
        route = dict(shipped_route(), receiver="rec", group_wait="0s", group_interval="1s")
        route["routes"] = [
            *[dict(child, group_wait="0s") for child in route.get("routes", ())],
            {"matchers": ['severity="page"'], "group_by": ["alertname", "job"]},
        ]
        config = {
            "route": route,
            "receivers": [{"name": "rec", "webhook_configs": [{"url": receiver.url}]}],
        }
        labels = [
            {"alertname": "NodeFilesystemSpaceLow", "namespace": "ml", "trainingjob": "llama",
             "node": "gpu-node-01", "priority": "P1"},
            {"alertname": "GPUFellOffBus", "namespace": "ml", "trainingjob": "llama",
             "node": "gpu-node-02", "priority": "P0"},
            {"alertname": "DiskFull", "namespace": "ml", "trainingjob": "llama", "priority": "P2"},
            {"alertname": "X", "job": "node \"exporter\"", "severity": "page"},
        ]  # fmt: skip
        with start_alertmanager(tmp_path, yaml.safe_load(yaml.safe_dump(config))) as am:
            post_am_alerts(am.url, [{"labels": item} for item in labels])
            wait_for(lambda: len(receiver.bodies) >= len(labels), 30, "one webhook per group")
    sent = {body["commonLabels"]["alertname"]: body["groupKey"] for body in receiver.bodies}
    assert sent["NodeFilesystemSpaceLow"] == am_group_key(labels[0])
    assert sent["GPUFellOffBus"] == am_group_key(labels[1])
    assert sent["DiskFull"] == am_group_key(labels[2])  # no child route: the root's key
    assert sent["X"] == am_group_key(
        labels[3], group_by=["alertname", "job"], matchers=['severity="page"']
    )
