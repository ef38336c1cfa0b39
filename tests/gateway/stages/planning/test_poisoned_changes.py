"""Changes the policy cannot plan cost the others at most one retry cycle each (issue 19
finding 6), with the worker's real loop and real timing, on SQLite and the real PostgreSQL;
and a 5,000-digit XID label is no such change."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tests.gateway.stages.planning.test_policy_inbox import console_plan, count, intake
from tests.support.eventually import eventually
from tests.support.webhook_factory import BASE_TIME, make_alert
from trainsentry.alerts import AlertChange
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.store.schema import notifications, policy_inbox

POLL_S = 0.5  # the worker's backoff is POLL_S * 2**failures: 1 s after one failure


async def test_three_poisoned_changes_delay_the_others_by_one_backoff_each(
    engine: AsyncEngine,
) -> None:
    # The poisoned ones are P0, so they are claimed first, ahead of the two good ones.
    poisoned = [make_alert(i, labels={"priority": "P0"}) for i in range(3)]
    good = [make_alert(10 + i, labels={"priority": "P3"}) for i in range(2)]
    await intake(engine, poisoned + good)
    bad = {alert["fingerprint"] for alert in poisoned}
    real = console_plan()

    async def plan(conn: AsyncConnection, changes: Sequence[AlertChange], now: datetime) -> int:
        if any(change.alert.fingerprint in bad for change in changes):
            raise KeyError("a bug meeting one alert")
        return await real(conn, changes, now)

    set_aside: list[AlertChange] = []
    worker = PolicyWorker(
        engine, plan, poll_interval=POLL_S, on_set_aside=set_aside.append, clock=lambda: BASE_TIME
    )
    started = time.monotonic()
    worker.start()
    try:
        await eventually(lambda: worker.planned == 2, within=60)
        took = time.monotonic() - started
    finally:
        await worker.stop()
    assert worker.planned == 2
    # One backoff (1 s) and one poll (0.5 s) per poisoned change: about 4.5 s. The failure
    # count used to run on across poisoned changes (1 + 2 + 4 + 8 + 16 s ...): over 30 s.
    assert took < 3 * 3 * POLL_S + 1.5, took
    assert len(set_aside) == 3
    assert await count(engine, policy_inbox) == 0


async def test_a_5000_digit_xid_label_is_planned_like_any_alert(engine: AsyncEngine) -> None:
    huge = "7" * 5000  # int() refuses more than 4,300 digits
    alerts = [make_alert(i, name="GPUXidError", labels={"xid": huge}) for i in range(3)]
    alerts += [make_alert(9, name="GPUXidError", labels={"xid": "79"})]
    await intake(engine, alerts)
    worker = PolicyWorker(engine, console_plan(), clock=lambda: BASE_TIME)
    started = time.monotonic()
    assert await worker.drain() == 4
    assert time.monotonic() - started < 2.0
    assert worker.set_aside == 0
    assert await count(engine, notifications) >= 4
