"""Reference renderer for per-job rule files, exactly as docs/alerts.md section 1 specifies.

The operator has its own implementation; this one lets the rule tests prove that the
contract (threshold literals, job_scope, membership series) works on promtool and on a real
Prometheus.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from trainsentry.rulesdoc import parse_thresholds, threshold_pattern

POD_MEMBERSHIP = "trainsentry:job_pod:info"
NODE_MEMBERSHIP = "trainsentry:job_node:info"


def membership_group(namespace: str, job: str, pod_regex: str) -> dict[str, Any]:
    """The two recording rules the operator publishes per TrainingJob."""
    selector = f'kube_pod_info{{namespace="{namespace}", pod=~"{pod_regex}"}}'
    return {
        "name": f"trainsentry-membership-{namespace}-{job}",
        "rules": [
            {
                "record": POD_MEMBERSHIP,
                "expr": f"max by (namespace, pod, node) ({selector})",
                "labels": {"trainingjob": job},
            },
            {
                "record": NODE_MEMBERSHIP,
                "expr": f"max by (node) ({selector})",
                "labels": {"namespace": namespace, "trainingjob": job},
            },
        ],
    }


def override_thresholds(rule: dict[str, Any], overrides: Mapping[str, str]) -> None:
    annotations = rule.get("annotations", {})
    declared = parse_thresholds(annotations.get("thresholds", ""))
    if not declared:
        return
    items = []
    for name, default in declared:
        value = overrides.get(name, default)
        if value != default:
            rule["expr"], count = threshold_pattern(default).subn(value, rule["expr"], count=1)
            assert count == 1, (rule["alert"], name)
        items.append(f"{name}={value}")
    annotations["thresholds"] = ",".join(items)


def tuned(
    rule: Mapping[str, Any], thresholds: Mapping[str, str], priorities: Mapping[str, str]
) -> bool:
    """Whether the job tunes the rule: a threshold it declares, or its priority."""
    declared = parse_thresholds(rule.get("annotations", {}).get("thresholds", ""))
    return rule["alert"] in priorities or any(name in thresholds for name, _ in declared)


def scope_rule(rule: dict[str, Any], namespace: str, job: str) -> dict[str, Any] | None:
    scope = rule.get("annotations", {}).get("job_scope")
    job_matchers = f'{{namespace="{namespace}", trainingjob="{job}"}}'
    if scope == "node":
        rule["expr"] = (
            f"({rule['expr']}) * on(node) group_left(namespace, trainingjob) "
            f"{NODE_MEMBERSHIP}{job_matchers}"
        )
    elif scope == "pod":
        token = re.compile(re.escape(POD_MEMBERSHIP) + r"(?![\w:{])")
        rule["expr"], count = token.subn(POD_MEMBERSHIP + job_matchers, rule["expr"])
        assert count == 1, rule["alert"]
    else:
        return None
    return rule


def render_for_job(
    document: Mapping[str, Any],
    namespace: str,
    job: str,
    *,
    thresholds: Mapping[str, str] | None = None,
    priorities: Mapping[str, str] | None = None,
    for_override: str | None = None,
) -> dict[str, Any]:
    """A rule file whose alerts only cover one TrainingJob: every `job_scope: pod` rule, the
    `job_scope: node` rules the job tunes (`thresholds`, `priorities`: alertname -> priority);
    cluster-scope and untuned node rules dropped (the cluster-wide files cover those)."""
    groups = []
    for group in document["groups"]:
        rules = []
        for original in group["rules"]:
            rule = copy.deepcopy(original)
            if "alert" not in rule:
                continue
            scope = rule.get("annotations", {}).get("job_scope")
            if scope == "node" and not tuned(rule, thresholds or {}, priorities or {}):
                continue
            override_thresholds(rule, thresholds or {})
            if rule["alert"] in (priorities or {}):
                rule.setdefault("labels", {})["priority"] = (priorities or {})[rule["alert"]]
            if scope_rule(rule, namespace, job) is None:
                continue
            if for_override is not None and "for" in rule:
                rule["for"] = for_override
            rules.append(rule)
        if rules:
            groups.append({"name": f"{group['name']}-{namespace}-{job}", "rules": rules})
    return {"groups": groups}
