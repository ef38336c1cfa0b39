"""What a storm summary counts (pure): the alert changes folded into it, bounded in size.

`Tally` counts firing and resolved changes by alertname, priority, node, GPU and incident
(the incidents whose cards the storm speaks for), with the most urgent lines by name;
`render_summary` turns it into the summary a channel renders (the payload's `storm`).
`storm_fold.TallyFold` is the same count, kept in place for a planning batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from trainsentry.alerts import Alert, AlertStatus, Priority
from trainsentry.gateway.policy.rules import Policy
from trainsentry.labels import gpu_label

OTHER = "(other)"


@dataclass(frozen=True, slots=True)
class StormEntry:
    """One alert change as a storm summary counts it."""

    alert: Alert
    priority: Priority
    status: AlertStatus
    at: datetime
    alert_id: int | None = None
    incident: str = ""  # the incident it is in, as the summary lists it ("#12 DiskFull")
    own: bool = False  # announced on its own (a new cause's page): counted, not folded


def line_of(entry: StormEntry, policy: Policy) -> dict[str, Any]:
    labels = entry.alert.labels
    line: dict[str, Any] = {
        "alertname": entry.alert.name,
        "priority": entry.priority.value,
        "status": entry.status.value,
        "fingerprint": entry.alert.fingerprint,
        "node": entry.alert.node,
        "gpu": gpu_label(labels, policy.gpu_labels),
        "summary": entry.alert.annotations.get("summary", ""),
        "at": entry.at.isoformat(),
    }
    job = entry.alert.job
    if job is not None:
        line["job"] = str(job)
    if entry.alert_id is not None:
        line["alert_id"] = entry.alert_id
    if entry.incident:
        line["incident"] = entry.incident
    return line


def line_order(line: Mapping[str, Any]) -> tuple[int, int, str, str]:
    # Most urgent first, firing before resolved, then earliest, then stable by fingerprint.
    status_rank = 0 if line["status"] == AlertStatus.FIRING.value else 1
    return (int(line["priority"][1]), status_rank, line["at"], line["fingerprint"])


# Priorities are never folded into OTHER: there are only four, and the storm's own priority
# is read back from them (`Tally.priority`).
PRIORITY_KEYS = len(Priority)


def _bump(counts: Mapping[str, int], key: str, cap: int) -> dict[str, int]:
    updated = dict(counts)
    if key not in updated and len(updated) >= cap:
        key = OTHER
    updated[key] = updated.get(key, 0) + 1
    return updated


@dataclass(frozen=True, slots=True)
class Tally:
    """Counts of the alert changes folded since the last summary (bounded in size)."""

    total: int = 0
    firing: int = 0
    resolved: int = 0
    own: int = 0  # of them announced on their own (counted; no summary for them alone)
    by_alertname: Mapping[str, int] = field(default_factory=dict)
    by_priority: Mapping[str, int] = field(default_factory=dict)
    by_node: Mapping[str, int] = field(default_factory=dict)
    by_gpu: Mapping[str, int] = field(default_factory=dict)
    by_incident: Mapping[str, int] = field(default_factory=dict)
    top: tuple[Mapping[str, Any], ...] = ()
    first_at: datetime | None = None
    last_at: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.total == 0

    @property
    def folded(self) -> bool:
        """Something was folded (a summary is owed): not only alerts sent on their own."""
        return self.total > self.own

    @property
    def priority(self) -> Priority:
        """The most urgent priority counted (P3 when empty)."""
        levels = [int(p[1]) for p, n in self.by_priority.items() if n > 0]
        return Priority(f"P{min(levels)}") if levels else Priority.P3

    def add(self, entry: StormEntry, policy: Policy) -> Tally:
        rules = policy.storm
        cap = rules.max_keys
        labels = entry.alert.labels
        node = entry.alert.node or "(none)"
        gpu = gpu_label(labels, policy.gpu_labels)
        gpu_key = f"{node}/{gpu}" if gpu else "(none)"
        top = self.top
        if rules.top_lines:
            order = (
                entry.priority.level,
                0 if entry.status is AlertStatus.FIRING else 1,
                entry.at.isoformat(),
                entry.alert.fingerprint,
            )
            if len(top) < rules.top_lines or order < line_order(top[-1]):
                line = line_of(entry, policy)
                top = tuple(sorted((*top, line), key=line_order)[: rules.top_lines])
        firing = entry.status is AlertStatus.FIRING
        return Tally(
            total=self.total + 1,
            firing=self.firing + (1 if firing else 0),
            resolved=self.resolved + (0 if firing else 1),
            own=self.own + (1 if entry.own else 0),
            by_alertname=_bump(self.by_alertname, entry.alert.name or "(unnamed)", cap),
            by_priority=_bump(self.by_priority, entry.priority.value, PRIORITY_KEYS),
            by_node=_bump(self.by_node, node, cap),
            by_gpu=_bump(self.by_gpu, gpu_key, cap),
            by_incident=(
                _bump(self.by_incident, entry.incident, cap) if entry.incident else self.by_incident
            ),
            top=top,
            first_at=entry.at if self.first_at is None else min(self.first_at, entry.at),
            last_at=entry.at if self.last_at is None else max(self.last_at, entry.at),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "firing": self.firing,
            "resolved": self.resolved,
            "own": self.own,
            "by_alertname": dict(self.by_alertname),
            "by_priority": dict(self.by_priority),
            "by_node": dict(self.by_node),
            "by_gpu": dict(self.by_gpu),
            "by_incident": dict(self.by_incident),
            "top": [dict(line) for line in self.top],
            "first_at": _iso(self.first_at),
            "last_at": _iso(self.last_at),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tally:
        return cls(
            total=int(data["total"]),
            firing=int(data["firing"]),
            resolved=int(data["resolved"]),
            own=int(data.get("own", 0)),
            by_alertname=dict(data["by_alertname"]),
            by_priority=dict(data["by_priority"]),
            by_node=dict(data["by_node"]),
            by_gpu=dict(data["by_gpu"]),
            by_incident=dict(data.get("by_incident") or {}),
            top=tuple(dict(line) for line in data["top"]),
            first_at=_dt(data.get("first_at")),
            last_at=_dt(data.get("last_at")),
        )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _sorted_counts(counts: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def render_summary(
    tally: Tally,
    policy: Policy,
    *,
    job: str,
    start: datetime,
    end: datetime,
    **extra: Any,
) -> dict[str, Any]:
    """The summary dict a channel renders (the `storm` field of the payload contract)."""
    summary: dict[str, Any] = {
        "job": job,
        "total": tally.total,
        "firing": tally.firing,
        "resolved": tally.resolved,
        "own": tally.own,  # of them sent on their own cards (a new cause's page)
        "by_alertname": _sorted_counts(tally.by_alertname),
        "by_priority": dict(sorted(tally.by_priority.items())),
        "by_node": _sorted_counts(tally.by_node),
        "by_gpu": _sorted_counts(tally.by_gpu),
        "by_incident": _sorted_counts(tally.by_incident),
        "items": [dict(line) for line in tally.top],
        "start": start.isoformat(),
        "end": end.isoformat(),
        "window_s": max(0, int((end - start).total_seconds())),
    }
    if policy.storm.list_url:
        summary["list_url"] = policy.storm.list_url.format(
            job=job, start=start.isoformat(), end=end.isoformat()
        )
    summary.update(extra)
    return summary


def build_summary(
    entries: Iterable[StormEntry],
    policy: Policy,
    *,
    job: str,
    start: datetime,
    end: datetime,
) -> dict[str, Any]:
    """The summary of the given alert changes (e.g. the stored alerts of one interval)."""
    tally = Tally()
    for entry in entries:
        tally = tally.add(entry, policy)
    return render_summary(tally, policy, job=job, start=start, end=end)
