"""Twins: a cluster-wide alert and its job-scoped copy are one alert (pure).

The shipped rules fire a node-scoped condition twice when a job that tunes the rule runs on
the node: the cluster-wide rule (no `trainingjob`) and the job's copy (docs/alerts.md "Job
scope": the operator copies no node rule a job does not tune). The
Alertmanager inhibition that drops the cluster-wide one cannot win the race at
`group_wait: 0s`: whichever reaches Alertmanager first is sent before the other exists.
So the gateway folds them: the copies share `twin_identity`, the first to arrive is the
alert of its incident, the other joins it as a copy (it adds its job; it counts neither as
a new alert on the card nor as a firing one: the alert resolves when both copies have).
"""

from __future__ import annotations

import hashlib
import json

from trainsentry.alerts import Alert

# What the job's copy adds to the cluster-wide alert's labels (docs/alerts.md "Job scope":
# `* on(node) group_left(namespace, trainingjob) trainsentry:job_node:info`).
JOB_LABELS = frozenset({"namespace", "trainingjob"})


# id(alert) -> (alert, its identity): the planner asks it three times per alert (the batch's
# index keys, its incident, its correlation). The alert is kept with its entry, so its id is
# not reused while the entry lives; alerts are frozen. Bounded (cleared when full).
_KNOWN: dict[int, tuple[Alert, str]] = {}
_KNOWN_MAX = 4096


def twin_identity(alert: Alert) -> str:
    """Pure: `identity_of(alert)`, memoised per alert object (bounded)."""
    entry = _KNOWN.get(id(alert))
    if entry is not None and entry[0] is alert:
        return entry[1]
    found = identity_of(alert)
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[id(alert)] = (alert, found)
    return found


def identity_of(alert: Alert) -> str:
    """Pure: what a cluster-wide alert and its job-scoped copy share: the alertname and every
    label but the job's (`JOB_LABELS`), as a digest ("" for an alert that names no node:
    only node-scoped rules have copies). Invariant: equal for the two copies, whichever has
    the job; different when any other label differs (another GPU, port, mountpoint, pod:
    the inhibition's `equal` labels and more, so no two real alerts are ever one)."""
    labels = alert.labels
    if not labels.get("node"):
        return ""
    kept = sorted((k, v) for k, v in labels.items() if k not in JOB_LABELS)
    digest = hashlib.sha256(json.dumps([alert.name, kept]).encode()).hexdigest()
    return f"{alert.name}:{digest[:32]}"
