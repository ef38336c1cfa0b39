"""The recorded incident the demo replays, turned into Alertmanager webhook bodies."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from trainsentry.assets import data_file
from trainsentry.gateway.stages.intake import label_fingerprint

MAX_ALERTS_PER_WEBHOOK = 50


@dataclass(frozen=True, slots=True)
class Step:
    at: float  # seconds from the start of the incident
    note: str
    bodies: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Incident:
    title: str
    duration_s: float
    steps: list[Step]

    @property
    def webhooks(self) -> int:
        return sum(len(step.bodies) for step in self.steps)


def _iso(base: datetime, offset: float | None) -> str:
    if offset is None:
        return "0001-01-01T00:00:00Z"
    return (base + timedelta(seconds=offset)).isoformat()


def _alert(raw: dict[str, Any], status: str, base: datetime) -> dict[str, Any]:
    labels = dict(raw["labels"])
    return {
        "status": status,
        "labels": labels,
        "annotations": dict(raw.get("annotations", {})),
        "startsAt": _iso(base, raw["start"]),
        "endsAt": _iso(base, raw.get("end")),
        "generatorURL": "http://prometheus.demo/graph",
        "fingerprint": label_fingerprint(labels),
    }


def _body(alerts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    first = alerts[0]["labels"]
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{first["alertname"]}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "trainsentry",
        "groupLabels": {"alertname": first["alertname"]},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.demo",
        "alerts": alerts,
    }


def load_incident(base: datetime, path: Path | None = None) -> Incident:
    """Reads the incident and dates it: offsets become times after `base`."""
    raw = json.loads(gzip.decompress((path or data_file("demo_incident.json.gz")).read_bytes()))
    steps = []
    for step in raw["steps"]:
        bodies = []
        for status in ("firing", "resolved"):
            alerts = [_alert(a, status, base) for a in step.get(status, [])]
            for start in range(0, len(alerts), MAX_ALERTS_PER_WEBHOOK):
                bodies.append(_body(alerts[start : start + MAX_ALERTS_PER_WEBHOOK], status))
        steps.append(Step(at=float(step["at"]), note=step["note"], bodies=bodies))
    return Incident(title=raw["title"], duration_s=float(raw["duration_s"]), steps=steps)


OPEN_NODES = ("gpu-node-23", "gpu-node-24", "gpu-node-31")


def open_incident(at: datetime) -> dict[str, Any]:
    """The group `demo --serve` leaves firing after the replay, for a newcomer to
    acknowledge from the console: three GPUs of the job throttling, one Alertmanager group."""
    alerts = []
    for index, node in enumerate(OPEN_NODES):
        labels = {
            "alertname": "GPUThermalThrottling",
            "priority": "P1",
            "component": "gpu",
            "trainingjob": "llama-70b",
            "namespace": "ml",
            "node": node,
            "gpu": str(2 + index),
        }
        alerts.append(
            {
                "status": "firing",
                "labels": labels,
                "annotations": {
                    "summary": f"GPU {labels['gpu']} on {node} is thermally throttled",
                    "runbook_url": "https://runbooks.example.com/trainsentry/gputhermalthrottling",
                },
                "startsAt": at.isoformat(),
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus.demo/graph",
                "fingerprint": label_fingerprint(labels),
            }
        )
    body = _body(alerts, "firing")
    body["groupKey"] = '{}:{alertname="GPUThermalThrottling", trainingjob="llama-70b"}'
    return body
