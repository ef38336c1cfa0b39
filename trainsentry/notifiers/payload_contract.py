"""The payload contract between the alert policy and the channels.

The one home of the payload types. The gateway's builders return them, so mypy checks the
writing side (`gateway/policy/payload_build.py`: alert and storm notices,
`gateway/stages/services/ack.py`:
acks, `gateway/policy/escalation.call_payload`: calls); the policy stores the result in
`NotificationDraft.payload` as a plain JSON dict, and every channel reads it back through
`parse_payload`, which checks it against the TypedDicts below. Only `priority` and
`status` are required; everything else is optional and a card/row simply leaves it out.
Keys not listed here are accepted and dropped, so the policy can add fields first and the
channels pick them up later.

Notification kinds (`OutboundNotification.kind`) the channels understand:
- ``alert``: an incident changed (an alert of it fired or resolved; gateway/policy/incident.py).
  Uses the alert fields of its cause alert and ``incident`` (how many alerts, nodes, GPUs);
  with ``redraw`` a channel that can update its card in place does so (Feishu app).
- ``storm``: many alerts collapsed into one summary. Uses ``storm``.
- ``ack``: an alert was acknowledged / silenced; the card is re-sent or updated. Uses
  ``acked_by`` / ``silenced_until``.
- ``call``: a phone call the escalation planned (`CallPayload`; the phone channel places it).
- ``handoff``: a schedule's shift change (`handoff`, gateway/stages/services/handoff.py).
- ``cordon``: a node health cordon recommendation or automatic cordon (`cordon`,
  gateway/stages/services/cordon.py; the Feishu card: notifiers/feishu/card.py, `cordon_card`).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

from trainsentry.labels import (
    NODE_LABELS,
    RANK_LABELS,
    first_label,
    gpu_label,
    hca_port,
    job_text,
)

PriorityName = Literal["P0", "P1", "P2", "P3"]
StatusName = Literal["firing", "resolved"]


class StormItem(TypedDict, total=False):
    """One alert inside a storm summary (all optional: use what is known)."""

    alert_id: int
    alertname: str
    priority: PriorityName
    job: str
    node: str
    gpu: str
    rank: str
    summary: str
    status: StatusName
    fingerprint: str
    at: str  # ISO 8601


class StormSummary(TypedDict):
    """Many alerts folded into one notification by the storm detector."""

    total: int  # how many alerts the storm holds (may exceed len(items))
    by_alertname: NotRequired[dict[str, int]]
    by_node: NotRequired[dict[str, int]]
    items: NotRequired[list[StormItem]]
    window_s: NotRequired[int]  # how long the storm has been collected
    firing: NotRequired[int]
    resolved: NotRequired[int]
    own: NotRequired[int]  # of `total`, those sent on their own cards (counted here too)
    by_priority: NotRequired[dict[str, int]]
    by_gpu: NotRequired[dict[str, int]]
    # the incidents folded ("#12 NodeFilesystemSpaceLow") and their alert changes counted
    by_incident: NotRequired[dict[str, int]]
    job: NotRequired[str]
    start: NotRequired[str]  # ISO 8601
    end: NotRequired[str]
    list_url: NotRequired[str]  # where the full list of the storm's alerts can be seen


class JobRoutePayload(TypedDict, total=False):
    """A TrainingJob's own route for this notification (gateway/policy/route.py,
    `apply_job_route`): its `job` ("namespace/name"), the gateway's Feishu channels its own
    destination replaced (`fallback`: where the card goes when the job's route fails, or
    when the job gave owners but no destination), its `owners` to mention (open_ids or
    email addresses), and whether its pages follow its own on-call `roster`."""

    job: str
    fallback: list[str]
    owners: list[str]
    roster: bool


class IncidentInfo(TypedDict, total=False):
    """The incident a card speaks for (gateway/policy/incident_cards.py `incident_block`):
    its alerts (firing / resolved), the nodes and GPUs they fire on (counted, the first
    `names_shown` named), why it pages on its own during a storm, and its page."""

    id: int
    status: StatusName
    alerts: int
    firing: int
    resolved: int
    nodes: int
    node_names: list[str]
    gpus: int
    gpu_names: list[str]
    ports: int  # HCA ports ("node device port") its alerts fire on: adapters, not GPUs
    port_names: list[str]
    alertnames: int  # the kinds of alert in it (only when more than one)
    alertname_names: list[str]
    mountpoints: int  # the filesystems (mountpoint label) its alerts name, on any node
    mountpoint_names: list[str]
    untracked: int  # alerts whose node or GPU was not counted by name (past the cap)
    cause: str  # the alertname of its cause
    opened_at: str  # ISO 8601
    resolved_at: str
    note: str
    spent: str  # why it resolved while jobs' alerts of it fired on (incident.py `_retire`)
    url: str  # the incident's page (policy.grouping.url)
    story: str  # its alerts in order, with times and the job impact (policy/story.py)
    jobs: list[str]  # the jobs its alerts belong to (the first `names_shown`)
    unknown: str  # resolutions not believed yet, and why (incident_cards.unknown_text)
    culprits: str  # a hung job's ranks whose probes went away, their pods and nodes


class HandoffNotice(TypedDict, total=False):
    """A schedule's shift change (kind "handoff", gateway/stages/services/handoff.py)."""

    schedule: str
    at: str  # ISO 8601, the schedule's local time
    previous: str | None  # who was paged first before `at` (None: nobody)
    to: str | None  # who is paged first from `at` (None: nobody)
    layer: str | None
    until: str | None
    next: list[dict[str, str]]


class NotificationPayload(TypedDict):
    """What the policy puts into `NotificationDraft.payload` (JSON-serialisable)."""

    priority: PriorityName
    status: StatusName
    alert_id: NotRequired[int]  # store id of the alert occurrence (ack/silence use it)
    fingerprint: NotRequired[str]
    alertname: NotRequired[str]
    labels: NotRequired[dict[str, str]]
    annotations: NotRequired[dict[str, str]]  # summary, description, runbook_url, value
    starts_at: NotRequired[str]  # ISO 8601
    ends_at: NotRequired[str | None]
    generator_url: NotRequired[str]
    grafana_url: NotRequired[str]
    reason: NotRequired[str]  # why the policy classified it so (human words)
    rule_id: NotRequired[str]  # which policy rule fired
    count: NotRequired[int]  # occurrences folded into this notification (flaps, repeats)
    mentions: NotRequired[list[str]]  # configured Feishu open_ids to <at> (feishu/markup.py)
    acked_by: NotRequired[str]
    # the acknowledger's configured Feishu open_id (gateway/stages/services/ackers.py), to mention
    acked_by_open_id: NotRequired[str]
    ack_comment: NotRequired[str]  # what the person who acknowledged wrote
    on_call: NotRequired[str]  # P0: who the escalation calls first, in words
    handoff: NotRequired[HandoffNotice]  # kind "handoff": a schedule's shift change
    silenced_until: NotRequired[str]  # ISO 8601
    storm: NotRequired[StormSummary]
    incident: NotRequired[IncidentInfo]  # kind "alert": the incident the card speaks for
    redraw: NotRequired[bool]  # update the incident's card in place where the channel can
    diagnosis: NotRequired[str]  # one-line verdict of the hang analyzer, if any
    message_id: NotRequired[str]  # kind "ack": the Feishu card to update in place
    # Written by the policy (gateway/policy/payload_build.py); channels may show them.
    # firing | recurrence | flapping | resolved | expired | acked | storm_started |
    # storm_summary | storm_ended (what the policy decided; see gateway/policy/payload_build.py)
    event: NotRequired[str]
    job: NotRequired[str]  # "namespace/name" of the training job
    node: NotRequired[str]  # the alert's node, by the policy's `node_labels` (`node_of`)
    rule_ids: NotRequired[list[str]]
    route: NotRequired[str]
    recurrences: NotRequired[int]
    flap_transitions: NotRequired[int]
    expired: NotRequired[bool]
    held_until: NotRequired[str]
    at: NotRequired[str]  # when the policy decided (ISO 8601)
    job_route: NotRequired[JobRoutePayload]  # the TrainingJob's own route, if it has one
    # the alert's node's place in the topology, {level: element} (docs/infrastructure.md)
    topology: NotRequired[dict[str, str]]
    # kind "infra": the infrastructure incident (element, nodes, jobs, likely cause)
    infrastructure: NotRequired[dict[str, Any]]
    # kind "cordon": node, summary, score, faults, jobs, status, reason (stages/services/cordon.py)
    cordon: NotRequired[dict[str, Any]]
    # a maintenance window: the "ends soon" notice (event maintenance_ending: window_id,
    # window_reason, ends_at, firing, alerts, more) or a released alert (window_id, ended_at)
    # (gateway/policy/maintenance_mutes.py)
    maintenance: NotRequired[dict[str, Any]]
    # the archive row's (notifiers/rows.py): the priority of the incident the alert is in
    incident_priority: NotRequired[str]


class PersonPayload(TypedDict):
    name: str
    phone: NotRequired[str]
    feishu_open_id: NotRequired[str]


class CallPayload(TypedDict):
    """Payload of a kind="call" notification."""

    priority: str
    status: str  # always "firing": resolved alerts are never called
    alert_id: int
    step: int
    layer: str
    person: PersonPayload
    text: str
    message_id: NotRequired[str]
    cancelled: NotRequired[str]


_ADAPTER: TypeAdapter[NotificationPayload] = TypeAdapter(NotificationPayload)


class PayloadError(ValueError):
    """The payload does not follow `NotificationPayload`."""


def parse_payload(raw: dict[str, Any]) -> NotificationPayload:
    """Checks a raw payload dict against the contract; raises PayloadError with the reason."""
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise PayloadError(f"notification payload invalid: {exc.errors()[:3]}") from exc


def label(payload: NotificationPayload, *names: str) -> str:
    """The first non-empty label among `names` (exporters name the same thing differently)."""
    return first_label(payload.get("labels") or {}, names)


def annotation(payload: NotificationPayload, name: str) -> str:
    return (payload.get("annotations") or {}).get(name, "")


def alertname(payload: NotificationPayload) -> str:
    return payload.get("alertname") or label(payload, "alertname")


def job_of(payload: NotificationPayload) -> str:
    """`namespace/name` of the training job, or "" when the payload does not say."""
    if payload.get("job"):
        return payload.get("job", "")
    return job_text(payload.get("labels") or {})


def node_of(payload: NotificationPayload) -> str:
    """The node the policy named (its `node_labels`, the one every part uses); payloads
    written before the policy said so: the first of the default labels."""
    if "node" in payload:
        return payload.get("node", "")
    return label(payload, *NODE_LABELS)


def gpu_of(payload: NotificationPayload) -> str:
    """The GPU the alert names; an HCA's `device` is not one (`hca_of`)."""
    return gpu_label(payload.get("labels") or {})


def hca_of(payload: NotificationPayload) -> str:
    """ "mlx5_0 port 1" when the alert is about an HCA's port, else ""."""
    return hca_port(payload.get("labels") or {})


def rank_of(payload: NotificationPayload) -> str:
    return label(payload, *RANK_LABELS)
