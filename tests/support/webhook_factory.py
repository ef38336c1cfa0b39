"""Builds Alertmanager webhook v4 bodies for tests (the shape Alertmanager sends).

A body is one Alertmanager group's notification. Its `groupKey` is what Alertmanager 0.25
writes (dispatch/dispatch.go `aggrGroup.GroupKey`: "<route key>:<group labels>"; route.go
`Route.Key`: the parent's key, "/", the route's matchers as `{name="value",...}`, the root
being `{}`; the group labels as Prometheus' `LabelSet.String`: `{a="x", b="y"}`, sorted,
only the group_by labels the alert has), under the shipped route of
rules/alertmanager-inhibit.yaml (its group_by and its child routes by `priority`).
tests/e2e/test_alertmanager_to_gateway.py checks this against a real Alertmanager.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import yaml

from trainsentry.assets import rules_dir

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


@cache
def shipped_route() -> dict[str, Any]:
    """The shipped Alertmanager route (rules/alertmanager-inhibit.yaml)."""
    route: dict[str, Any] = yaml.safe_load(
        (rules_dir() / "alertmanager-inhibit.yaml").read_text(encoding="utf-8")
    )["route"]
    return route


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # Go's %q, for the values tests use


def label_set(labels: Mapping[str, str]) -> str:
    """Prometheus' `LabelSet.String()`: `{a="x", b="y"}`, sorted."""
    return "{" + ", ".join(sorted(f"{k}={_quoted(v)}" for k, v in labels.items())) + "}"


def am_group_key(
    labels: Mapping[str, str],
    group_by: Sequence[str] | None = None,
    matchers: Sequence[str] | None = None,
) -> str:
    """The groupKey Alertmanager sends for an alert with `labels`: under the shipped route
    by default (its child route matching `priority="Pn"`, else the root), or under a root
    route grouping by `group_by` with a child route of `matchers` (`['severity="page"']`)."""
    route = shipped_route()
    if group_by is None:
        group_by = route["group_by"]
        for child in route.get("routes", ()):
            wanted = child["matchers"][0].split("=", 1)
            if labels.get(wanted[0]) == json.loads(wanted[1]):
                matchers = child["matchers"]
                break
    key = "{}"
    if matchers:
        key += "/{" + ",".join(matchers) + "}"
    return key + ":" + label_set({k: labels[k] for k in group_by if k in labels})


def make_body(alerts: list[dict[str, Any]], *, group_key: str | None = None) -> dict[str, Any]:
    """One group's notification; `group_key`: its groupKey (default: the first alert's
    under the shipped route, `am_group_key`)."""
    firing = any(alert["status"] == "firing" for alert in alerts)
    if group_key is None:
        group_key = am_group_key(alerts[0]["labels"]) if alerts else "{}:{}"
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


def bodies_by_group(alerts: Iterable[dict[str, Any]], **key: Any) -> list[dict[str, Any]]:
    """The notifications Alertmanager sends for `alerts`: one body per group (the groups in
    the order their first alert comes); `key`: `group_key`'s grouping, if not the shipped."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts:
        groups.setdefault(am_group_key(alert["labels"], **key), []).append(alert)
    return [make_body(members, group_key=name) for name, members in groups.items()]
