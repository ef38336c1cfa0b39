"""Silences against a real Alertmanager (`prometheus-alertmanager`, gossip off)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.support.realservers import logs_on_error, start_alertmanager
from trainsentry.notifiers.alertmanager import SilenceClient, matchers, silence_body
from trainsentry.notifiers.base import PermanentError

LABELS = {
    "alertname": "GpuXidError",
    "priority": "P0",
    "trainingjob": "llama-70b",
    "namespace": "team-a",
    "node": "gpu-node-07",
    "gpu": "3",
    "empty": "",
}
CONFIG = {"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}


def test_silence_body_is_exact_match_on_labels() -> None:
    t0 = datetime(2026, 11, 22, 3, tzinfo=UTC)
    body = silence_body(LABELS, starts_at=t0, duration=timedelta(hours=4), created_by="ts",
                        comment="c")  # fmt: skip
    assert body["startsAt"] == "2026-11-22T03:00:00Z" and body["endsAt"] == "2026-11-22T07:00:00Z"
    assert {m["name"] for m in body["matchers"]} == set(LABELS) - {"empty"}
    assert all(m["isEqual"] and not m["isRegex"] for m in body["matchers"])
    assert [m["name"] for m in matchers(LABELS, ["node", "gpu", "missing"])] == ["node", "gpu"]
    with pytest.raises(PermanentError):
        matchers({"empty": ""})


@pytest.mark.e2e
async def test_silence_created_in_real_alertmanager_suppresses_the_alert(tmp_path: Path) -> None:
    with start_alertmanager(tmp_path, CONFIG) as am, logs_on_error(am):
        async with httpx.AsyncClient(base_url=am.url, timeout=5) as http:
            alert = {"labels": {k: v for k, v in LABELS.items() if v}, "annotations": {}}
            other = {"labels": {**alert["labels"], "gpu": "4"}, "annotations": {}}
            assert (await http.post("/api/v2/alerts", json=[alert, other])).status_code == 200
            client = SilenceClient(am.url)
            try:
                silence_id = await client.create_silence(
                    LABELS, timedelta(hours=1), who="ou_alice", comment="ack from card"
                )
                stored = await client.get_silence(silence_id)
                states = {}
                for _ in range(50):
                    alerts = (await http.get("/api/v2/alerts")).json()
                    states = {a["labels"]["gpu"]: a["status"] for a in alerts}
                    if states.get("3", {}).get("state") == "suppressed":
                        break
                    await asyncio.sleep(0.1)
                await client.expire_silence(silence_id)
                expired = await client.get_silence(silence_id)
                with pytest.raises(PermanentError):
                    await client.create_silence({"x": ""}, timedelta(hours=1), who="ou_alice")
            finally:
                await client.aclose()
    assert stored["status"]["state"] == "active"
    assert stored["createdBy"] == "trainsentry (ou_alice)" and stored["comment"] == "ack from card"
    ends = datetime.fromisoformat(stored["endsAt"].replace("Z", "+00:00"))
    assert timedelta(minutes=59) < ends - datetime.now(UTC) <= timedelta(hours=1)
    assert states["3"]["state"] == "suppressed" and states["3"]["silencedBy"] == [silence_id]
    assert states["4"]["state"] == "active"  # a different GPU is not silenced
    assert expired["status"]["state"] == "expired"
