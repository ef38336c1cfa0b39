"""Builds Alertmanager webhook v4 bodies for tests (the shape Alertmanager sends)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

BASE_TIME = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def make_alert(
    index: int = 0,
    *,
    status: str = "firing",
    name: str = "GPUXidError",
    labels: dict[str, str] | None = None,
    starts_at: datetime | None = None,
    ends_at: datetime | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    all_labels = {
        "alertname": name,
        "trainingjob": "llama-70b",
        "namespace": "ml",
        "node": f"gpu-{index % 1000:04d}",
        "gpu": str(index % 8),
        **(labels or {}),
    }
    start = starts_at or BASE_TIME + timedelta(seconds=index % 3600)
    end = ends_at or (start + timedelta(minutes=5) if status == "resolved" else None)
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": f"{name} on {all_labels['node']}", "description": "test"},
        "startsAt": start.isoformat().replace("+00:00", "Z"),
        "endsAt": end.isoformat().replace("+00:00", "Z") if end else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.local/graph",
        "fingerprint": fingerprint or f"{index:016x}",
    }


def make_body(alerts: list[dict[str, Any]], *, group_key: str = '{}:{job="t"}') -> dict[str, Any]:
    firing = any(alert["status"] == "firing" for alert in alerts)
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": "trainsentry",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.local",
        "alerts": alerts,
    }


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()
