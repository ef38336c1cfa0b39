"""A seeded store with a known week (ISO week 2026-W46 in Asia/Shanghai, UTC+8).

The expected numbers in the tests are worked out by hand from the rows below; the comments
say which bucket each row lands in. T0 = Mon 2026-11-09 00:00 +08:00 = Sun 16:00 UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncEngine

from trainsentry.store.schema import alerts, notifications

TZ = "Asia/Shanghai"
T0 = datetime(2026, 11, 9, tzinfo=ZoneInfo(TZ))
END = T0 + timedelta(days=7)
MIN, HOUR, DAY = timedelta(minutes=1), timedelta(hours=1), timedelta(days=1)
# A moment after the week, when the Friday/Monday job runs.
AFTER = datetime(2026, 11, 17, 9, 0, tzinfo=UTC)


def _alert(
    name: str,
    fingerprint: str,
    priority: str,
    component: str,
    starts: datetime,
    *,
    job: str = "",
    labels: dict[str, str] | None = None,
    created_after: timedelta = timedelta(seconds=30),
    ack_after_created: timedelta | None = None,
    resolve_after: timedelta | None = None,
) -> dict[str, Any]:
    namespace, _, job_name = job.partition("/")
    created = starts + created_after
    all_labels = {"alertname": name, "priority": priority, "component": component, **(labels or {})}
    if job:
        all_labels |= {"namespace": namespace, "trainingjob": job_name}
    return {
        "id": 0,  # numbered by seed_week
        "fingerprint": fingerprint,
        "starts_at": starts,
        "alertname": name,
        "status": "resolved" if resolve_after is not None else "firing",
        "labels": all_labels,
        "annotations": {"summary": f"{name} on {all_labels.get('node', 'the cluster')}"},
        "ends_at": None,
        "generator_url": "",
        "job_namespace": namespace,
        "job_name": job_name,
        "node": all_labels.get("node", ""),  # as the intake stores it (store/writes.py)
        "priority": priority,
        "priority_reason": "seed",
        "created_at": created,
        "last_received_at": created,
        "resolved_at": None if resolve_after is None else starts + resolve_after,
        "acked_at": None if ack_after_created is None else created + ack_after_created,
        "acked_by": None if ack_after_created is None else "oncall@example.com",
        "verdict": None,
    }


def week_alerts() -> list[dict[str, Any]]:
    gpu = {"node": "n1", "UUID": "GPU-1"}
    return [
        # --- previous week (2026-W45) ---
        # R1: resolved 30 min before T0; R2 (this week) recurs 40 min later -> recurring
        _alert("KubeJobPodRestarting", "fpR", "P3", "kubernetes", T0 - 2 * HOUR,
               job="team-a/llm", resolve_after=90 * MIN),
        # E0: Sun 23:59 local = 15:59 UTC, still last week in Shanghai
        _alert("GPUTemperatureHigh", "fpE0", "P1", "gpu", T0 - MIN,
               labels={"node": "n3", "gpu": "1"}),
        # --- this week ---
        # A1 Mon 01:00: P0, acked 300 s after created, resolved after 3600 s, paged twice
        _alert("GPUXidDoubleBitECC", "fpA1", "P0", "gpu", T0 + HOUR, job="team-a/llm",
               labels={**gpu, "gpu": "3", "xid": "48"},
               ack_after_created=5 * MIN, resolve_after=HOUR),
        # R2 Mon 00:10: P3, recurring (R1 resolved 40 min before), open at the end
        _alert("KubeJobPodRestarting", "fpR", "P3", "kubernetes", T0 + 10 * MIN, job="team-a/llm"),
        # A2 Tue 02:00: P0, acked 900 s, resolved 7200 s, paged once (+1 dead call)
        _alert("GPUFellOffBus", "fpA2", "P0", "gpu", T0 + DAY + 2 * HOUR, job="team-a/llm",
               labels={**gpu, "gpu": "5", "xid": "79"}, created_after=MIN,
               ack_after_created=15 * MIN, resolve_after=2 * HOUR),
        # A3 Wed 00:00: P1 fabric, acked 600 s, resolved 1800 s
        _alert("IBSymbolErrors", "fpA3", "P1", "fabric", T0 + 2 * DAY, job="team-b/vit",
               labels={"node": "n2", "device": "mlx5_1", "port": "1"},
               ack_after_created=10 * MIN, resolve_after=30 * MIN),
        # F1-F3 Thu 10:00/10:04/10:08, one fingerprint: new, recurring, flapping
        *(
            _alert("IBLinkErrorRecovery", "fpF", "P2", "fabric", T0 + 3 * DAY + 10 * HOUR + at,
                   job="team-b/vit", labels={"node": "n2", "device": "mlx5_0", "port": "1"},
                   resolve_after=lasts)
            for at, lasts in ((0 * MIN, 2 * MIN), (4 * MIN, 2 * MIN), (8 * MIN, MIN))
        ),
        # E1 Sun 23:59 local (15:59 UTC): inside; resolved after the end -> open at the end
        _alert("GPUTemperatureHigh", "fpE1", "P2", "gpu", END - MIN,
               labels={"node": "n3", "gpu": "0"}, resolve_after=31 * MIN),
        # --- next week: Mon 00:00 local, excluded ---
        _alert("GPUTemperatureHigh", "fpE2", "P2", "gpu", END, labels={"node": "n3", "gpu": "0"}),
    ]  # fmt: skip


def _numbered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**row, "id": i} for i, row in enumerate(rows, start=1)]


def _notification(
    key: str, channel: str, kind: str, priority: str, created: datetime, status: str,
    alert_id: int | None = None, payload: dict[str, Any] | None = None, group_key: str = "",
) -> dict[str, Any]:  # fmt: skip
    return {
        "idempotency_key": key, "created_at": created, "channel": channel, "kind": kind,
        "priority": priority, "alert_id": alert_id, "group_key": group_key, "reason": "seed",
        "payload": payload or {}, "status": status, "attempts": 1, "next_attempt_at": created,
        "sent_at": created if status == "sent" else None,
    }  # fmt: skip


def _storm(key: str, channel: str, job: str, event: str, at: datetime, total: int,
           priority: str) -> dict[str, Any]:  # fmt: skip
    payload = {"event": event, "job": job, "at": at.isoformat(), "storm": {"total": total},
               "priority": priority, "status": "firing"}  # fmt: skip
    return _notification(key, channel, "storm", priority, at, "sent", payload=payload,
                         group_key=f"storm:{job}")  # fmt: skip


def week_notifications(ids: dict[str, int]) -> list[dict[str, Any]]:
    """Pages (phone) and storm messages; `ids` maps fingerprint of this week's P0s to ids."""
    a1, a2, e0 = ids["fpA1"], ids["fpA2"], ids["fpE0"]
    storm_at = T0 + 4 * DAY + 12 * HOUR  # Fri 12:00
    job_b, job_a = "trainingjob:team-b/vit", "trainingjob:team-a/llm"
    return [
        # pages: A1 two calls, A2 one call + one dead -> 2 incidents, 3 calls, 2 acked
        _notification("p1", "phone", "call", "P0", T0 + HOUR + MIN, "sent", a1),
        _notification("p2", "phone", "call", "P0", T0 + HOUR + 6 * MIN, "sent", a1),
        _notification("p3", "phone", "call", "P0", T0 + DAY + 2 * HOUR + 2 * MIN, "sent", a2),
        _notification("p4", "phone", "call", "P0", T0 + DAY + 2 * HOUR + 7 * MIN, "dead", a2),
        # previous week: one page for E0, never acked
        _notification("p0", "phone", "call", "P1", T0 - timedelta(seconds=30), "sent", e0),
        # not a page: a Feishu card for A1
        _notification("c1", "feishu_bot", "alert", "P0", T0 + HOUR + MIN, "sent", a1),
        # storm on team-b/vit: started on two channels, a summary (peak P0), ended
        _storm("s1", "feishu_bot", job_b, "storm_started", storm_at, 25, "P1"),
        _storm("s2", "console", job_b, "storm_started", storm_at, 25, "P1"),
        _storm("s3", "feishu_bot", job_b, "storm_summary", storm_at + MIN, 40, "P0"),
        _storm("s4", "feishu_bot", job_b, "storm_ended", storm_at + 5 * MIN, 41, "P1"),
        # previous week: a storm on team-a/llm
        _storm("s0", "feishu_bot", job_a, "started", T0 - DAY, 30, "P2"),
    ]  # fmt: skip


async def seed_week(engine: AsyncEngine) -> dict[str, int]:
    """Writes the week; returns fingerprint -> alert id of the rows written."""
    rows = _numbered(week_alerts())
    ids = {row["fingerprint"]: row["id"] for row in rows if row["starts_at"] >= T0 - MIN}
    async with engine.begin() as conn:
        await conn.execute(alerts.insert(), rows)
        await conn.execute(notifications.insert(), week_notifications(ids))
    return ids
