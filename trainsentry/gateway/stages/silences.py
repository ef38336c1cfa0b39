"""Silencing an acknowledged incident in Alertmanager (after the ack's commit: a slow
Alertmanager never delays the ack; stages/ack.py calls it).

What the silences match (`incident_silences`, pure): one silence per alertname of the
incident's alerts (at most MAX_SILENCES), on the labels (name and value) that all its
alerts of that alertname share, read over its newest MAX_MEMBERS alerts. So it covers every
alert of the incident and the ones that join it later with those labels (the next node of
the group), and never an alert of another alertname: a new cause still pages. An alert in
no incident (stored before incidents were kept) is silenced by its own labels. Each
silence made is a `silenced` event on the acknowledged alert.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import NotifierError
from trainsentry.store import alert_state
from trainsentry.store.engine import Engine
from trainsentry.store.incidents import member_labels

log = logging.getLogger("trainsentry.ack")

MAX_MEMBERS = 5000  # the incident's newest alerts whose labels are compared
MAX_SILENCES = 20  # silences one ack creates (one per alertname of the incident)


def incident_silences(
    members: Sequence[Mapping[str, str]], cap: int = MAX_SILENCES
) -> list[dict[str, str]]:
    """Pure: the label sets an incident's silence matches: one per alertname of its alerts
    (the first `cap` by name), each the labels (name and value) all its alerts of that
    alertname share, so it matches each of them and never another alertname. Labels
    with an empty value are left out (Alertmanager reads them as "absent")."""
    by_name: dict[str, dict[str, str]] = {}
    for labels in members:
        name = labels.get("alertname", "")
        if not name:
            continue
        shared = by_name.get(name)
        if shared is None:
            by_name[name] = {k: v for k, v in labels.items() if v != ""}
        else:
            for key in [k for k, v in shared.items() if labels.get(k) != v]:
                del shared[key]
    return [by_name[name] for name in sorted(by_name)[:cap]]


async def silence_targets(
    engine: Engine, labels: dict[str, str], incident_id: int | None
) -> list[dict[str, str]]:
    """The label sets to silence: the incident's (`incident_silences`), else `labels`."""
    if incident_id is None:
        return [labels]
    async with engine.connect() as conn:
        members = await member_labels(conn, incident_id, MAX_MEMBERS)
    return incident_silences(members) or [labels]


async def create_silences(
    engine: Engine,
    silences: SilenceClient,
    targets: Sequence[Mapping[str, str]],
    alert_id: int,
    incident_id: int | None,
    *,
    who: str,
    duration: timedelta,
    now: datetime,
) -> tuple[tuple[str, ...], str | None]:
    """One silence per label set of `targets`, each recorded as a `silenced` event on
    `alert_id`; the ids made, and the first refusal (which stops the rest)."""
    made: list[str] = []
    error = None
    for labels in targets:
        try:
            made.append(await silences.create_silence(labels, duration, who=who, now=now))
        except NotifierError as exc:
            log.warning("silence failed alert_id=%d error=%r", alert_id, str(exc))
            error = str(exc)
            break
    if made:
        async with engine.begin() as conn:
            for silence_id in made:
                detail: dict[str, Any] = {"by": who, "silence_id": silence_id}
                if incident_id is not None:
                    detail["incident"] = incident_id
                detail["seconds"] = duration.total_seconds()
                await alert_state.record_event(conn, alert_id, "silenced", now, detail)
    return tuple(made), error
