"""The TrainingJob resource: names, labels and the typed spec (defaults mirror the CRD).

The API server applies the CRD's defaults, but the operator must not depend on that (older
objects, emulators, hand-written bodies), so the same defaults live here and a test checks
that both agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from trainsentry.kube.names import subdomain_problems

GROUP = "trainsentry.io"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
KIND = "TrainingJob"
API_VERSION = f"{GROUP}/{VERSION}"

MANAGED_BY = {"app.kubernetes.io/managed-by": "trainsentry-operator"}
JOB_LABEL = "trainsentry.io/trainingjob"
# On a child kept outside the job's namespace (the dashboards, see render.dashboards_ref).
JOB_NAMESPACE_LABEL = "trainsentry.io/trainingjob-namespace"
# On each child: the label keys the operator set, so keys dropped from the spec are removed
# (labels are otherwise merged: other tools' labels stay).
OWNED_LABELS_ANNOTATION = "trainsentry.io/owned-labels"
MAX_NAME_LENGTH = 63  # the job's name is the JOB_LABEL value on its children (CRD: maxLength)
MONITOR_ANNOTATION = "trainsentry.io/monitor"  # opt-in discovery on PyTorchJob / Volcano Job

DEFAULT_PROBE_PORT = 9401  # the probe: base port, a rank listens on base + LOCAL_RANK
DEFAULT_PROBE_PATH = "/metrics"

# How a workload's pods are labelled, by workload kind.
WORKLOAD_POD_LABEL = {
    "PyTorchJob": "training.kubeflow.org/job-name",
    "Job": "volcano.sh/job-name",  # Volcano's batch.volcano.sh Job
}
WORKLOAD_API_VERSION = {"PyTorchJob": "kubeflow.org/v1", "Job": "batch.volcano.sh/v1alpha1"}

PriorityName = Literal["P0", "P1", "P2", "P3"]

# The error type of a reference whose name is no Kubernetes object name (the CRD's pattern
# refuses those; an object stored before it had one may still carry such a name).
INVALID_OBJECT_NAME = "invalid_object_name"


def _object_name(value: str) -> str:
    """Pure: `value` when it is a DNS-1123 subdomain, the name of a Secret, a ConfigMap or a
    workload; else a validation error of type INVALID_OBJECT_NAME saying why."""
    if problems := subdomain_problems(value):
        raise PydanticCustomError(
            INVALID_OBJECT_NAME,
            "{value} is not a valid Kubernetes object name: {problems}",
            {"value": repr(value[:80]), "problems": "; ".join(problems)},
        )
    return value


# The name of an object a TrainingJob refers to, always in the job's own namespace.
ObjectName = Annotated[str, AfterValidator(_object_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class SelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)


class LabelSelector(_Model):
    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[SelectorRequirement] = Field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if self.matchLabels:
            result["matchLabels"] = dict(self.matchLabels)
        if self.matchExpressions:
            result["matchExpressions"] = [
                req.model_dump(exclude_defaults=req.operator in ("Exists", "DoesNotExist"))
                for req in self.matchExpressions
            ]
        return result

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Pure: whether an object with `labels` is selected, as the API server decides it
        (Kubernetes "Labels and Selectors"): every matchLabels pair and every expression
        hold; `In` needs the key with one of the values, `NotIn` holds for an absent key
        too, `Exists` / `DoesNotExist` look at the key only. An empty selector selects all."""
        if any(labels.get(key) != value for key, value in self.matchLabels.items()):
            return False
        for req in self.matchExpressions:
            present = req.key in labels
            if req.operator == "In" and not (present and labels[req.key] in req.values):
                return False
            if req.operator == "NotIn" and present and labels[req.key] in req.values:
                return False
            if req.operator == "Exists" and not present:
                return False
            if req.operator == "DoesNotExist" and present:
                return False
        return True

    def as_string(self) -> str:
        """The selector in the `?labelSelector=` syntax."""
        terms = [f"{key}={value}" for key, value in sorted(self.matchLabels.items())]
        for req in self.matchExpressions:
            if req.operator == "Exists":
                terms.append(req.key)
            elif req.operator == "DoesNotExist":
                terms.append(f"!{req.key}")
            else:
                op = "in" if req.operator == "In" else "notin"
                terms.append(f"{req.key} {op} ({','.join(req.values)})")
        return ",".join(terms)


class WorkloadRef(_Model):
    kind: Literal["PyTorchJob", "Job"]
    name: ObjectName
    apiVersion: str | None = None


class Parallelism(_Model):
    tensor: int = Field(default=1, ge=1)
    pipeline: int = Field(default=1, ge=1)
    data: int = Field(default=1, ge=1)


class Probe(_Model):
    port: int = Field(default=DEFAULT_PROBE_PORT, ge=1, le=65535)
    path: str = DEFAULT_PROBE_PATH
    interval: str = "15s"


class Exporters(_Model):
    dcgm: bool = True
    infiniband: bool = True
    node: bool = True

    def enabled(self) -> list[str]:
        return [name for name in ("dcgm", "infiniband", "node") if getattr(self, name)]


class SecretKeyRef(_Model):
    name: ObjectName
    key: str


class WebhookSecretRef(SecretKeyRef):
    """`key`: the custom bot's webhook URL; `secretKey`: its signing secret (optional)."""

    secretKey: str | None = None


class Feishu(_Model):
    chatId: str | None = None
    webhookSecretRef: WebhookSecretRef | None = None


class Alerting(_Model):
    owners: list[str] = Field(default_factory=list)
    feishu: Feishu | None = None
    onCallRosterRef: SecretKeyRef | None = None  # a ConfigMap key holding the roster
    priorityOverrides: dict[str, PriorityName] = Field(default_factory=dict)


class PrometheusOptions(_Model):
    ruleLabels: dict[str, str] = Field(default_factory=dict)
    monitorLabels: dict[str, str] | None = None  # default: ruleLabels


class Dashboard(_Model):
    enabled: bool = True


class TrainingJobSpec(_Model):
    selector: LabelSelector | None = None
    workloadRef: WorkloadRef | None = None
    worldSize: int | None = Field(default=None, ge=1)
    ranksPerPod: int = Field(default=1, ge=1)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    probe: Probe = Field(default_factory=Probe)
    exporters: Exporters = Field(default_factory=Exporters)
    thresholds: dict[str, float] = Field(default_factory=dict)
    # Read by the gateway's hang diagnosis: a checkpoint is paged once its peers have waited
    # this long (unset: the gateway's diagnosis.checkpoint_limit_seconds, 30 min).
    checkpointLimitSeconds: int | None = Field(default=None, ge=60, le=7 * 86400)
    alerting: Alerting = Field(default_factory=Alerting)
    prometheus: PrometheusOptions = Field(default_factory=PrometheusOptions)
    dashboard: Dashboard = Field(default_factory=Dashboard)
    # The operator's admission webhook gives the job's pods the probe (docs/operator.md,
    # "Instrumenting the job's pods"); false: its pods are left as they are.
    instrument: bool = True

    @model_validator(mode="after")
    def _one_way_to_find_pods(self) -> TrainingJobSpec:
        if (self.selector is None) == (self.workloadRef is None):
            raise ValueError("set exactly one of spec.selector and spec.workloadRef")
        if self.probe.port + self.ranksPerPod - 1 > 65535:
            raise ValueError("probe.port + ranksPerPod - 1 must be a port (<= 65535)")
        return self

    def pod_selector(self) -> LabelSelector:
        """The selector of the job's pods, given or derived from the workload."""
        if self.selector is not None:
            return self.selector
        assert self.workloadRef is not None
        label = WORKLOAD_POD_LABEL[self.workloadRef.kind]
        return LabelSelector(matchLabels={label: self.workloadRef.name})


class JobIdentity(_Model):
    """What render needs to know about the TrainingJob object itself."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Any) -> JobIdentity:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
