"""Core types shared by every part of trainsentry: priorities, alerts, jobs, notifications."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainsentry.labels import (
    JOB_NAME_LABELS,
    NAMESPACE_LABEL,
    SCRAPE_JOB_LABEL,
    job_name_of,
    node_of,
)

# Alertmanager writes this for "no end time" (Go's zero time.Time).
GO_ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
# Alert ids are 64-bit in the store: a larger number names no alert (and SQLite refuses it).
MAX_ALERT_ID = 2**63 - 1
#: The alert a stalled rank's probe raises through the gateway (gateway/stages/hang/trigger.py);
#: not a Prometheus rule, so the operator counts it among the hang alerts by this name.
PROBE_HANG_ALERT = "TrainingCollectiveStalled"


class Priority(enum.StrEnum):
    """P0 = page now, P1 = act within the hour, P2 = act today, P3 = informational."""

    P0 = "P0"
    P1 = "P1"
    P2 = "P2"
    P3 = "P3"

    @property
    def level(self) -> int:
        return int(self.value[1])

    def raised(self, steps: int = 1) -> Priority:
        """The priority `steps` levels more urgent, never above P0."""
        return Priority(f"P{max(0, self.level - steps)}")

    def at_least(self, other: Priority) -> bool:
        """True when self is as urgent as `other` or more."""
        return self.level <= other.level


_PRIORITIES = {priority.value: priority for priority in Priority}


def parse_priority(value: str) -> Priority | None:
    """`P0`..`P3` in any case, surrounding spaces ignored; None for anything else."""
    return _PRIORITIES.get(value.strip().upper())


class AlertStatus(enum.StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


#: The prefix of a TrainingJob's key (`JobRef.key`; storm.job_key gives other jobs' units).
JOB_KEY_PREFIX = "trainingjob:"


@dataclass(frozen=True, slots=True)
class JobRef:
    """The training job an alert belongs to, as far as its labels tell: the one identity of a
    job, in two renderings. `str(job)` ("namespace/name"; "name" without a namespace) is what
    people read: cards, the console, the payload's `job` (`labels.job_text` writes the same
    from bare labels, `storm.job_title` from a key). `key` ("trainingjob:namespace/name") is
    what the policy keys states and indexes by: storm units, realms, failure domains."""

    namespace: str
    name: str

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> JobRef | None:
        name = job_name_of(labels)
        if not name:
            return None
        return cls(namespace=labels.get(NAMESPACE_LABEL, ""), name=name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def key(self) -> str:
        return f"{JOB_KEY_PREFIX}{self.namespace}/{self.name}"


#: The labels `job_key` reads (and storms keep of a job's alerts).
JOB_KEY_LABELS = (NAMESPACE_LABEL, *JOB_NAME_LABELS, SCRAPE_JOB_LABEL)
# what the labels `job_key` reads hold -> the key they make: the policy asks it of every
# alert several times (its storm, its realm, its incident); bounded (cleared when full).
_JOB_KEYS: dict[tuple[str | None, ...], str] = {}
_JOB_KEYS_MAX = 4096


def job_key(labels: Mapping[str, str]) -> str:
    """Pure: the storm unit an alert belongs to: its TrainingJob's `JobRef.key`, else its
    scrape job's ("job:namespace/job"), else "cluster". Here, with `JobRef`, because the
    policy's storms and the store's inbox partitions (store/inbox.py) both key by it.
    Memoised by the labels it reads, which changes no answer."""
    held = tuple(map(labels.get, JOB_KEY_LABELS))
    found = _JOB_KEYS.get(held)
    if found is None:
        found = _job_key(labels)
        if len(_JOB_KEYS) >= _JOB_KEYS_MAX:
            _JOB_KEYS.clear()
        _JOB_KEYS[held] = found
    return found


def _job_key(labels: Mapping[str, str]) -> str:
    """`job_key`, worked out."""
    if training := JobRef.from_labels(labels):
        return training.key
    namespace = labels.get(NAMESPACE_LABEL, "")
    job = labels.get(SCRAPE_JOB_LABEL, "")
    if namespace or job:
        return f"job:{namespace}/{job}"
    return "cluster"


class _Unset:
    """Marks a lazily computed field not computed yet."""


_UNSET = _Unset()


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as Alertmanager reports it (one element of a webhook's `alerts[]`)."""

    fingerprint: str
    status: AlertStatus
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime | None
    generator_url: str = ""
    # The node it is about as the store resolved it (the first of the policy's `node_labels`,
    # store/writes.py) and every copy read back carries; None: an alert made from its labels
    # alone (a webhook not stored yet, a test), whose node is the first of NODE_LABELS.
    resolved_node: str | None = field(default=None, compare=False, repr=False, kw_only=True)
    # JobRef.from_labels, worked out on first use: the policy asks several times per alert.
    # (init=False: `dataclasses.replace` resets it, so new labels get their own job.)
    _job: JobRef | _Unset | None = field(default=_UNSET, compare=False, repr=False, init=False)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def job(self) -> JobRef | None:
        job = self._job
        if isinstance(job, _Unset):
            job = JobRef.from_labels(self.labels)
            object.__setattr__(self, "_job", job)
        return job

    @property
    def node(self) -> str:
        """The node it is about, "" when none: `resolved_node` (the policy's `node_labels`)
        when it was resolved, else the first of the default NODE_LABELS. Every part of the
        gateway names an alert's node by this."""
        return node_of(self.labels) if self.resolved_node is None else self.resolved_node


class ChangeKind(enum.StrEnum):
    """What happened to an alert occurrence, as recorded in the store's event log."""

    FIRING = "firing"  # a new occurrence (fingerprint + startsAt) was seen firing
    RESOLVED = "resolved"  # a firing occurrence was reported resolved
    EXPIRED = "expired"  # a firing occurrence stopped being sent and its endsAt passed


@dataclass(frozen=True, slots=True)
class AlertChange:
    """A state change of a stored alert occurrence: the input of the alert policy."""

    alert_id: int
    kind: ChangeKind
    alert: Alert
    at: datetime
    # The Alertmanager group (the webhook's `groupKey`) whose notification carried the change;
    # "" when none did (an expiry, a sender without groups). Incidents group by it.
    group_key: str = ""


@dataclass(slots=True)
class NotificationDraft:
    """A notification the policy decided to send, before it is written to the outbox."""

    channel: str
    kind: str
    priority: Priority
    idempotency_key: str
    payload: dict[str, Any]
    alert_id: int | None = None
    group_key: str = ""
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Person:
    """Someone the escalation calls (a roster member): how to reach them by phone or Feishu."""

    name: str
    phone: str = ""
    feishu_open_id: str = ""
    email: str = ""
