"""Incidents in the store: their rows, which incident each alert is in, and their acks.

The policy's model is gateway/policy/incident.py; here an incident is its row: the policy's
JSON `state` and the columns the console, the API and the ack read. Invariants:
- an alert is in at most one incident (`incident_alerts.alert_id` is its primary key), and
  the planning transaction that first plans an alert puts it in one;
- at most one open (firing) incident per key (the partial unique index
  `uq_incidents_open_key`: two replicas opening one for the same key at once, the second
  fails its batch, which is planned again and finds the first's);
- loaded for a decision they are locked (`FOR UPDATE`, in id order, on PostgreSQL), so two
  replicas changing one incident serialise instead of losing an update; the ticker takes
  due ones with `SKIP LOCKED`;
- `acked_at`/`acked_by` are written by the ack only (`acknowledge_incident`), never by the
  policy's save, so an ack is never undone by a batch that loaded the row before it;
- an alert that joins an acknowledged incident is acknowledged as it joins, by the
  incident's acknowledger (an `acked` event with `joined: true`), so every alert of an
  acknowledged incident shows as acknowledged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.bulk import decode_json, decode_time, encoder, fetch, insert_rows
from trainsentry.store.dialect import is_sqlite
from trainsentry.store.schema import alert_events, alerts, incident_alerts, incidents

OPEN = "firing"


def key_hash(key: str) -> str:
    """The indexed form of an incident key (keys hold Alertmanager group keys: any length)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredIncident:
    """An incident row: the policy's state, and who acknowledged it. `known`: the state as
    stored is exactly the text the caller said it knew (`load_incidents`' `known`), so it
    was not decoded (`state` is empty): the caller holds it already."""

    id: int
    state: dict[str, Any]
    acked_by: str | None
    acked_at: datetime | None
    known: bool = False


@dataclass(frozen=True, slots=True)
class IncidentRow:
    """What the policy writes of one incident (its JSON state and the read columns)."""

    id: int
    key: str
    status: str
    priority: str
    job: str
    cause: str
    cause_alert_id: int | None
    alerts_total: int
    alerts_firing: int
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    due_at: datetime | None
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MemberRow:
    alert_id: int
    incident_id: int
    role: str
    group_key: str
    joined_at: datetime


async def reserve_ids(conn: AsyncConnection, count: int) -> list[int]:
    """`count` incident ids no other transaction gets. On PostgreSQL from the `incident_ids`
    sequence (unused ones are a gap); on SQLite, where one transaction writes at a time,
    the next ones after the largest."""
    if count <= 0:
        return []
    if not is_sqlite(conn):
        rows = await fetch(
            conn, "SELECT nextval('incident_ids') FROM generate_series(1, ?)", [count]
        )
        return [int(row[0]) for row in rows]
    ((largest,),) = await fetch(conn, "SELECT coalesce(max(id), 0) FROM incidents")
    return list(range(int(largest) + 1, int(largest) + 1 + count))


_COLUMNS = "id, state, acked_by, acked_at"


def _stored(row: Sequence[Any], known: Mapping[int, str]) -> StoredIncident:
    incident_id, text = int(row[0]), row[1]
    same = isinstance(text, str) and known.get(incident_id) == text
    return StoredIncident(
        incident_id,
        {} if same else dict(decode_json(text)),
        row[2],
        decode_time(row[3]) if row[3] is not None else None,
        known=same,
    )


async def load_incidents(
    conn: AsyncConnection,
    keys: Iterable[str],
    alert_ids: Iterable[int],
    known: Mapping[int, str] | None = None,
) -> tuple[list[StoredIncident], dict[int, int]]:
    """The open incidents of `keys` and the incidents `alert_ids` are in (locked on
    PostgreSQL), and alert id -> incident id for those of `alert_ids` in one. `known`:
    incident id -> the state's text as the caller last wrote it (`save_incidents`' answer):
    a row whose stored text is exactly that is not decoded (`StoredIncident.known`); a
    storm's incident of 20,000 alerts is a megabyte of JSON, read again by every batch."""
    members: dict[int, int] = {}
    wanted_alerts = sorted(set(alert_ids))
    for start in range(0, len(wanted_alerts), 5000):
        chunk = wanted_alerts[start : start + 5000]
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT alert_id, incident_id FROM incident_alerts WHERE alert_id IN ({marks})"
        members.update((int(a), int(i)) for a, i in await fetch(conn, sql, chunk))
    hashes = sorted({key_hash(key) for key in keys})
    ids = sorted(set(members.values()))
    lock = "" if is_sqlite(conn) else " ORDER BY id FOR UPDATE"
    found: dict[int, StoredIncident] = {}
    for start in range(0, max(len(hashes), len(ids)), 2000):
        part_h, part_i = hashes[start : start + 2000], ids[start : start + 2000]
        where = []
        params: list[Any] = []
        if part_h:
            where.append(f"(status = 'firing' AND key_hash IN ({','.join('?' * len(part_h))}))")
            params += part_h
        if part_i:
            where.append(f"id IN ({','.join('?' * len(part_i))})")
            params += part_i
        sql = f"SELECT {_COLUMNS} FROM incidents WHERE {' OR '.join(where)}{lock}"
        for row in await fetch(conn, sql, params):
            found[int(row[0])] = _stored(row, known or {})
    return [found[i] for i in sorted(found)], members


async def due_incidents(
    conn: AsyncConnection, now: datetime, limit: int = 500
) -> list[StoredIncident]:
    """Incidents whose follow-up is due, locked for this transaction (skipping rows another
    replica holds)."""
    query = (
        select(incidents.c.id, incidents.c.state, incidents.c.acked_by, incidents.c.acked_at)
        .where(incidents.c.due_at <= now)
        .order_by(incidents.c.due_at)
        .limit(limit)
    )
    if not is_sqlite(conn):
        query = query.with_for_update(skip_locked=True)
    return [
        StoredIncident(int(r.id), dict(r.state), r.acked_by, r.acked_at)
        for r in await conn.execute(query)
    ]


_ROW_COLUMNS = (
    "id",
    "key_hash",
    "key",
    "status",
    "priority",
    "job",
    "cause",
    "cause_alert_id",
    "alerts_total",
    "alerts_firing",
    "opened_at",
    "updated_at",
    "resolved_at",
    "due_at",
    "state",
)
# acked_at / acked_by are the ack's (module docstring): never in the update
_UPSERT = "ON CONFLICT (id) DO UPDATE SET " + ", ".join(
    f"{name} = excluded.{name}" for name in _ROW_COLUMNS if name != "id"
)
_MEMBER_COLUMNS = ("alert_id", "incident_id", "role", "group_key", "joined_at")


async def save_incidents(
    conn: AsyncConnection,
    rows: Sequence[IncidentRow],
    members: Sequence[MemberRow],
    maybe_acked: Sequence[MemberRow] | None = None,
) -> dict[int, str]:
    """Upserts the incidents, then adds the memberships (an alert already in one keeps it).
    `maybe_acked`: of `members`, those that may join an acknowledged incident (None: any
    of them), acknowledged as they join; the caller leaves out only members of incidents it
    holds locked and knows unacknowledged (issue 46: one query per batch saved in a storm).
    Returns incident id -> the state's text as written (what `load_incidents` reads back
    until someone writes the row again)."""
    enc = encoder(conn)
    texts: dict[int, str] = {}
    if rows:
        texts = {r.id: enc.json(r.state) for r in rows}
        values = [
            (
                r.id,
                key_hash(r.key),
                r.key,
                r.status,
                r.priority,
                r.job,
                r.cause,
                r.cause_alert_id,
                r.alerts_total,
                r.alerts_firing,
                enc.time(r.opened_at),
                enc.time(r.updated_at),
                enc.time(r.resolved_at),
                enc.time(r.due_at),
                texts[r.id],
            )
            for r in sorted(rows, key=lambda r: r.id)
        ]
        await insert_rows(conn, incidents, _ROW_COLUMNS, values, tail=_UPSERT)
    if members:
        joined = [
            (m.alert_id, m.incident_id, m.role, m.group_key, enc.time(m.joined_at)) for m in members
        ]
        await insert_rows(
            conn,
            incident_alerts,
            _MEMBER_COLUMNS,
            joined,
            tail="ON CONFLICT (alert_id) DO NOTHING",
        )
        if check := (members if maybe_acked is None else maybe_acked):
            await _ack_joined(conn, check)
    return texts


async def _ack_joined(conn: AsyncConnection, members: Sequence[MemberRow]) -> None:
    """The alerts of `members` that joined an acknowledged incident, not acknowledged yet,
    are acknowledged by its acknowledger as they join (an `acked` event each)."""
    when = {m.alert_id: m.joined_at for m in members}
    wanted = sorted(when)
    for start in range(0, len(wanted), 5000):
        chunk = wanted[start : start + 5000]
        query = (
            select(alerts.c.id, incidents.c.id.label("incident_id"), incidents.c.acked_by)
            .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
            .join(incidents, incidents.c.id == incident_alerts.c.incident_id)
            .where(
                alerts.c.id.in_(chunk),
                alerts.c.acked_at.is_(None),
                incidents.c.acked_at.is_not(None),
            )
        )
        found = (await conn.execute(query)).all()
        alike: dict[tuple[datetime, str], list[int]] = {}  # one update per ack and moment
        for row in found:
            alike.setdefault((when[row.id], row.acked_by), []).append(row.id)
        for (at, who), ids in alike.items():
            await conn.execute(
                update(alerts).where(alerts.c.id.in_(ids)).values(acked_at=at, acked_by=who)
            )
        if found:
            await conn.execute(
                alert_events.insert(),
                [
                    {
                        "alert_id": row.id,
                        "kind": "acked",
                        "at": when[row.id],
                        "detail": {"by": row.acked_by, "incident": row.incident_id, "joined": True},
                    }
                    for row in found
                ],
            )


async def incident_of_alert(conn: AsyncConnection, alert_id: int) -> StoredIncident | None:
    """The incident `alert_id` is in, locked on PostgreSQL (None: in none, or no such
    alert)."""
    query = (
        select(incidents.c.id, incidents.c.state, incidents.c.acked_by, incidents.c.acked_at)
        .join(incident_alerts, incident_alerts.c.incident_id == incidents.c.id)
        .where(incident_alerts.c.alert_id == alert_id)
    )
    if not is_sqlite(conn):
        query = query.with_for_update(of=incidents)
    row = (await conn.execute(query)).first()
    return StoredIncident(int(row.id), dict(row.state), row.acked_by, row.acked_at) if row else None


async def member_alerts(conn: AsyncConnection, incident_id: int) -> list[int]:
    """The alert ids in `incident_id`, oldest first."""
    query = (
        select(incident_alerts.c.alert_id)
        .where(incident_alerts.c.incident_id == incident_id)
        .order_by(incident_alerts.c.alert_id)
    )
    return [int(alert_id) for alert_id in (await conn.execute(query)).scalars()]


async def member_labels(
    conn: AsyncConnection, incident_id: int, limit: int = 5000
) -> list[dict[str, str]]:
    """The labels of the newest `limit` alerts of `incident_id` (what its silence matches)."""
    query = (
        select(alerts.c.labels)
        .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
        .where(incident_alerts.c.incident_id == incident_id)
        .order_by(alerts.c.id.desc())
        .limit(limit)
    )
    return [
        {str(k): str(v) for k, v in (labels or {}).items()}
        for labels in (await conn.execute(query)).scalars()
    ]


async def acknowledge_incident(
    conn: AsyncConnection,
    incident_id: int,
    who: str,
    now: datetime,
    comment: str | None = None,
    said: Mapping[str, str] | None = None,
) -> list[int]:
    """Records who acknowledged the incident (once) and acknowledges its alerts not
    acknowledged yet, each with an `acked` event naming the incident (and the comment;
    `said`: what the acknowledger gave, when it differs); returns those alerts' ids."""
    await conn.execute(
        update(incidents)
        .where(incidents.c.id == incident_id, incidents.c.acked_at.is_(None))
        .values(acked_at=now, acked_by=who)
    )
    members = select(incident_alerts.c.alert_id).where(incident_alerts.c.incident_id == incident_id)
    query = select(alerts.c.id).where(alerts.c.id.in_(members), alerts.c.acked_at.is_(None))
    if not is_sqlite(conn):
        query = query.with_for_update()
    ids = sorted(int(i) for i in (await conn.execute(query)).scalars())
    if ids:
        await conn.execute(
            update(alerts).where(alerts.c.id.in_(ids)).values(acked_at=now, acked_by=who)
        )
        detail: dict[str, Any] = {"by": who, "incident": incident_id, **(said or {})}
        if comment:
            detail["comment"] = comment
        await conn.execute(
            alert_events.insert(),
            [{"alert_id": i, "kind": "acked", "at": now, "detail": detail} for i in ids],
        )
    return ids
