"""What the access check (gateway/acting.py) needs to know of an incident, an alert or a
notification: the namespaces of its alerts, each with whether the alert names a training
job. Read only; one indexed query each (a few per 500 notifications), bounded by the
distinct (namespace, has a job) pairs (at most a few).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.store.schema import alerts, incident_alerts, incidents, notifications

Places = frozenset[tuple[str, bool]]  # (namespace, the alert names a training job)


async def incident_places(conn: AsyncConnection, incident_id: int) -> Places | None:
    """The (namespace, names a job) pairs of the incident's alerts; None: no such incident."""
    found = (
        await conn.execute(select(incidents.c.id).where(incidents.c.id == incident_id))
    ).first()
    if found is None:
        return None
    query = (
        select(alerts.c.job_namespace, alerts.c.job_name != "")
        .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
        .where(incident_alerts.c.incident_id == incident_id)
        .distinct()
    )
    rows = (await conn.execute(query)).all()
    return frozenset((str(ns or ""), bool(has_job)) for ns, has_job in rows)


async def alert_places(conn: AsyncConnection, alert_id: int) -> Places | None:
    """The places of the alert's incident (an action through an alert acts on its
    incident), or the alert's own when it is in none; None: no such alert."""
    row = (
        await conn.execute(
            select(alerts.c.job_namespace, alerts.c.job_name, incident_alerts.c.incident_id)
            .outerjoin(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
            .where(alerts.c.id == alert_id)
        )
    ).first()
    if row is None:
        return None
    if row.incident_id is not None:
        places = await incident_places(conn, int(row.incident_id))
        if places:
            return places
    return frozenset({(str(row.job_namespace or ""), bool(row.job_name))})


async def incidents_places(conn: AsyncConnection, incident_ids: list[int]) -> Places:
    """The (namespace, names a job) pairs of the alerts of all these incidents (a job's bulk
    ack acts on each of them); in chunks of 500 ids, one query each."""
    found: set[tuple[str, bool]] = set()
    for start in range(0, len(incident_ids), 500):
        query = (
            select(alerts.c.job_namespace, alerts.c.job_name != "")
            .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
            .where(incident_alerts.c.incident_id.in_(incident_ids[start : start + 500]))
            .distinct()
        )
        found.update((str(ns or ""), bool(job)) for ns, job in (await conn.execute(query)).all())
    return frozenset(found)


async def notification_places(conn: AsyncConnection, ids: list[int]) -> list[Places]:
    """The places of what each of these notifications is about, one entry per incident (an
    action on a notification acts on its alert's incident), or per alert in none; a
    notification of no alert (a storm summary, an infrastructure card, a hand-off) is the
    cluster's (`("", False)`). Unknown ids add nothing. Three queries per 500 ids."""
    found: list[Places] = []
    alert_ids: set[int] = set()
    for start in range(0, len(ids), 500):
        query = (
            select(notifications.c.alert_id)
            .where(notifications.c.id.in_(ids[start : start + 500]))
            .distinct()
        )
        for (alert_id,) in (await conn.execute(query)).all():
            if alert_id is None:
                found.append(frozenset({("", False)}))
            else:
                alert_ids.add(int(alert_id))
    chosen = sorted(alert_ids)
    by_incident: dict[int, set[tuple[str, bool]]] = {}
    for start in range(0, len(chosen), 500):
        query = select(
            alerts.c.id, alerts.c.job_namespace, alerts.c.job_name, incident_alerts.c.incident_id
        ).outerjoin(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
        rows = (await conn.execute(query.where(alerts.c.id.in_(chosen[start : start + 500])))).all()
        for row in rows:
            if row.incident_id is None:
                found.append(frozenset({(str(row.job_namespace or ""), bool(row.job_name))}))
            else:
                by_incident.setdefault(int(row.incident_id), set())
    incident_ids = sorted(by_incident)
    for start in range(0, len(incident_ids), 500):
        query = (
            select(incident_alerts.c.incident_id, alerts.c.job_namespace, alerts.c.job_name != "")
            .join(incident_alerts, incident_alerts.c.alert_id == alerts.c.id)
            .where(incident_alerts.c.incident_id.in_(incident_ids[start : start + 500]))
            .distinct()
        )
        for incident_id, namespace, has_job in (await conn.execute(query)).all():
            by_incident[int(incident_id)].add((str(namespace or ""), bool(has_job)))
    found.extend(frozenset(places) for places in by_incident.values() if places)
    return found
