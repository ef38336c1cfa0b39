"""The recorded incident the demo replays, turned into Alertmanager webhook bodies."""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from trainsentry.assets import data_file, rules_dir
from trainsentry.gateway.public import label_fingerprint

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


@functools.cache
def shipped_first_steps() -> dict[str, str]:
    """alertname -> the `first_step` annotation of the shipped rule of that name (rules/)."""
    steps: dict[str, str] = {}
    for path in sorted(rules_dir().glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in doc.get("groups", []) if isinstance(doc, dict) else []:
            for rule in group.get("rules", []):
                step = (rule.get("annotations") or {}).get("first_step")
                if rule.get("alert") and step:
                    steps[rule["alert"]] = step
    return steps


def _alert(raw: dict[str, Any], status: str, base: datetime) -> dict[str, Any]:
    """One recorded alert, dated from `base`, with the annotations Prometheus would send for
    it: the recording's, plus the `first_step` of the shipped rule of its alertname (the
    recording predates that annotation)."""
    labels = dict(raw["labels"])
    annotations = dict(raw.get("annotations", {}))
    first = shipped_first_steps().get(labels.get("alertname", ""))
    if first and "first_step" not in annotations:
        annotations["first_step"] = first
    return {
        "status": status,
        "labels": labels,
        "annotations": annotations,
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
