"""TrainingJob → child manifests. Pure: no I/O, no clock, same input → same output.

Children (all namespaced next to the TrainingJob and owned by it):
- PrometheusRule `<job>-trainsentry`: two membership recording rules naming the job's pods and
  nodes, plus the alerting rules of `rules/*.yaml` scoped to this job and with its thresholds
  (contract: docs/alerts.md, section 1): every `job_scope: pod` rule, and of the
  `job_scope: node` (hardware) rules only those the job tunes (`tunes`); an untuned node rule
  is left to the chart's cluster-wide copy, which fires for the job's nodes as for any;
- PodMonitor `<job>-trainsentry-probe`: scrapes the probe port of the job's pods;
- ConfigMap `<job>-trainsentry-dashboards` (label `grafana_dashboard: "1"`): the dashboards of
  `dashboards/*.json` that have a job variable (`trainingjob` or `job`), pinned to this job.
  Given a dashboards namespace (the chart's default install: the operator's own), it lives
  there instead, as `<job namespace>.<job>-trainsentry-dashboards`, labelled with the job's
  namespace and without an owner reference (owners must share the namespace); the operator
  deletes it with the job (`dashboards_ref` names it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainsentry import rulesdoc
from trainsentry.operator.spec import (
    JOB_LABEL,
    JOB_NAMESPACE_LABEL,
    MANAGED_BY,
    OWNED_LABELS_ANNOTATION,
    JobIdentity,
    TrainingJobSpec,
)

JOB_POD_SERIES = "trainsentry:job_pod:info"
JOB_NODE_SERIES = "trainsentry:job_node:info"
JOB_VARIABLES = ("trainingjob", "job")  # dashboard variables that name the TrainingJob
HANG_NAME = re.compile(r"hang|hung|stuck|stall", re.IGNORECASE)


@dataclass(frozen=True)
class RuleFile:
    """One parsed Prometheus rule file (`groups:` format)."""

    name: str
    groups: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class DashboardFile:
    name: str  # file stem
    dashboard: Mapping[str, Any]


@dataclass(frozen=True)
class Rendered:
    manifests: list[dict[str, Any]]
    alert_count: int
    unknown_thresholds: list[str] = field(default_factory=list)
    # alerting rules that cannot be rendered per job (`job_scope: cluster`, no scope, a pod
    # rule without its membership token): the chart's cluster-wide copy is all there is
    skipped_rules: list[str] = field(default_factory=list)
    # `job_scope: node` rules the job does not tune: not copied, by design (docs/alerts.md
    # "Job scope"); the cluster-wide rule alerts for the job's nodes, so nothing is missed
    cluster_wide_rules: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RuleGroups:
    """The alerting part of a job's PrometheusRule (`render_rule_groups`)."""

    groups: list[dict[str, Any]]
    alerts: int  # alerting rules rendered
    skipped: list[str]  # Rendered.skipped_rules
    cluster_wide: list[str]  # Rendered.cluster_wide_rules


def child_names(job_name: str) -> dict[str, str]:
    return {
        "PrometheusRule": f"{job_name}-trainsentry",
        "PodMonitor": f"{job_name}-trainsentry-probe",
        "ConfigMap": f"{job_name}-trainsentry-dashboards",
    }


# --- thresholds ----------------------------------------------------------------------------


def known_thresholds(rule_files: Iterable[RuleFile]) -> dict[str, str]:
    """Every tunable threshold of the rule files: name → default as written."""
    result: dict[str, str] = {}
    for rule in _all_rules(rule_files):
        thresholds = str(rule.get("annotations", {}).get("thresholds", ""))
        result.update(rulesdoc.parse_thresholds(thresholds, strict=False))
    return result


def format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _literal(default: str) -> re.Pattern[str]:
    return re.compile(r'(?<![\w."])' + re.escape(default) + r'(?![\w."])')


def apply_thresholds(rule: Mapping[str, Any], overrides: Mapping[str, float]) -> dict[str, Any]:
    """The rule with each overridden threshold literal replaced in `expr` and the annotation."""
    # Rules hold scalars plus the labels/annotations maps: copying those is enough (and much
    # cheaper than a deep copy, which mattered at 500 jobs x 70 rules).
    result = dict(rule)
    for section in ("labels", "annotations"):
        if section in rule:
            result[section] = dict(rule[section] or {})
    annotations = result.get("annotations") or {}
    declared = dict(rulesdoc.parse_thresholds(str(annotations.get("thresholds", "")), strict=False))
    wanted = {name: default for name, default in declared.items() if name in overrides}
    if not wanted:
        return result
    expr = str(result["expr"])
    # Find every slot in the original expr first: replacing one by one would let a new value
    # be taken for a later default (0.25 -> 0.2, then the 0.2 slot finds that one first).
    slots: list[tuple[int, int, str]] = []
    seen: dict[str, int] = {}  # thresholds sharing a default take its literals in order
    for name, default in declared.items():
        index = seen[default] = seen.get(default, -1) + 1
        if name not in wanted:
            continue
        found = list(_literal(default).finditer(expr))
        if index >= len(found):
            raise ValueError(f"rule {rule.get('alert')}: threshold {name}={default} not in expr")
        slots.append((found[index].start(), found[index].end(), format_number(overrides[name])))
    for start, end, value in sorted(slots, reverse=True):
        expr = expr[:start] + value + expr[end:]
    result["expr"] = expr
    annotations["thresholds"] = ", ".join(
        f"{name}={format_number(overrides[name]) if name in overrides else default}"
        for name, default in declared.items()
    )
    result["annotations"] = annotations
    return result


# --- job scope ------------------------------------------------------------------------------


def _promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


# The training operator names a PyTorchJob's pods `<job>-<replica type>-<index>`, replica
# types Master and Worker. Volcano's `<job>-<task>-<index>` has free task names (`a` with task
# `b-c` and `a-b` with task `c` both give `a-b-c-0`), so those jobs list the pods seen.
WORKLOAD_POD_NAMES = {"PyTorchJob": "-(master|worker)-[0-9]+"}


def uses_pod_names(spec: TrainingJobSpec) -> bool:
    """Whether the membership regex lists the pods seen (so it changes with the pods)."""
    return spec.workloadRef is None or spec.workloadRef.kind not in WORKLOAD_POD_NAMES


def pod_name_regex(spec: TrainingJobSpec, pod_names: Iterable[str]) -> str:
    """A regex matching exactly the job's pod names (Prometheus anchors it)."""
    workload = spec.workloadRef
    if workload is not None and workload.kind in WORKLOAD_POD_NAMES:
        return re.escape(workload.name) + WORKLOAD_POD_NAMES[workload.kind]
    return "|".join(re.escape(name) for name in sorted(set(pod_names)))


def membership_rules(job: JobIdentity, pod_regex: str) -> list[dict[str, Any]]:
    selector = (
        f'kube_pod_info{{namespace="{_promql_string(job.namespace)}", '
        f'pod=~"{_promql_string(pod_regex)}"}}'
    )
    return [
        {
            "record": JOB_POD_SERIES,
            "expr": f"max by (namespace, pod, node) ({selector})",
            "labels": {"trainingjob": job.name},
        },
        {
            "record": JOB_NODE_SERIES,
            "expr": f"max by (node) ({selector})",
            "labels": {"namespace": job.namespace, "trainingjob": job.name},
        },
    ]


def _job_matcher(job: JobIdentity) -> str:
    return (
        f'{{namespace="{_promql_string(job.namespace)}", trainingjob="{_promql_string(job.name)}"}}'
    )


def scope_expr(expr: str, scope: str, job: JobIdentity) -> str | None:
    """The expr limited to the job, or None when the rule is not rendered per job."""
    if scope == "node":
        return (
            f"({expr.strip()}) * on(node) group_left(namespace, trainingjob) "
            f"{JOB_NODE_SERIES}{_job_matcher(job)}"
        )
    if scope == "pod":
        token = re.compile(re.escape(JOB_POD_SERIES) + r"(?![\w:{])")
        scoped, count = token.subn(lambda _: JOB_POD_SERIES + _job_matcher(job), expr, count=1)
        return scoped if count == 1 else None
    return None


def tunes(rule: Mapping[str, Any], spec: TrainingJobSpec) -> bool:
    """Pure: whether the job tunes the rule: one of its `spec.thresholds` is a threshold the
    rule declares, or its `spec.alerting.priorityOverrides` names the rule. Only then does a
    job's copy of a `job_scope: node` rule differ from the cluster-wide alert."""
    if str(rule.get("alert", "")) in spec.alerting.priorityOverrides:
        return True
    declared = str((rule.get("annotations") or {}).get("thresholds", ""))
    return any(
        name in spec.thresholds for name, _ in rulesdoc.parse_thresholds(declared, strict=False)
    )


def _all_rules(rule_files: Iterable[RuleFile]) -> Iterable[Mapping[str, Any]]:
    for rule_file in rule_files:
        for group in rule_file.groups:
            yield from group.get("rules") or []


def hang_alert_names(rule_files: Iterable[RuleFile]) -> frozenset[str]:
    """Alerts that mean "the job is hung" (component training, name says hang/stuck/stall)."""
    return frozenset(
        str(rule["alert"])
        for rule in _all_rules(rule_files)
        if "alert" in rule
        and (rule.get("labels") or {}).get("component") == "training"
        and HANG_NAME.search(str(rule["alert"]))
    )


def _dns_safe(value: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")


def render_rule_groups(
    job: JobIdentity,
    spec: TrainingJobSpec,
    rule_files: Sequence[RuleFile],
    pod_regex: str,
) -> RuleGroups:
    """Pure: the groups of the job's PrometheusRule: the membership group, then per shipped
    group its rules scoped to the job (renamed `<group>-<namespace>-<job>`, left out when
    none is rendered).

    Invariant: a `job_scope: node` rule is copied only when the job tunes it (`tunes`). An
    untuned copy would be the cluster-wide alert again with the job's labels, a tenant's
    alert racing the trusted one to the gateway (two incidents, two pages: docs/alerts.md
    "Job scope"); the jobs a hardware alert hits are named by their own alerts instead."""
    suffix = f"{job.namespace}-{job.name}"
    groups: list[dict[str, Any]] = [
        {"name": f"trainsentry-membership-{suffix}", "rules": membership_rules(job, pod_regex)}
    ]
    alerts, skipped, cluster_wide = 0, [], []
    for rule_file in rule_files:
        for group in rule_file.groups:
            rendered: list[dict[str, Any]] = []
            for rule in group.get("rules") or []:
                if "alert" not in rule:
                    continue  # recording rules are installed once, cluster-wide, by the chart
                scope = str((rule.get("annotations") or {}).get("job_scope", ""))
                if scope == "node" and not tunes(rule, spec):
                    cluster_wide.append(str(rule["alert"]))
                    continue
                tuned = apply_thresholds(rule, spec.thresholds)
                expr = scope_expr(str(tuned["expr"]), scope, job)
                if expr is None:
                    skipped.append(str(rule["alert"]))
                    continue
                tuned["expr"] = expr
                labels = dict(tuned.get("labels") or {})
                labels["trainingjob"] = job.name
                override = spec.alerting.priorityOverrides.get(str(rule["alert"]))
                if override is not None:
                    labels["priority"] = override
                tuned["labels"] = labels
                rendered.append(tuned)
            if rendered:
                groups.append(
                    {**_group_fields(group), "name": f"{group['name']}-{suffix}", "rules": rendered}
                )
                alerts += len(rendered)
    return RuleGroups(groups, alerts, skipped, cluster_wide)


def _group_fields(group: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: copy.deepcopy(value)
        for key, value in group.items()
        if key in ("interval", "limit", "labels")
    }


# --- manifests ------------------------------------------------------------------------------


def _metadata(job: JobIdentity, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    all_labels = {**labels, **MANAGED_BY, JOB_LABEL: job.name}
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": all_labels,
        "annotations": {OWNED_LABELS_ANNOTATION: ",".join(sorted(all_labels))},
        "ownerReferences": [job.owner_reference()],
    }


def render_prometheus_rule(
    job: JobIdentity, spec: TrainingJobSpec, rule_files: Sequence[RuleFile], pod_regex: str
) -> tuple[dict[str, Any], RuleGroups]:
    rules = render_rule_groups(job, spec, rule_files, pod_regex)
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _metadata(
            job, child_names(job.name)["PrometheusRule"], spec.prometheus.ruleLabels
        ),
        "spec": {"groups": rules.groups},
    }
    return manifest, rules


def probe_endpoint(job: JobIdentity, spec: TrainingJobSpec, port: int) -> dict[str, Any]:
    """One scrape endpoint: each rank's probe listens on the base port + its LOCAL_RANK.

    The probe's ports need not be declared in the pod spec (a PyTorchJob's usually are not),
    so the endpoint names no `port`/`portNumber`: prometheus-operator turns those into a keep
    on the declared container ports, which would drop an undeclared probe. Instead every
    target kubernetes_sd finds for a pod (one per declared port of each container and init
    container, one per container declaring none) is pointed at `<pod IP>:<port>`, and the
    `container` label prometheus-operator adds is dropped: all of a pod's targets then have
    equal label sets, and Prometheus keeps one scrape per equal set. Net: one target per pod
    and rank, declared or not.
    """
    return {
        "path": spec.probe.path,
        "interval": spec.probe.interval,
        "relabelings": [
            {
                "sourceLabels": ["__meta_kubernetes_pod_ip"],
                "regex": "(.+)",
                "targetLabel": "__address__",
                "replacement": f"${{1}}:{port}",
                "action": "replace",
            },
            {  # an IPv6 pod IP goes in brackets, as kubernetes_sd joins host and port
                "sourceLabels": ["__meta_kubernetes_pod_ip"],
                "regex": "(.*:.*)",
                "targetLabel": "__address__",
                "replacement": f"[${{1}}]:{port}",
                "action": "replace",
            },
            {"regex": "container", "action": "labeldrop"},
            {
                "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                "targetLabel": "node",
                "action": "replace",
            },
            {"targetLabel": "trainingjob", "replacement": job.name, "action": "replace"},
        ],
    }


def render_pod_monitor(job: JobIdentity, spec: TrainingJobSpec) -> dict[str, Any]:
    labels = spec.prometheus.monitorLabels
    if labels is None:
        labels = spec.prometheus.ruleLabels
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _metadata(job, child_names(job.name)["PodMonitor"], labels),
        "spec": {
            "selector": spec.pod_selector().as_dict(),
            "namespaceSelector": {"matchNames": [job.namespace]},
            "podMetricsEndpoints": [
                probe_endpoint(job, spec, spec.probe.port + local_rank)
                for local_rank in range(spec.ranksPerPod)
            ],
        },
    }


def is_job_dashboard(dashboard: Mapping[str, Any]) -> bool:
    """Per-job copies only make sense for dashboards with a job variable."""
    variables = (dashboard.get("templating") or {}).get("list") or []
    return any(str(variable.get("name")) in JOB_VARIABLES for variable in variables)


def pin_dashboard(dashboard: Mapping[str, Any], job: JobIdentity, stem: str) -> dict[str, Any]:
    """A copy of the dashboard with its own uid and title, variables set to this job."""
    pinned = dict(dashboard)  # only the top level and the variables change
    pinned["templating"] = copy.deepcopy(dashboard.get("templating") or {})
    digest = hashlib.sha256(f"{job.namespace}/{job.name}/{stem}".encode()).hexdigest()[:16]
    pinned["uid"] = f"ts-{digest}"
    pinned["title"] = f"{pinned.get('title', stem)} · {job.key}"
    pinned.pop("id", None)
    values = {"namespace": job.namespace, **dict.fromkeys(JOB_VARIABLES, job.name)}
    for variable in (pinned.get("templating") or {}).get("list") or []:
        value = values.get(str(variable.get("name")))
        if value is None:
            continue
        variable["current"] = {"selected": True, "text": value, "value": value}
        if variable.get("type") in ("custom", "textbox", "constant"):
            variable["query"] = value
            variable["options"] = [{"selected": True, "text": value, "value": value}]
    return pinned


def dashboards_ref(job: JobIdentity, namespace: str | None = None) -> tuple[str, str]:
    """(namespace, name) of the job's dashboard ConfigMap: next to the job, or in
    `namespace` (named after the job's namespace too: a namespace name has no dot, so two
    jobs never share one name there)."""
    name = child_names(job.name)["ConfigMap"]
    if namespace is None or namespace == job.namespace:
        return job.namespace, name
    return namespace, f"{job.namespace}.{name}"


def render_dashboards(
    job: JobIdentity, dashboards: Sequence[DashboardFile], namespace: str | None = None
) -> dict[str, Any]:
    """The dashboard ConfigMap, one key per dashboard file (in `namespace`: dashboards_ref)."""
    where, name = dashboards_ref(job, namespace)
    labels = {"grafana_dashboard": "1"}
    if where != job.namespace:
        labels[JOB_NAMESPACE_LABEL] = job.namespace
    metadata = _metadata(job, name, labels)
    if where != job.namespace:
        metadata["namespace"] = where
        del metadata["ownerReferences"]  # not across namespaces: deleted by the operator
    data = {
        f"{_dns_safe(item.name)}-{_dns_safe(job.namespace)}-{_dns_safe(job.name)}.json": json.dumps(
            pin_dashboard(item.dashboard, job, item.name), indent=1, sort_keys=True
        )
        for item in dashboards
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def render_children(
    job: JobIdentity,
    spec: TrainingJobSpec,
    rule_files: Sequence[RuleFile],
    dashboards: Sequence[DashboardFile],
    pod_names: Iterable[str],
    dashboards_namespace: str | None = None,
) -> Rendered:
    """All children of one TrainingJob (its dashboards in `dashboards_namespace` if given)."""
    known = known_thresholds(rule_files)
    unknown = sorted(name for name in spec.thresholds if name not in known)
    rule, rules = render_prometheus_rule(job, spec, rule_files, pod_name_regex(spec, pod_names))
    manifests = [rule, render_pod_monitor(job, spec)]
    job_dashboards = [item for item in dashboards if is_job_dashboard(item.dashboard)]
    if spec.dashboard.enabled and job_dashboards:
        manifests.append(render_dashboards(job, job_dashboards, dashboards_namespace))
    return Rendered(manifests, rules.alerts, unknown, rules.skipped, rules.cluster_wide)
