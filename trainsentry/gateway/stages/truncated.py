"""Webhooks with `truncatedAlerts > 0` (Alertmanager's `max_alerts` cut the list): the rest of
the group's alerts are fetched from Alertmanager's API v2 and stored like a webhook.

Alertmanager keeps the group's labels in `groupLabels`; the active alerts matching them are the
group. Fetched alerts are firing by definition (API v2 lists alerts that are not resolved).
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime
from typing import Any

import httpx

from trainsentry.gateway.stages.intake import IntakeRejected, parse_webhook
from trainsentry.store.writes import IncomingReceipt

log = logging.getLogger("trainsentry.truncated")


def group_filter(group_labels: dict[str, str]) -> list[str]:
    """Alertmanager API v2 `filter` matchers selecting one group's alerts."""
    return [f'{name}="{value}"' for name, value in sorted(group_labels.items())]


def api_alerts_to_webhook(
    alerts: list[dict[str, Any]], receiver: str, group_key: str
) -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": receiver,
        "alerts": [
            {
                "status": "firing",
                "labels": alert.get("labels") or {},
                "annotations": alert.get("annotations") or {},
                "startsAt": alert.get("startsAt"),
                "endsAt": alert.get("endsAt"),
                "generatorURL": alert.get("generatorURL", ""),
                "fingerprint": alert.get("fingerprint", ""),
            }
            for alert in alerts
            if (alert.get("status") or {}).get("state", "active") != "unprocessed"
        ],
    }


async def fetch_group(
    alertmanager_url: str,
    truncated: IncomingReceipt,
    received_at: datetime,
    *,
    client: httpx.AsyncClient | None = None,
    request_timeout: float = 10.0,
) -> IncomingReceipt | None:
    """The full alert list of a truncated webhook's group, as a receipt to store."""
    params: list[tuple[str, str | int | float | bool | None]] = [
        ("filter", m) for m in group_filter(truncated.group_labels)
    ]
    if truncated.receiver:
        params.append(("receiver", truncated.receiver))
    # The API lists silenced and inhibited alerts too unless told not to; Alertmanager never
    # notifies about them, so neither may their completion.
    params += [("silenced", "false"), ("inhibited", "false")]
    own = client is None
    client = client or httpx.AsyncClient(timeout=request_timeout)
    try:
        response = await client.get(f"{alertmanager_url.rstrip('/')}/api/v2/alerts", params=params)
        response.raise_for_status()
        alerts = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("truncated webhook: fetching the full list failed error=%r", str(exc))
        return None
    finally:
        if own:
            await client.aclose()
    if not isinstance(alerts, list) or not alerts:
        return None
    body = api_alerts_to_webhook(alerts, truncated.receiver, truncated.group_key)
    raw = json.dumps(body, sort_keys=True).encode()
    try:
        receipt = parse_webhook(raw, received_at=received_at)
    except IntakeRejected as exc:
        log.warning("truncated webhook: Alertmanager's list did not validate reason=%r", exc.reason)
        return None
    receipt.body_sha256 = hashlib.sha256(b"am-api-v2:" + raw).hexdigest()
    return receipt
