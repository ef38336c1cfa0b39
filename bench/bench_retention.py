"""Intake latency while the retention purges a big backlog (issue 19, finding 8).

A store is seeded with N alerts resolved 120 days ago (each with its event, a sent
notification, and receipts of 500 alerts), then the real gateway starts in-process on it with
the default retention settings (batches of 500, 0.1 s apart), so the purge begins at once.
Meanwhile one client posts a 10-alert webhook every 20 ms and times each answer; once the
purge is done it goes on for as many posts again (the baseline, same process, same store).

    .venv/bin/python -m bench.bench_retention [--alerts 100000] [--db postgresql://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from sqlalchemy import delete

from tests.support.webhook_factory import make_alert, make_body
from trainsentry.alerts import NotificationDraft, Priority, utcnow
from trainsentry.config import GatewaySettings
from trainsentry.gateway.assemble import create_app
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.store import create_engine, migrate
from trainsentry.store.schema import notifications, policy_inbox
from trainsentry.store.writes import insert_notifications, record_receipts


async def seed(db: str, count: int) -> None:
    engine = create_engine(db)
    await migrate(engine)
    first = utcnow() - timedelta(days=120)
    for start in range(0, count, 500):
        at = first + timedelta(minutes=start // 500)  # one webhook of 500 alerts a minute
        alerts = [make_alert(start + i, status="resolved") for i in range(min(500, count - start))]
        for alert in alerts:
            alert["fingerprint"] = f"old-{alert['fingerprint']}"
            alert["startsAt"] = at.isoformat()
            alert["endsAt"] = (at + timedelta(minutes=5)).isoformat()
        body = json.dumps(make_body(alerts, group_key=f"old-{start}")).encode()
        async with engine.begin() as conn:
            (outcome,) = await record_receipts(conn, [parse_webhook(body, received_at=at)])
            await conn.execute(delete(policy_inbox))
            drafts = [
                NotificationDraft(
                    channel="console",
                    kind="alert",
                    priority=Priority.P3,
                    idempotency_key=f"old-{change.alert_id}",
                    payload={"n": change.alert_id},
                    alert_id=change.alert_id,
                )
                for change in outcome.changes
            ]
            await insert_notifications(conn, drafts, at)
            await conn.execute(
                notifications.update()
                .where(notifications.c.status == "pending")
                .values(status="sent", sent_at=at)
            )
    await engine.dispose()


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"n={len(ordered)} p50={statistics.median(ordered) * 1000:.1f} ms "
        f"p99={p99 * 1000:.1f} ms max={ordered[-1] * 1000:.1f} ms"
    )


async def purged_alerts(http: aiohttp.ClientSession, server: TestServer) -> float:
    async with http.get(server.make_url("/metrics")) as response:
        for line in (await response.text()).splitlines():
            if line.startswith('trainsentry_store_purged_rows_total{table="alerts"}'):
                return float(line.split()[-1])
    return 0.0


async def run(db: str, count: int) -> None:
    started = time.perf_counter()
    await seed(db, count)
    print(f"seeded {count} old alerts in {time.perf_counter() - started:.1f} s")
    settings = GatewaySettings(listen="127.0.0.1:0", db=db)
    server = TestServer(create_app(settings, notifiers={}), host="127.0.0.1")
    during: list[float] = []
    after: list[float] = []
    async with aiohttp.ClientSession() as http:
        await server.start_server()
        purge_started = time.perf_counter()
        purge_seconds = 0.0
        n = 0
        while True:
            done = await purged_alerts(http, server) >= count
            if done and not purge_seconds:
                purge_seconds = time.perf_counter() - purge_started
            if done and len(after) >= len(during):
                break
            body = json.dumps(
                make_body([make_alert(10 * n + i) for i in range(10)], group_key=f"new-{n}")
            ).encode()
            n += 1
            sent = time.perf_counter()
            async with http.post(server.make_url("/api/v1/alertmanager"), data=body) as r:
                assert r.status == 200, await r.text()
            (after if done else during).append(time.perf_counter() - sent)
            await asyncio.sleep(0.02)
        await server.close()
    print(f"purge of {count} alerts (with events, notifications, receipts): {purge_seconds:.1f} s")
    print(f"intake while purging: {percentiles(during)}")
    print(f"intake after purging: {percentiles(after)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=100_000)
    parser.add_argument("--db", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        asyncio.run(run(db, args.alerts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
