"""The weekly report's "where the hardware is sick" (pure): hardware faults only, as node
health weighs them (gateway/policy/health.py; a full checkpoint disk or an OOM is not sick
hardware), nodes ranked by their time-decayed fault score at the period's end."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from trainsentry.alerts import Alert, AlertStatus
from trainsentry.gateway.policy import Policy, fault_of, load_policy, score_nodes
from trainsentry.labels import GPU_ID_LABELS, first_label
from trainsentry.reports.figures import Hotspot, XidSeen
from trainsentry.store.report_loads import Occurrence


def _hotspots(keys: Iterable[tuple[str, str]], top: int) -> tuple[Hotspot, ...]:
    """(key, alertname) pairs → the `top` keys with most alerts, ties by key."""
    names: dict[str, Counter[str]] = defaultdict(Counter)
    for key, alertname in keys:
        if key:
            names[key][alertname] += 1
    ranked = sorted(names.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:top]
    return tuple(
        Hotspot(
            key,
            sum(c.values()),
            tuple(n for n, _ in sorted(c.items(), key=lambda x: (-x[1], x[0]))),
        )
        for key, c in ranked
    )


def _xid_order(code: str) -> tuple[int, str]:
    return (int(code), code) if code.isdigit() else (1 << 30, code)


_SHIPPED: list[Policy] = []


def policy_of(given: Policy | None) -> Policy:
    """`given`, else the shipped policy (loaded once)."""
    if given is not None:
        return given
    if not _SHIPPED:
        _SHIPPED.append(load_policy())
    return _SHIPPED[0]


def as_alert(occ: Occurrence) -> Alert:
    return Alert(
        occ.fingerprint,
        AlertStatus.FIRING,
        occ.labels,
        {},
        occ.starts_at,
        None,
        resolved_node=occ.node,
    )


def _sick_nodes(
    faults: Sequence[Occurrence], policy: Policy, end: datetime, top: int
) -> tuple[Hotspot, ...]:
    """The nodes with hardware faults, sickest first by their time-decayed score at `end`."""
    names: dict[str, Counter[str]] = defaultdict(Counter)
    for occ in faults:
        names[occ.node][occ.alertname] += 1
    ranked = score_nodes((as_alert(o) for o in faults), policy, end)[:top]
    return tuple(
        Hotspot(
            h.node,
            sum(h.faults.values()),
            tuple(n for n, _ in sorted(names[h.node].items(), key=lambda x: (-x[1], x[0]))),
            score=h.score,
        )
        for h in ranked
    )


def hardware(
    occs: Sequence[Occurrence], top: int, policy: Policy, end: datetime
) -> tuple[tuple[Hotspot, ...], tuple[Hotspot, ...], tuple[Hotspot, ...], tuple[XidSeen, ...]]:
    """Where the hardware is sick: nodes ranked by their hardware fault score, the GPUs and IB
    ports with most faults (only hardware faults count: a full checkpoint disk or an OOM is
    not sick hardware), and the XID codes seen."""
    hardware = [o for o in occs if fault_of(as_alert(o), policy) is not None]
    hot_nodes = _sick_nodes(hardware, policy, end, top)
    hot_gpus = _hotspots(
        (
            (f"{o.node} GPU {gpu}", o.alertname)
            for o in hardware
            if o.component == "gpu" and (gpu := first_label(o.labels, GPU_ID_LABELS))
        ),
        top,
    )
    hot_ports = _hotspots(
        (
            (f"{o.node} {o.labels['device']}:{o.labels.get('port', '?')}", o.alertname)
            for o in hardware
            if o.component == "fabric" and o.labels.get("device")
        ),
        top,
    )
    xid_counts: Counter[str] = Counter()
    xid_gpus: dict[str, set[str]] = defaultdict(set)
    for occ in occs:
        xid = occ.labels.get("xid")
        if xid:
            xid_counts[xid] += 1
            xid_gpus[xid].add(f"{occ.node}/{first_label(occ.labels, GPU_ID_LABELS)}")
    xids = tuple(
        XidSeen(code, n, len(xid_gpus[code]))
        for code, n in sorted(xid_counts.items(), key=lambda kv: (-kv[1], _xid_order(kv[0])))
    )
    return hot_nodes, hot_gpus, hot_ports, xids


def fault_count(occs: Sequence[Occurrence], policy: Policy) -> int:
    """How many occurrences are hardware faults."""
    return sum(1 for o in occs if fault_of(as_alert(o), policy) is not None)
