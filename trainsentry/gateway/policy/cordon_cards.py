"""The cordon cards (pure): the nodes one check recommends (or cordons) folded into cards,
and each card's notification payload.

- **Folded per incident**: the nodes of one check under the same open infrastructure
  incident (`level=element`, gateway/policy/infra.py) share a card, and so do the nodes of
  that check under none (they reached the threshold together); at most MAX_NODES_PER_CARD
  nodes a card, sickest first.
- **Capped per hour**: at most `remediation.max_cards_per_hour` cordon cards (recommended
  or cordoned) in any hour. The nodes that would need another card are held: nothing is
  recorded for them, so a later check recommends them once the hour has room.

A card's payload field `cordon` holds `nodes` (one entry per node: node, summary, score,
faults, jobs, status, reason, by), `incident` ("" for none) and `approvable` (whether
anyone may press its buttons: `remediation.approvers` is not empty).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.config.remediation import CordonSettings
from trainsentry.gateway.policy.cordon import Candidate, NodeDecision

KIND = "cordon"
PRIORITY = Priority.P1
MAX_NODES_PER_CARD = 10
ALERTNAME = "Cordon recommended"


def recent_cards(sent: Iterable[datetime], now: datetime) -> list[datetime]:
    """Pure: the card times within the last hour, oldest first."""
    hour_ago = now - timedelta(hours=1)
    return sorted(at for at in sent if hour_ago < at <= now)


def fold(
    found: Sequence[Candidate], incident_of: Mapping[str, str], room: int
) -> list[tuple[str, list[Candidate]]]:
    """Pure: (incident, candidates) per card, at most `room` cards, in the order of their
    sickest node; `found` sickest first, `incident_of`: node -> its open incident."""
    groups: dict[str, list[Candidate]] = {}
    for candidate in found:
        groups.setdefault(incident_of.get(candidate.health.node, ""), []).append(candidate)
    cards = [
        (incident, members[i : i + MAX_NODES_PER_CARD])
        for incident, members in groups.items()
        for i in range(0, len(members), MAX_NODES_PER_CARD)
    ]
    first = {c.health.node: rank for rank, c in enumerate(found)}
    cards.sort(key=lambda card: first[card[1][0].health.node])
    return cards[: max(0, room)]


def summary_of(node: str, faults: Mapping[str, int], score: float) -> str:
    """Pure: "cordon gpu-node-17: 3 fell_off_bus (score 17.6)"."""
    listed = ", ".join(f"{count} {kind}" for kind, count in sorted(faults.items()))
    return f"cordon {node}: {listed} (score {score:.1f})"


def entry(node: str, decision: NodeDecision) -> dict[str, Any]:
    """Pure: one node's entry on a card, as its decision stands."""
    faults = dict(decision.faults or {})
    return {
        "node": node,
        "summary": summary_of(node, faults, decision.score),
        "score": round(decision.score, 3),
        "faults": faults,
        "jobs": list(decision.jobs),
        "status": decision.status.value,
        "reason": decision.reason,
        "by": decision.by,
    }


def payload(
    entries: Sequence[Mapping[str, Any]], incident: str, approvable: bool, at: datetime
) -> dict[str, Any]:
    """Pure: the notification payload of a card of these nodes."""
    statuses = {str(e["status"]) for e in entries}
    nodes = [str(e["node"]) for e in entries]
    text = (
        str(entries[0]["summary"])
        if len(entries) == 1
        else f"cordon {len(entries)} nodes: {', '.join(nodes)}"
    )
    return {
        "priority": PRIORITY.value,
        "status": "firing",
        "event": "cordon_" + (statuses.pop() if len(statuses) == 1 else "mixed"),
        "alertname": ALERTNAME,
        "annotations": {"summary": text},
        "at": at.isoformat(),
        "cordon": {
            "nodes": [dict(e) for e in entries],
            "incident": incident,
            "approvable": approvable,
        },
    }


def drafts(
    channels: Sequence[str],
    entries: Sequence[Mapping[str, Any]],
    after: Sequence[str],
    incident: str,
    settings: CordonSettings,
    at: datetime,
) -> list[NotificationDraft]:
    """Pure: one card per channel. `after`: per node, the decision its recommendation follows
    (its time, or "first"): with the nodes it keys the card, so a repeated check writes
    nothing twice."""
    nodes = [str(e["node"]) for e in entries]
    digest = hashlib.sha256(
        "\n".join(f"{n}@{a}" for n, a in zip(nodes, after, strict=True)).encode()
    ).hexdigest()[:32]
    body = payload(entries, incident, bool(settings.approvers), at)
    reason = f"cordon {body['event'].removeprefix('cordon_')}: {', '.join(nodes)}"
    return [
        NotificationDraft(
            channel=channel,
            kind=KIND,
            priority=PRIORITY,
            idempotency_key=f"cordon:{channel}:{nodes[0]}:{digest}"[:200],
            payload=body,
            group_key=f"cordon:{nodes[0]}",
            reason=reason[:500],
        )
        for channel in channels
    ]
