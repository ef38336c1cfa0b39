"""Silencing an acknowledged incident in Alertmanager (after the ack's commit: a slow
Alertmanager never delays the ack; stages/services/ack.py calls it).

What the silences match (`incident_silences`, pure): one silence per alertname of the
incident's alerts, and per node for alerts that name one (at most MAX_SILENCES), on the
labels (name and value) that all its alerts of that alertname and node share, read over
its newest MAX_MEMBERS alerts. So it covers every alert of the incident and the ones that
join it later with those labels, and never an alert of another alertname or of another
node: a new cause, and the next node's fault (a new failure domain), still page. An alert in
no incident (stored before incidents were kept) is silenced by its own labels. Each
silence made is a `silenced` event on the acknowledged alert.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from trainsentry.labels import NODE_LABELS, node_of
from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import NotifierError
from trainsentry.store import alert_state
from trainsentry.store.engine import Engine
from trainsentry.store.incidents import member_labels

log = logging.getLogger("trainsentry.ack")

MAX_MEMBERS = 5000  # the incident's newest alerts whose labels are compared
MAX_SILENCES = 20  # silences one ack creates (one per alertname of the incident)
MAX_ASKED = 50  # silences whose state one console page asks of Alertmanager
ASK_TIMEOUT_S = 3.0
_SILENCE_ID = re.compile(r"^[0-9A-Za-z-]{1,64}$")  # Alertmanager's ids are UUIDs


def incident_silences(
    members: Sequence[Mapping[str, str]],
    cap: int = MAX_SILENCES,
    *,
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> list[dict[str, str]]:
    """Pure: the label sets an incident's silence matches: one per alertname of its alerts
    and, for alerts that name a node (hardware, node and per-node alerts), per node (the
    first `cap` by name and node), each the labels (name and value) all its alerts of that
    alertname (and node) share. So it matches each of them, never another alertname and
    never another node: a node's failure domain ends at the node, and the next node's fault
    is a new incident that must page (issue 43). Within a node, a GPU, port or mountpoint
    the alerts share stays matched, so another GPU of the node still pages. Labels with an
    empty value are left out (Alertmanager reads them as "absent"). A node is read by
    `node_labels` (`policy.node_labels`), as correlation and the cards read it."""
    by_name: dict[tuple[str, str], dict[str, str]] = {}
    for labels in members:
        name = labels.get("alertname", "")
        if not name:
            continue
        key = (name, node_of(labels, node_labels))
        shared = by_name.get(key)
        if shared is None:
            by_name[key] = {k: v for k, v in labels.items() if v != ""}
        else:
            for label in [k for k, v in shared.items() if labels.get(k) != v]:
                del shared[label]
    return [by_name[key] for key in sorted(by_name)[:cap]]


async def silence_targets(
    engine: Engine,
    labels: dict[str, str],
    incident_id: int | None,
    node_labels: tuple[str, ...] = NODE_LABELS,
) -> list[dict[str, str]]:
    """The label sets to silence: the incident's (`incident_silences`), else `labels`."""
    if incident_id is None:
        return [labels]
    async with engine.connect() as conn:
        members = await member_labels(conn, incident_id, MAX_MEMBERS)
    return incident_silences(members, node_labels=node_labels) or [labels]


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


async def silence_states(
    silences: SilenceClient, ids: Sequence[str], timeout_s: float = ASK_TIMEOUT_S
) -> dict[str, str]:
    """Alertmanager's state of each silence of `ids` (`active`, `pending`, `expired`): the
    first MAX_ASKED, asked at once, within `timeout_s` in all; a silence Alertmanager did
    not answer for (or an id that is not one) is left out."""
    wanted = [i for i in dict.fromkeys(ids) if _SILENCE_ID.match(i)][:MAX_ASKED]

    async def one(silence_id: str) -> tuple[str, str | None]:
        try:
            answer = await silences.get_silence(silence_id)
        except NotifierError:
            return silence_id, None
        state = (answer.get("status") or {}).get("state")
        return silence_id, state if isinstance(state, str) else None

    try:
        async with asyncio.timeout(timeout_s):
            found = await asyncio.gather(*(one(silence_id) for silence_id in wanted))
    except TimeoutError:
        log.warning("silence states: Alertmanager did not answer within %.1f s", timeout_s)
        return {}
    return {silence_id: state for silence_id, state in found if state}
