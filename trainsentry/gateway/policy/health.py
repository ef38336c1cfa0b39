"""Node health (pure): a time-decayed score per node and per GPU from hardware faults only.

A fault is an alert occurrence that says the hardware is sick: an XID whose resolution
bucket weighs more than 0 (`node_health.xid_buckets`: resetting the GPU, rebooting the node,
an RMA; an application XID weighs 0), or an alertname of `node_health.faults` (double-bit
ECC, row-remap failure, fallen off the bus, IB link flaps, thermal). An occurrence matching
several counts once, at its highest weight (a named kind before a bare XID on a tie). A full
checkpoint disk, an OOM, a job's own alerts are no fault and weigh nothing.

Score of a node = sum over its faults within `horizon` of weight * 0.5 ** (age / half_life);
0 is a healthy node, higher is sicker. A GPU's score is the same over the faults naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert
from trainsentry.gateway.policy.classify import xid_code
from trainsentry.gateway.policy.rules import Policy
from trainsentry.labels import GPU_ID_LABELS, first_label
from trainsentry.userregex import full_match

MAX_GPUS_PER_NODE = 64  # GPU names kept per node (labels are attacker-controlled)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # xid:<code>, ecc_double_bit, row_remap_failure, fell_off_bus, ...
    weight: float
    gpu: str  # "" when the alert names no GPU


def fault_of(alert: Alert, policy: Policy) -> Fault | None:
    """Pure: the hardware fault an alert occurrence reports, or None (not sick hardware)."""
    rules = policy.node_health
    found: list[Fault] = []
    gpu = first_label(alert.labels, GPU_ID_LABELS)[:64]
    name = alert.name
    for rule in rules.faults:
        if rule.weight > 0 and full_match(rule.alertname, name):
            found.append(Fault(rule.kind, rule.weight, gpu))
    code = xid_code(alert, policy.classification.xid_labels)
    if code is not None and code in policy.classification.xid:
        weight = rules.xid_buckets.get(policy.classification.xid[code].resolution, 0.0)
        if weight > 0:
            found.append(Fault(f"xid:{code}", weight, gpu))
    # the heaviest; on a tie the named kind (fell_off_bus) before the bare XID (xid:79)
    return max(found, key=lambda fault: fault.weight, default=None)


def decayed(weight: float, at: datetime, now: datetime, half_life: float) -> float:
    """Pure: `weight` halved every `half_life` seconds since `at` (a future `at` counts as now)."""
    age = max(0.0, (now - at).total_seconds())
    return float(weight * 0.5 ** (age / half_life))


@dataclass(slots=True)
class NodeHealth:
    node: str
    score: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)  # kind -> occurrences
    gpus: dict[str, float] = field(default_factory=dict)  # gpu -> score
    last_fault_at: datetime | None = None

    def to_json(self, place: Mapping[str, str] | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "node": self.node,
            "score": round(self.score, 3),
            "faults": dict(sorted(self.faults.items())),
            "gpus": [
                {"gpu": gpu, "score": round(score, 3)}
                for gpu, score in sorted(self.gpus.items(), key=lambda kv: (-kv[1], kv[0]))
            ],
            "last_fault_at": None if self.last_fault_at is None else self.last_fault_at.isoformat(),
        }
        if place is not None:
            data["topology"] = dict(place)
        return data


def score_nodes(alerts: Iterable[Alert], policy: Policy, now: datetime) -> list[NodeHealth]:
    """Pure: the nodes with at least one fault within the horizon, sickest first (ties by
    name). `alerts`: occurrences (their `starts_at` is when the fault happened)."""
    rules = policy.node_health
    nodes: dict[str, NodeHealth] = {}
    for alert in alerts:
        node = alert.node
        age = (now - alert.starts_at).total_seconds()
        if not node or age > rules.horizon:
            continue
        fault = fault_of(alert, policy)
        if fault is None:
            continue
        health = nodes.get(node)
        if health is None:
            health = nodes[node] = NodeHealth(node)
        value = decayed(fault.weight, alert.starts_at, now, rules.half_life)
        health.score += value
        health.faults[fault.kind] = health.faults.get(fault.kind, 0) + 1
        if fault.gpu and (fault.gpu in health.gpus or len(health.gpus) < MAX_GPUS_PER_NODE):
            health.gpus[fault.gpu] = health.gpus.get(fault.gpu, 0.0) + value
        if health.last_fault_at is None or alert.starts_at > health.last_fault_at:
            health.last_fault_at = alert.starts_at
    return sorted(nodes.values(), key=lambda h: (-h.score, h.node))
