"""The alert policy as data: classification, XID table, blast radius, dedup, storms, routes.

The shipped default lives in `trainsentry/data/policy.yaml`. `load_policy` reads it, merges
a policy file and any number of override mappings over it (config, later a TrainingJob),
and validates the result. `merge_policy` applies overrides to an already loaded policy.

Merge rule: mappings merge key by key; lists and scalars replace. So an override can
change one XID entry or one default route without repeating the rest, and a list such as
`alertname_rules` is given whole when it is given at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainsentry.alerts import Priority
from trainsentry.assets import data_file
from trainsentry.config.problems import ConfigError
from trainsentry.labels import GPU_LABELS, NODE_LABELS
from trainsentry.userregex import RegexRefused, check_user_regex

DEFAULT_POLICY_FILE = "policy.yaml"

Seconds = Annotated[float, Field(gt=0)]


class PolicyError(ConfigError):
    """The policy (file or override) is invalid; the message says where and why. A
    configuration error like any other (the policy file is `gateway.policy_file`)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_regex(value: str) -> str:
    """A pattern the policy matches labels with: RE2, anchored (trainsentry/userregex.py)."""
    try:
        return check_user_regex(value)
    except RegexRefused as exc:
        raise ValueError(f"invalid regex {value[:80]!r}: {exc}") from None


class AlertnameRule(_Strict):
    """Sets the base priority of alerts whose alertname (and labels) match."""

    id: str = Field(min_length=1)
    alertname: str = ".*"
    labels: dict[str, str] = Field(default_factory=dict)
    priority: Priority
    reason: str = ""

    @field_validator("alertname")
    @classmethod
    def _alertname_regex(cls, value: str) -> str:
        return _check_regex(value)

    @field_validator("labels")
    @classmethod
    def _label_regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _check_regex(pattern)
        return value


class HardwareRule(AlertnameRule):
    """Raises the priority of alerts whose name or labels show a hardware fault."""


class XidEntry(_Strict):
    name: str
    priority: Priority
    # NVIDIA's "Resolution Bucket (Immediate Action)" for the code (RESTART_APP, IGNORE,
    # RESET_GPU, RESTART_BM, CONTACT_SUPPORT, WORKFLOW_XID_48, ...; rules/xid_catalogue.yaml
    # cites the source); node health weighs the XID by it (`NodeHealthPolicy.xid_buckets`)
    resolution: str = ""
    action: str = ""


class ClassificationPolicy(_Strict):
    default_priority: Priority = Priority.P2
    alertname_rules: tuple[AlertnameRule, ...] = ()
    severity: dict[str, Priority] = Field(default_factory=dict)
    xid_labels: tuple[str, ...] = ("xid",)
    xid: dict[int, XidEntry] = Field(default_factory=dict)
    hardware_rules: tuple[HardwareRule, ...] = ()

    @field_validator("severity")
    @classmethod
    def _lowercase_severities(cls, value: dict[str, Priority]) -> dict[str, Priority]:
        return {key.strip().lower(): prio for key, prio in value.items()}

    @model_validator(mode="after")
    def _unique_rule_ids(self) -> ClassificationPolicy:
        ids = [r.id for r in (*self.alertname_rules, *self.hardware_rules)]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate rule ids: {duplicates}")
        return self


class BlastRadiusPolicy(_Strict):
    enabled: bool = True
    nodes: int = Field(default=8, ge=2)
    window: Seconds = 300
    raise_by: int = Field(default=1, ge=1, le=3)


class DedupPolicy(_Strict):
    recurrence_window: Seconds = 3600
    flap_transitions: int = Field(default=4, ge=2)
    flap_window: Seconds = 900
    flap_hold: Seconds = 600


class StormPolicy(_Strict):
    enabled: bool = True
    threshold: int = Field(default=20, ge=1)
    window: Seconds = 60
    summary_interval: Seconds = 60
    calm_after: Seconds = 120
    top_lines: int = Field(default=10, ge=0, le=100)
    max_keys: int = Field(default=50, ge=1, le=1000)
    list_url: str = ""  # placeholders: {job}, {start}, {end}

    @field_validator("list_url")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            value.format(job="j", start="s", end="e")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"list_url may use only {{job}}, {{start}}, {{end}}: {exc}") from exc
        return value


class GroupingPolicy(_Strict):
    """Incidents, the unit of notification (gateway/policy/incident.py, docs/policy.md).

    `by`: `group_key` (one incident per Alertmanager group, the webhook's `groupKey`; a
    change without one falls back to `alertname`), `alertname` (one per job and
    alertname) or `alert` (one per alert occurrence: a card per alert, as before incidents).
    `follow_up_interval`: a channel that cannot update a card it sent (the Feishu bot) gets
    a new card of an incident when its state or priority changes, and otherwise at most
    one follow-up per this many seconds (Alertmanager's `group_interval`).
    `names_shown`: nodes and GPUs named on a card (the rest: "and N more");
    `max_tracked`: nodes and GPUs counted by name per incident (beyond: counted, unnamed).
    `url`: the incident's page (placeholders {incident}, {alert_id}); "": no link.
    """

    by: Literal["group_key", "alertname", "alert"] = "group_key"
    follow_up_interval: Seconds = 300
    names_shown: int = Field(default=10, ge=0, le=100)
    max_tracked: int = Field(default=500, ge=1, le=10000)
    url: str = ""

    @field_validator("url")
    @classmethod
    def _known_url_placeholders(cls, value: str) -> str:
        try:
            value.format(incident=1, alert_id=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"url may use only {{incident}}, {{alert_id}}: {exc}") from exc
        return value


class CorrelationPolicy(_Strict):
    """Failure domains (gateway/policy/correlate.py, docs/policy.md "Correlation").

    `enabled`: alerts of one node (faults, NotReady, exporters down, the ranks' probes) are
    one incident across alertnames and Alertmanager groups, and the job-level alerts of a
    job with ranks there (RAS, hang) join it as consequences; off: incidents as
    `grouping` says, nothing more (a cluster-wide alert and its job-scoped twin are folded
    either way). `window`: seconds a failure domain keeps gathering the job-level alerts
    of its jobs after its last alert. `confirm_resolved`: seconds a hardware fault's
    resolution waits for its node to prove alive (its exporters' and NotReady alerts stay
    quiet) before it counts; while they fire, its resolution is "unknown".
    """

    enabled: bool = True
    window: Seconds = 600
    confirm_resolved: Seconds = 300


class InfrastructurePolicy(_Strict):
    """Infrastructure incidents across jobs (gateway/policy/infra.py)."""

    enabled: bool = True
    nodes: int = Field(default=3, ge=2)  # N: distinct nodes under one element ...
    window: Seconds = 120  # ... whose hardware alerts started within W seconds
    components: tuple[str, ...] = ("fabric", "node", "gpu")  # `component` labels counted
    levels: tuple[str, ...] = ()  # topology levels looked at (empty: all, most specific first)
    # Seconds a hardware alert under an element whose incident is not open waits before its
    # own card and page go out, for the element's other nodes (gateway/policy/infra_hold.py;
    # 0: at once). Alertmanager sends a group's later alerts one `group_interval` after its
    # first (1 m for P0): the hold must be longer.
    hold: float = Field(default=90, ge=0)
    # The `component`s held: those a switch's failure raises in pieces (its ports, on every
    # node cabled to it). A GPU falling off the bus is not a switch's doing: it pages at once.
    hold_components: tuple[str, ...] = ("fabric",)
    # Alerts of those components that say nothing about the hardware (a full disk, an OOM).
    ignore_alertnames: str = ""

    @field_validator("ignore_alertnames")
    @classmethod
    def _ignore_regex(cls, value: str) -> str:
        return _check_regex(value)

    # The labels an incident's cards carry and are routed by (write a route matching them).
    route_labels: dict[str, str] = Field(default_factory=lambda: {"scope": "infrastructure"})


class FaultRule(_Strict):
    """Alerts whose whole alertname matches `alertname` are a hardware fault of `kind`."""

    kind: str = Field(min_length=1, max_length=40)
    alertname: str
    weight: float = Field(ge=0)

    @field_validator("alertname")
    @classmethod
    def _alertname_regex(cls, value: str) -> str:
        return _check_regex(value)


class NodeHealthPolicy(_Strict):
    """The time-decayed fault score of nodes and GPUs (gateway/policy/health.py)."""

    half_life: Seconds = 7 * 86400  # a fault weighs half as much after this long
    horizon: Seconds = 30 * 86400  # faults older than this are not counted
    xid_buckets: dict[str, float] = Field(default_factory=dict)  # resolution -> weight
    faults: tuple[FaultRule, ...] = ()

    @field_validator("xid_buckets")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        if any(weight < 0 for weight in value.values()):
            raise ValueError("xid_buckets weights must be 0 or more")
        return value


class Route(_Strict):
    """One route: every matcher given must match; an empty list/mapping matches anything."""

    id: str = Field(min_length=1)
    priorities: tuple[Priority, ...] = ()
    namespaces: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    channels: tuple[str, ...]
    # The `oncall.escalation_policies` entry its phone pages follow ("": routing.escalation).
    escalation: str = ""

    @field_validator("labels")
    @classmethod
    def _label_regexes(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _check_regex(pattern)
        return value


class JobRoutingPolicy(_Strict):
    """What a TrainingJob's `spec.alerting` may change, per priority (the admin's bounds).

    `allow`: priorities whose Feishu cards follow the job's own chat or bot (and whose pages
    follow its on-call roster); a priority left out keeps the policy's route whatever the
    job says. `force`: channels (names as in routes) that keep the notification as well,
    per priority, e.g. `{P0: [feishu]}`: every P0 also reaches the gateway's own Feishu
    group. `mention`: priorities whose cards mention the job's owners.
    """

    allow: tuple[Priority, ...] = (Priority.P0, Priority.P1, Priority.P2, Priority.P3)
    force: dict[Priority, tuple[str, ...]] = Field(default_factory=dict)
    mention: tuple[Priority, ...] = (Priority.P0, Priority.P1)


class RoutingPolicy(_Strict):
    routes: tuple[Route, ...] = ()
    defaults: dict[Priority, tuple[str, ...]] = Field(
        default_factory=lambda: {
            Priority.P0: ("feishu", "phone", "sheet"),
            Priority.P1: ("feishu", "sheet"),
            Priority.P2: ("feishu", "sheet"),
            Priority.P3: ("sheet",),
        }
    )
    paging_channels: tuple[str, ...] = ("phone",)
    always: tuple[str, ...] = ("console",)
    # Per priority, the escalation policy of pages whose route names none (absent: the
    # default `oncall.escalation` layers).
    escalation: dict[Priority, str] = Field(default_factory=dict)
    jobs: JobRoutingPolicy = Field(default_factory=JobRoutingPolicy)

    @model_validator(mode="after")
    def _every_priority_has_defaults(self) -> RoutingPolicy:
        missing = [p.value for p in Priority if p not in self.defaults]
        if missing:
            raise ValueError(f"routing.defaults lacks {missing}")
        ids = [r.id for r in self.routes]
        if len(ids) != len(set(ids)):
            raise ValueError("route ids must be unique")
        return self


class Policy(_Strict):
    version: int = 1
    classification: ClassificationPolicy = Field(default_factory=ClassificationPolicy)
    blast_radius: BlastRadiusPolicy = Field(default_factory=BlastRadiusPolicy)
    dedup: DedupPolicy = Field(default_factory=DedupPolicy)
    storm: StormPolicy = Field(default_factory=StormPolicy)
    grouping: GroupingPolicy = Field(default_factory=GroupingPolicy)
    correlation: CorrelationPolicy = Field(default_factory=CorrelationPolicy)
    infrastructure: InfrastructurePolicy = Field(default_factory=InfrastructurePolicy)
    node_health: NodeHealthPolicy = Field(default_factory=NodeHealthPolicy)
    node_labels: tuple[str, ...] = NODE_LABELS
    gpu_labels: tuple[str, ...] = GPU_LABELS
    routing: RoutingPolicy = Field(default_factory=RoutingPolicy)

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"unsupported policy version {value} (this gateway reads 1)")
        return value


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge recursively, everything else replaces."""
    merged: dict[str, Any] = dict(base)
    for key, value in override.items():
        # YAML reads XID keys as ints, JSON/env as strings: one key per code either way.
        key = _normal_key(key, merged)
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def _normal_key(key: Any, existing: Mapping[Any, Any]) -> Any:
    if isinstance(key, str) and key.isdigit() and int(key) in existing:
        return int(key)
    if isinstance(key, int) and str(key) in existing:
        return str(key)
    return key


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise PolicyError(f"policy file {path} must hold a mapping at the top")
    return loaded


def _validate(raw: Mapping[str, Any], where: str) -> Policy:
    try:
        return Policy.model_validate(raw)
    except ValueError as exc:
        raise PolicyError(f"{where}: {exc}") from exc


def default_policy_raw() -> dict[str, Any]:
    """The shipped policy file as a plain mapping."""
    return _read_yaml(data_file(DEFAULT_POLICY_FILE))


def load_policy(
    path: Path | None = None,
    overrides: Sequence[Mapping[str, Any]] | Mapping[str, Any] = (),
) -> Policy:
    """The shipped policy, with the file at `path` and then each override merged over it."""
    raw = default_policy_raw()
    where = str(data_file(DEFAULT_POLICY_FILE))
    if path is not None:
        raw = deep_merge(raw, _read_yaml(path))
        where = str(path)
    layers = [overrides] if isinstance(overrides, Mapping) else list(overrides)
    for layer in layers:
        raw = deep_merge(raw, layer)
        where = f"{where} + overrides"
    return _validate(raw, where)


def merge_policy(base: Policy, override: Mapping[str, Any]) -> Policy:
    """`base` with `override` merged over it (e.g. a TrainingJob's `spec.alerting.policy`)."""
    if not override:
        return base
    raw = deep_merge(base.model_dump(mode="python"), override)
    return _validate(raw, "policy override")
