"""Incidents in the store (store/incidents.py), on SQLite and the real PostgreSQL: ids no two
transactions share, at most one open incident per key, an alert in exactly one incident,
the ack of all its alerts, and the retention purge that takes an incident with its alerts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.gateway.stages.planning.test_policy_inbox import intake
from tests.support.webhook_factory import BASE_TIME, make_alert
from trainsentry.store.incidents import (
    IncidentRow,
    MemberRow,
    acknowledge_incident,
    due_incidents,
    incident_of_alert,
    load_incidents,
    member_alerts,
    reserve_ids,
    save_incidents,
)
from trainsentry.store.retention import purge_alerts
from trainsentry.store.schema import (
    alert_events,
    alerts,
    incident_alerts,
    incidents,
    policy_inbox,
)

NOW = BASE_TIME + timedelta(minutes=1)


def row(incident_id: int, key: str, status: str = "firing", **extra: object) -> IncidentRow:
    fields: dict[str, object] = {
        "id": incident_id,
        "key": key,
        "status": status,
        "priority": "P1",
        "job": "ml/llama-70b",
        "cause": "NodeFilesystemSpaceLow/node",
        "cause_alert_id": None,
        "alerts_total": 1,
        "alerts_firing": 1 if status == "firing" else 0,
        "opened_at": BASE_TIME,
        "updated_at": BASE_TIME,
        "resolved_at": None if status == "firing" else NOW,
        "due_at": None,
        "state": {"id": incident_id, "key": key, "opened_at": BASE_TIME.isoformat()},
    }
    fields.update(extra)
    return IncidentRow(**fields)  # type: ignore[arg-type]


async def alert_ids(engine: AsyncEngine) -> list[int]:
    async with engine.connect() as conn:
        return sorted((await conn.execute(select(alerts.c.id))).scalars())


async def test_reserved_ids_are_never_handed_out_twice(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        first = await reserve_ids(conn, 3)
        await save_incidents(conn, [row(i, f"k{i}") for i in first], [])
    async with engine.begin() as conn:
        second = await reserve_ids(conn, 2)
    assert len(set(first + second)) == 5 and min(second) > max(first)
    async with engine.begin() as conn:
        assert await reserve_ids(conn, 0) == []


async def test_one_open_incident_per_key_and_an_alert_in_exactly_one(engine: AsyncEngine) -> None:
    long_key = 'group:{}/{priority="P1"}:{alertname="DiskFull", ' + "x" * 5000 + "}"
    await intake(engine, [make_alert(i) for i in range(3)])
    a1, a2, a3 = await alert_ids(engine)
    async with engine.begin() as conn:
        await save_incidents(
            conn,
            [row(1, long_key), row(2, "other", status="resolved")],
            [
                MemberRow(a1, 1, "cause", "g", BASE_TIME),
                MemberRow(a2, 1, "member", "g", BASE_TIME),
                MemberRow(a3, 2, "cause", "", BASE_TIME),
            ],
        )
    # an alert already in an incident keeps it
    async with engine.begin() as conn:
        await save_incidents(conn, [], [MemberRow(a1, 2, "member", "", BASE_TIME)])
    async with engine.begin() as conn:
        stored, members = await load_incidents(conn, [long_key, "other"], [a1, a3])
    assert members == {a1: 1, a3: 2}
    # the open incident of the key (by its hash), and the resolved one of a3 (by membership)
    assert [s.id for s in stored] == [1, 2]
    async with engine.connect() as conn:
        assert await member_alerts(conn, 1) == [a1, a2]
        found = await incident_of_alert(conn, a2)
    assert found is not None and found.id == 1
    # a second open incident of the same key is refused (two replicas racing)
    with pytest.raises(IntegrityError):
        async with engine.begin() as conn:
            await save_incidents(conn, [row(3, long_key)], [])
    # a resolved one of the key may stand beside an open one
    async with engine.begin() as conn:
        await save_incidents(conn, [row(3, long_key, status="resolved")], [])


async def test_the_ack_acknowledges_every_alert_once_and_a_save_never_undoes_it(
    engine: AsyncEngine,
) -> None:
    await intake(engine, [make_alert(i) for i in range(3)])
    ids = await alert_ids(engine)
    async with engine.begin() as conn:
        await save_incidents(
            conn, [row(7, "k")], [MemberRow(i, 7, "member", "", BASE_TIME) for i in ids]
        )
        await conn.execute(update(alerts).where(alerts.c.id == ids[0]).values(acked_by="early"))
        await conn.execute(update(alerts).where(alerts.c.id == ids[0]).values(acked_at=NOW))
    async with engine.begin() as conn:
        acked = await acknowledge_incident(conn, 7, "bob", NOW, "on it")
    assert acked == ids[1:]  # the one acked before keeps its ack
    async with engine.begin() as conn:
        assert await acknowledge_incident(conn, 7, "carol", NOW) == []
        await save_incidents(conn, [row(7, "k", alerts_total=3)], [])  # the policy's save
    async with engine.connect() as conn:
        found = await incident_of_alert(conn, ids[0])
        events = (
            await conn.execute(
                select(alert_events.c.alert_id, alert_events.c.detail).where(
                    alert_events.c.kind == "acked"
                )
            )
        ).all()
    assert found is not None and found.acked_by == "bob"
    assert sorted(a for a, _ in events) == ids[1:]
    assert all(d == {"by": "bob", "incident": 7, "comment": "on it"} for _, d in events)


async def test_due_incidents_are_those_whose_follow_up_time_passed(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await save_incidents(
            conn,
            [row(1, "a", due_at=NOW), row(2, "b", due_at=NOW + timedelta(minutes=5)), row(3, "c")],
            [],
        )
    async with engine.begin() as conn:
        assert [s.id for s in await due_incidents(conn, NOW)] == [1]


async def test_the_purge_takes_an_alert_out_of_its_incident_and_a_finished_incident_with_it(
    engine: AsyncEngine,
) -> None:
    old = BASE_TIME - timedelta(days=60)
    await intake(engine, [make_alert(i, status="resolved") for i in range(2)])
    ids = await alert_ids(engine)
    async with engine.begin() as conn:  # planned and finished long ago
        await conn.execute(delete(policy_inbox))
        await conn.execute(
            update(alerts).values(created_at=old, last_received_at=old, resolved_at=old)
        )
        await save_incidents(
            conn,
            [row(1, "done", status="resolved"), row(2, "open")],
            [MemberRow(ids[0], 1, "cause", "", old), MemberRow(ids[1], 2, "cause", "", old)],
        )
    async with engine.begin() as conn:
        batch = await purge_alerts(conn, BASE_TIME - timedelta(days=30), 100)
    assert batch.purged.alerts == 2
    async with engine.connect() as conn:
        left = (await conn.execute(select(incidents.c.id))).scalars().all()
        members = (await conn.execute(select(func.count()).select_from(incident_alerts))).scalar()
    assert list(left) == [2], "the resolved incident went with its last alert; the open stays"
    assert members == 0
