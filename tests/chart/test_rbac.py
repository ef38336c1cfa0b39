"""The operator's ClusterRole grants exactly the API calls the operator makes: those its
tests record against the emulator (tests/operator/api_calls.json), and nothing more."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chart.chart_helm import REPO, find, one, rendered

API_CALLS = REPO / "tests" / "operator" / "api_calls.json"
# What kopf peering adds with operator.ha=true (kopf lists, watches and patches the
# ClusterKopfPeering object; the peering CRD has no status subresource).
PEERING = {(verb, "kopf.dev", "clusterkopfpeerings") for verb in ("list", "watch", "patch")}

Grant = tuple[str, str, str]  # verb, API group, resource[/subresource]


def recorded_calls() -> set[Grant]:
    if not API_CALLS.is_file():
        pytest.fail(
            f"{API_CALLS.relative_to(REPO)} is missing: the operator's tests write the list of "
            "API calls the operator makes there, and the ClusterRole is checked against it"
        )
    data: Any = json.loads(API_CALLS.read_text(encoding="utf-8"))
    calls = data["calls"] if isinstance(data, dict) else data
    grants = set()
    for call in calls:
        resource = call["resource"]
        if call.get("subresource"):
            resource += "/" + call["subresource"]
        grants.add((call["verb"], call["group"], resource))
    return grants


def granted(values: str) -> set[Grant]:
    role = one(rendered(values), "ClusterRole", "-operator")
    grants = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    grants.add((verb, group, resource))
    return grants


def test_cluster_role_grants_exactly_the_recorded_calls() -> None:
    calls, grants = recorded_calls(), granted("defaults")
    missing = sorted(calls - grants)
    extra = sorted(grants - calls)
    assert not missing, f"the operator makes calls the ClusterRole does not allow: {missing}"
    assert not extra, f"the ClusterRole allows calls the operator never makes: {extra}"


def test_ha_adds_only_kopf_peering() -> None:
    assert granted("ha-postgres") - granted("defaults") == PEERING
    assert granted("defaults") <= granted("ha-postgres")


def test_cluster_role_is_bound_to_the_operator_only() -> None:
    objs = rendered("defaults")
    binding = one(objs, "ClusterRoleBinding", "-operator")
    role = one(objs, "ClusterRole", "-operator")
    operator = one(objs, "Deployment", "-operator")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = operator["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": operator["metadata"]["namespace"]}
    ]
    # No other Role/ClusterRole in the chart: the other components get no API access.
    assert [o["kind"] for o in objs if o["kind"] in ("Role", "ClusterRole")] == ["ClusterRole"]
    for obj in objs:
        if obj["kind"] == "Deployment" and obj is not operator:
            assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_gateway_may_only_patch_training_job_status_and_only_when_asked() -> None:
    assert not find(rendered("defaults"), "ClusterRole", "-gateway")
    objs = rendered("everything-on")
    role = one(objs, "ClusterRole", "-gateway")
    assert role["rules"] == [
        {"apiGroups": ["trainsentry.io"], "resources": ["trainingjobs/status"], "verbs": ["patch"]}
    ]
    binding = one(objs, "ClusterRoleBinding", "-gateway")
    gateway = one(objs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == gateway["serviceAccountName"]
    assert gateway["automountServiceAccountToken"] is True


def test_gateway_is_told_to_write_last_alert_when_allowed() -> None:
    import yaml

    from trainsentry.config import Settings

    for values, expected in (("defaults", False), ("everything-on", True)):
        config_map = next(
            o
            for o in rendered(values)
            if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})
        )
        settings = Settings.model_validate(yaml.safe_load(config_map["data"]["config.yaml"]))
        assert settings.gateway.trainingjob_status is expected, values
