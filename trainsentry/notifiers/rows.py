"""The archive row of one alert occurrence: the same columns in the Feishu sheet and exports.

Columns (A..Q), one row per occurrence (fingerprint + start), updated in place on resolve:

| col | name              | content                                                      |
|-----|-------------------|--------------------------------------------------------------|
| A   | occurrence        | `alert-<id>` (store id) or `fp-<fingerprint>@<startsAt>`     |
| B   | alertname         |                                                              |
| C   | alert_priority    | P0..P3: the alert's own (its classification)                 |
| D   | incident_priority | P0..P3: its incident's (what its card says); empty: none     |
| E   | status            | firing / resolved                                            |
| F   | job               | namespace/name of the TrainingJob                            |
| G   | node              |                                                              |
| H   | gpu               |                                                              |
| I   | rank              |                                                              |
| J   | summary           | the rule's summary annotation                                |
| K   | starts_at         | ISO 8601, UTC                                                |
| L   | ends_at           | ISO 8601, UTC; empty while firing                            |
| M   | duration          | e.g. 1h20m; empty while firing                               |
| N   | reason            | the policy's classification reason                          |
| O   | acked_by          | who acknowledged (Feishu open_id / CLI user)                 |
| P   | runbook_url       |                                                              |
| Q   | fingerprint       | Alertmanager fingerprint                                     |
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from trainsentry.alerts import GO_ZERO_TIME, Alert
from trainsentry.notifiers.feishu.card import duration_words, parse_time
from trainsentry.notifiers.payload_contract import (
    NotificationPayload,
    alertname,
    annotation,
    gpu_of,
    job_of,
    node_of,
    parse_payload,
    rank_of,
)

COLUMNS: tuple[str, ...] = (
    "occurrence", "alertname", "alert_priority", "incident_priority", "status", "job", "node",
    "gpu", "rank", "summary",
    "starts_at", "ends_at", "duration", "reason", "acked_by", "runbook_url", "fingerprint",
)  # fmt: skip
MAX_CELL_CHARS = 40_000  # Feishu allows 50,000 per cell and adds control characters


def _time(text: str | None) -> datetime | None:
    value = parse_time(text)
    return None if value is None or value <= GO_ZERO_TIME else value.astimezone(UTC)


def _iso(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if value else ""


def occurrence_key(payload: NotificationPayload) -> str:
    """Stable id of the occurrence; never a bare number (a sheet would turn it into one)."""
    alert_id = payload.get("alert_id")
    if alert_id is not None:
        return f"alert-{alert_id}"
    return f"fp-{payload.get('fingerprint', '')}@{_iso(_time(payload.get('starts_at')))}"


def occurrence_month(payload: NotificationPayload) -> datetime:
    """The month the occurrence started in (its row stays in that month's sheet)."""
    return _time(payload.get("starts_at")) or datetime.now(UTC)


def row_from_payload(payload: NotificationPayload) -> list[str]:
    started = _time(payload.get("starts_at"))
    ended = _time(payload.get("ends_at")) if payload["status"] == "resolved" else None
    duration = duration_words((ended - started).total_seconds()) if started and ended else ""
    row = [
        occurrence_key(payload),
        alertname(payload),
        payload["priority"],
        payload.get("incident_priority", ""),
        payload["status"],
        job_of(payload),
        node_of(payload),
        gpu_of(payload),
        rank_of(payload),
        annotation(payload, "summary"),
        _iso(started),
        _iso(ended),
        duration,
        payload.get("reason", ""),
        payload.get("acked_by", ""),
        annotation(payload, "runbook_url"),
        payload.get("fingerprint", ""),
    ]
    return [cell[:MAX_CELL_CHARS] for cell in row]


def row_from_alert(
    alert: Alert,
    *,
    alert_id: int | None = None,
    priority: str | None = None,
    reason: str = "",
    acked_by: str = "",
    incident_priority: str | None = None,
) -> list[str]:
    """The row for a stored alert (what the CLI export uses)."""
    raw: dict[str, Any] = {
        "priority": priority or alert.labels.get("priority", "P3"),
        "incident_priority": incident_priority or "",
        "status": alert.status.value,
        "fingerprint": alert.fingerprint,
        "alertname": alert.name,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "starts_at": alert.starts_at.isoformat(),
        "ends_at": alert.ends_at.isoformat() if alert.ends_at else None,
        "reason": reason,
    }
    if alert_id is not None:
        raw["alert_id"] = alert_id
    if acked_by:
        raw["acked_by"] = acked_by
    return row_from_payload(parse_payload(raw))


def as_dict(row: list[str]) -> Mapping[str, str]:
    return dict(zip(COLUMNS, row, strict=True))
