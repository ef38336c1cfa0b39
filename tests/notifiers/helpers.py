"""Shared test helpers: notification factory and a tiny sender loop standing in for the outbox."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from trainsentry.alerts import Priority
from trainsentry.notifiers.base import (
    Notifier,
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    Receipt,
    RetryableError,
)


def alert_payload(priority: str = "P0", status: str = "firing", **extra: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "priority": priority,
        "status": status,
        "alert_id": 42,
        "fingerprint": "abc123",
        "alertname": "GpuXidError",
        "labels": {
            "alertname": "GpuXidError",
            "priority": priority,
            "trainingjob": "llama-70b",
            "namespace": "team-a",
            "node": "gpu-node-07",
            "gpu": "3",
            "rank": "27",
            "component": "gpu",
        },
        "annotations": {
            "summary": "XID 79 on GPU 3 (fallen off the bus)",
            "description": "The GPU reported XID 79; the job's rank 27 will hang.",
            "runbook_url": "https://runbooks.example/gpu-xid",
            "value": "79",
        },
        "starts_at": "2026-11-22T01:00:00Z",
        "reason": "hardware fault that kills the job",
        "grafana_url": "https://grafana.example/d/job?var-job=llama-70b",
    }
    payload.update(extra)
    return payload


def notification(
    nid: int = 1,
    payload: dict[str, Any] | None = None,
    *,
    channel: str = "feishu_bot",
    kind: str = "alert",
) -> OutboundNotification:
    payload = payload if payload is not None else alert_payload()
    return OutboundNotification(
        id=nid,
        channel=channel,
        kind=kind,
        priority=Priority(payload["priority"]),
        payload=payload,
        idempotency_key=f"test:{nid}",
        group_key="g",
        created_at=datetime.now(UTC),
    )


async def deliver_all(
    notifier: Notifier,
    notifications: Iterable[OutboundNotification],
    *,
    workers: int = 3,
    max_attempts: int = 50,
) -> tuple[dict[int, Receipt], int]:
    """Sends everything like the outbox would: honours retry_after, retries transient errors.

    Returns the receipts by notification id and how many RateLimitedErrors were handled.
    """
    queue: deque[tuple[OutboundNotification, int]] = deque((n, 0) for n in notifications)
    receipts: dict[int, Receipt] = {}
    rate_limited = 0

    async def worker() -> None:
        nonlocal rate_limited
        while queue:
            item, attempts = queue.popleft()
            try:
                receipts[item.id] = await notifier.send(item)
            except RateLimitedError as exc:
                rate_limited += 1
                if attempts + 1 >= max_attempts:
                    raise
                queue.append((item, attempts + 1))
                await asyncio.sleep(exc.retry_after or 0.05)
            except RetryableError:
                if attempts + 1 >= max_attempts:
                    raise
                queue.append((item, attempts + 1))
                await asyncio.sleep(0.05)
            except PermanentError:
                raise

    await asyncio.gather(*(worker() for _ in range(workers)))
    return receipts, rate_limited


def hmac_sha256_by_hand(key: bytes, message: bytes) -> bytes:
    """RFC 2104 HMAC written out with hashlib only, to check the signer independently."""
    import hashlib

    block = 64
    if len(key) > block:
        key = hashlib.sha256(key).digest()
    key = key.ljust(block, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in key) + message).digest()
    return hashlib.sha256(bytes(b ^ 0x5C for b in key) + inner).digest()
