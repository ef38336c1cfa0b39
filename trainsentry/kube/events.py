"""The core/v1 Event the operator and the gateway record about an object. Pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def event(
    involved: dict[str, str],
    namespace: str,
    reason: str,
    message: str,
    *,
    warning: bool,
    component: str,
    at: datetime,
) -> dict[str, Any]:
    """Pure: a core/v1 Event about `involved` (its apiVersion, kind, name, uid, and namespace
    for a namespaced object) in `namespace`, first and last seen `at`, counted once; the
    name is generated from the object's (cut to 200 characters), the message cut to 1,000."""
    stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name'][:200]}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1000],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
