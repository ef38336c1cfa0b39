"""The demo's maintenance window: after the incident, gpu-node-17 goes into maintenance for
its GPU swap. The node-not-ready alert the swap raises is stored and archived but muted (no
card, no call); the window's end nears with it still firing, so that is announced; the
window ends with it still firing, so it is sent then; then it resolves."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import aiohttp

from trainsentry.gateway.public import Gateway, Off

NODE = "gpu-node-17"
WINDOW = timedelta(minutes=30)
SPAN = WINDOW + timedelta(minutes=5)  # the window's story, from its start to the resolve


def _body(status: str, starts_at: datetime, ends_at: datetime | None) -> dict[str, Any]:
    labels = {
        "alertname": "NodeNotReady",
        "node": NODE,
        "priority": "P1",
        "component": "node",
        "namespace": "ml",
        "trainingjob": "llama-70b",
    }
    alert = {
        "status": status,
        "labels": labels,
        "annotations": {"summary": f"{NODE} is not ready (drained for the GPU swap)"},
        "startsAt": starts_at.isoformat(),
        "endsAt": ends_at.isoformat() if ends_at else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.demo/graph",
        "fingerprint": "demo-maintenance-node-not-ready",
    }
    return {
        "version": "4",
        "groupKey": '{}:{alertname="NodeNotReady"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "trainsentry",
        "groupLabels": {"alertname": "NodeNotReady"},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.demo",
        "alerts": [alert],
    }


async def replay_window(
    gateway: Gateway,
    session: aiohttp.ClientSession,
    url: str,
    clock: Callable[[], datetime],
    move_to: Callable[[datetime], None],
) -> dict[str, Any]:
    """Runs the window's story on the gateway from `clock()` on; returns what happened."""
    maintenance = gateway.maintenance
    assert not isinstance(maintenance, Off)  # the demo runs the real policy: it has windows
    start = clock()
    window = await maintenance.create(
        {
            "matchers": {"node": NODE},
            "starts_at": start.isoformat(),
            "ends_at": (start + WINDOW).isoformat(),
            "reason": "GPU 3 swap after XID 79",
            "created_by": "demo on-call",
        }
    )

    async def post(body: dict[str, Any]) -> None:
        async with session.post(url, data=json.dumps(body).encode()) as response:
            if response.status != 200:
                raise RuntimeError(f"gateway answered {response.status}: {await response.text()}")
        await gateway.settle()

    fired = start + timedelta(minutes=1)
    move_to(fired)
    await post(_body("firing", fired, None))
    muted = maintenance.muted
    move_to(start + timedelta(minutes=20))  # within announce_before_minutes of the end
    await gateway.settle()
    move_to(start + WINDOW)  # the window ends, the node is still not ready: sent now
    await gateway.settle()
    resolved = start + WINDOW + timedelta(minutes=5)
    move_to(resolved)
    await post(_body("resolved", fired, resolved))
    return {
        "window": window["id"],
        "matchers": f"node={NODE}",
        "reason": window["reason"],
        "notices held back while it was open": muted,
        "then": "announced 10 minutes before its end, sent at its end (still firing)",
    }
