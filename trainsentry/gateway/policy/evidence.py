"""Hardware evidence (pure): whether an alert occurrence is a firing that Prometheus's own
rule evaluation produced, told from Prometheus's `ALERTS` series (docs/infrastructure.md,
"Hardware evidence").

For every alerting rule it evaluates, Prometheus writes the series
`ALERTS{alertname, alertstate="firing", <the alert's labels>}`, one sample at each evaluation
while the alert fires and a staleness marker when it stops, and sends the alert with
`startsAt` = the evaluation at which it started firing (`FiredAt`). An alert posted to
Alertmanager or to the gateway by anyone else has no such series: its labels, its
`generatorURL` and its sender are all the poster's word; the series is not.

An occurrence is confirmed by an *episode start*: a sample of a firing `ALERTS` series
- whose labels (less `__name__` and `alertstate`) are all among the occurrence's labels, with
  the same values (the occurrence may carry more: Prometheus's external labels);
- at most TOLERANCE_S from the occurrence's `startsAt` (an HA pair's replicas fire one
  evaluation apart, and Alertmanager keeps the earlier);
- with no sample of the same series in the QUIET_S before it (a firing that goes on is one
  episode, however many occurrences claim to start during it).
Each episode start confirms at most one occurrence: copies of a real alert with one more
label, or with a `startsAt` a second off, count once between them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainsentry.alerts import Alert
from trainsentry.labels import NODE_LABELS

TOLERANCE_S = 120.0  # |episode start - startsAt| at most
QUIET_S = 600.0  # no firing sample of the series this long before an episode start
MAX_NODES_PER_QUERY = 50  # nodes named in one query's selector
MAX_ALERTS_PER_QUERY = 500  # occurrences answered by one query
MAX_SERIES = 20_000  # series read from one answer
MAX_SAMPLES = 500_000  # samples read from one answer
# A node name that can be cordoned (a DNS subdomain) and an alertname we can quote safely.
_NODE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_ALERTNAME = re.compile(r"[A-Za-z0-9_:.\-]{1,200}")

Key = tuple[str, str]  # (fingerprint, startsAt ISO): one occurrence


class EvidenceError(ValueError):
    """Prometheus's answer is not a range vector we can read."""


@dataclass(frozen=True, slots=True)
class Firing:
    """An episode start of an `ALERTS` series: its labels and the sample's time (Unix s)."""

    labels: frozenset[tuple[str, str]]
    at: float


@dataclass(frozen=True, slots=True)
class Query:
    """One instant query of a range vector: `expr` evaluated at `at` (Unix s)."""

    expr: str
    at: float
    alerts: tuple[Alert, ...]


def key_of(alert: Alert) -> Key:
    """Pure: the occurrence's identity (the store keeps one row per fingerprint and start)."""
    return (alert.fingerprint, alert.starts_at.isoformat())


def _node_label(alert: Alert) -> str | None:
    """Pure: the label the occurrence's node came from: the one holding `alert.node`, the node
    the store resolved by the policy's `node_labels` (a label the defaults name first, say
    node_exporter's `instance` address, is not the node when the policy says otherwise)."""
    node = alert.node
    if not node:
        return None
    preferred = [name for name in NODE_LABELS if alert.labels.get(name) == node]
    return next(iter(preferred), None) or next(
        (name for name, value in alert.labels.items() if value == node), None
    )


def checkable(alert: Alert) -> bool:
    """Pure: whether the occurrence can be looked up at all: a node that can be cordoned and
    a plain alertname (anything else is never evidence, and never spoils a query)."""
    name = _node_label(alert)
    return (
        name is not None
        and bool(_NODE.fullmatch(alert.labels[name]))
        and bool(_ALERTNAME.fullmatch(alert.name))
    )


def _alternatives(values: Iterable[str]) -> str:
    """Pure: an RE2 alternation matching exactly these values (each escaped)."""
    return "|".join(re.sub(r"([^A-Za-z0-9_])", r"\\\1", v) for v in sorted(set(values)))


def _string(value: str) -> str:
    """Pure: a PromQL double-quoted string literal (Go's escapes, which JSON's are)."""
    return json.dumps(value, ensure_ascii=False)


def queries(alerts: Sequence[Alert]) -> list[Query]:
    """Pure: the queries that answer these occurrences (checkable ones only), a batch per node
    label, per QUIET_S of start times and per MAX_NODES_PER_QUERY nodes, oldest first."""
    found: list[Query] = []
    by_label: dict[str, list[Alert]] = {}
    for alert in alerts:
        if checkable(alert):
            by_label.setdefault(_node_label(alert) or "", []).append(alert)
    for label, items in sorted(by_label.items()):
        batch: list[Alert] = []
        for alert in sorted(items, key=lambda a: (a.starts_at, a.fingerprint)):
            nodes = {a.labels[label] for a in batch} | {alert.labels[label]}
            if batch and (
                (alert.starts_at - batch[0].starts_at).total_seconds() > QUIET_S
                or len(nodes) > MAX_NODES_PER_QUERY
                or len(batch) >= MAX_ALERTS_PER_QUERY
            ):
                found.append(_query(label, batch))
                batch = []
            batch.append(alert)
        if batch:
            found.append(_query(label, batch))
    return found


def _query(label: str, batch: list[Alert]) -> Query:
    first = batch[0].starts_at.timestamp()
    last = batch[-1].starts_at.timestamp()
    at = last + TOLERANCE_S
    window = math.ceil(at - (first - TOLERANCE_S - QUIET_S))
    selector = ",".join(
        [
            'alertstate="firing"',
            f"alertname=~{_string(_alternatives(a.name for a in batch))}",
            f"{label}=~{_string(_alternatives(a.labels[label] for a in batch))}",
        ]
    )
    return Query(f"ALERTS{{{selector}}}[{window}s]", at, tuple(batch))


def read_matrix(answer: Any) -> list[tuple[dict[str, str], list[float]]]:
    """Pure: (labels, sample times) of each series of a `/api/v1/query` answer holding a range
    vector; EvidenceError for anything else, or more than MAX_SERIES / MAX_SAMPLES."""
    if not isinstance(answer, Mapping) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, Mapping) else None
        raise EvidenceError(f"Prometheus answered an error: {str(error)[:200]}")
    data = answer.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "matrix":
        raise EvidenceError("Prometheus answered no range vector")
    result = data.get("result")
    if not isinstance(result, list) or len(result) > MAX_SERIES:
        raise EvidenceError(f"Prometheus answered no list of at most {MAX_SERIES} series")
    series: list[tuple[dict[str, str], list[float]]] = []
    samples = 0
    for item in result:
        metric = item.get("metric") if isinstance(item, Mapping) else None
        values = item.get("values") if isinstance(item, Mapping) else None
        if not isinstance(metric, Mapping) or not isinstance(values, list):
            raise EvidenceError("a series without metric or values")
        samples += len(values)
        if samples > MAX_SAMPLES:
            raise EvidenceError(f"more than {MAX_SAMPLES} samples")
        try:
            times = sorted(float(v[0]) for v in values)
        except (TypeError, ValueError, IndexError, KeyError):
            raise EvidenceError("a sample that is not [time, value]") from None
        series.append(({str(k): str(v) for k, v in metric.items()}, times))
    return series


def episode_starts(series: Iterable[tuple[Mapping[str, str], Sequence[float]]]) -> list[Firing]:
    """Pure: the samples that start a firing (none of the series in the QUIET_S before)."""
    found: list[Firing] = []
    for labels, times in series:
        if labels.get("alertstate") != "firing":
            continue
        kept = frozenset((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate"))
        previous: float | None = None
        for at in sorted(times):
            if previous is None or at - previous > QUIET_S:
                found.append(Firing(kept, at))
            previous = at
    return found


def match(
    alerts: Iterable[Alert], starts: Iterable[Firing], claimed: Mapping[Firing, Key]
) -> dict[Key, Firing]:
    """Pure: occurrence -> the episode start that confirms it, one to one, each occurrence
    taking the nearest start not `claimed` (by another occurrence) nor taken here."""
    pool = list(starts)
    taken = set(claimed)
    confirmed: dict[Key, Firing] = {}
    for alert in sorted(alerts, key=lambda a: (a.starts_at, a.fingerprint)):
        key = key_of(alert)
        at = alert.starts_at.timestamp()
        labels = set(alert.labels.items())
        fits = [
            start
            for start in pool
            if abs(start.at - at) <= TOLERANCE_S
            and (start not in taken or claimed.get(start) == key)
            and start.labels <= labels
        ]
        if fits:
            best = min(fits, key=lambda start: (abs(start.at - at), start.at))
            confirmed[key] = best
            taken.add(best)
    return confirmed
