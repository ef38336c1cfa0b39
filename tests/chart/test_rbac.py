"""The operator's ClusterRole grants exactly the API calls the operator makes: those its
tests record against the emulator (tests/operator/api_calls.json), and nothing more. With
`operator.namespaces` the namespaced ones move into a Role per watched namespace and the
ClusterRole keeps only Nodes (tests/operator/test_operator_rbac.py runs the operator so)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from chart.chart_helm import NAMESPACE, REPO, Manifest, find, one, rendered, template

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


NAMED = [
    {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"],
     "resourceNames": ["trainsentry"], "verbs": ["patch"]},
    {"apiGroups": ["admissionregistration.k8s.io"],
     "resources": ["mutatingwebhookconfigurations"],
     "resourceNames": ["ts-trainsentry-instrument"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"],
     "resourceNames": ["ts-trainsentry-operator-webhook-credentials"], "verbs": ["get", "patch"]},
]  # fmt: skip


def webhook_role(objs: Sequence[Any]) -> set[Grant]:
    """The Role of the webhook's credentials Secret (by name, in the release's namespace)."""
    role = one(objs, "Role", "-operator-webhook")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [NAMED[2]]
    return rule_grants(role["rules"])


# Kubernetes' cluster-scoped resources among those the operator uses.
CLUSTER_SCOPED = {"nodes", "clusterkopfpeerings", "mutatingwebhookconfigurations", "namespaces"}
# Calls the operator makes only watching every namespace: the label on namespaces holding a
# TrainingJob (with operator.namespaces the chart names them instead).
ALL_NAMESPACES_ONLY = {("patch", "", "namespaces")}
# The webhook's credentials Secret: its own Role (webhook_role), not the watched namespaces'.
CREDENTIALS_SECRET = {("get", "", "secrets")}


def granted(values: str, kind: str = "ClusterRole") -> set[Grant]:
    return rule_grants(one(rendered(values), kind, "-operator")["rules"])


def rule_grants(rules: Sequence[Any]) -> set[Grant]:
    grants = set()
    for rule in rules:
        assert "nonResourceURLs" not in rule
        if "resourceNames" in rule:
            # only objects whose name is known in advance: the peering object, the webhook's
            # configuration and its credentials Secret
            assert rule in NAMED, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    grants.add((verb, group, resource))
    return grants


CONFIGMAP_WRITES = {(verb, "", "configmaps") for verb in ("create", "patch", "delete")}


def test_cluster_role_and_dashboards_role_grant_exactly_the_recorded_calls() -> None:
    calls = recorded_calls()
    grants = granted("defaults") | granted("defaults", "Role") | webhook_role(rendered("defaults"))
    missing = sorted(calls - grants)
    extra = sorted(grants - calls)
    assert not missing, f"the operator makes calls its roles do not allow: {missing}"
    assert not extra, f"the operator's roles allow calls the operator never makes: {extra}"


def test_default_install_writes_configmaps_only_in_its_own_namespace() -> None:
    """Watching every namespace, the operator still may not write kube-system's ConfigMaps
    (issue 19, item 14): no ConfigMap grant in the ClusterRole; a Role in the namespace the
    operator keeps the jobs' dashboards in (where the chart's own dashboards go)."""
    objs = rendered("defaults")
    assert not {g for g in granted("defaults") if g[2] == "configmaps"}
    role = one(objs, "Role", "-operator")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert rule_grants(role["rules"]) == {("get", "", "configmaps")} | CONFIGMAP_WRITES
    binding = one(objs, "RoleBinding", "-operator")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == one(objs, "ClusterRoleBinding", "-operator")["subjects"]
    args = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert f"--dashboards-namespace={NAMESPACE}" in args["args"]


def test_dashboards_namespace_moves_the_operators_configmap_role(tmp_path: Path) -> None:
    objs = template("defaults", {"dashboards": {"namespace": "grafana"}}, tmp_path)
    assert one(objs, "Role", "-operator")["metadata"]["namespace"] == "grafana"
    assert one(objs, "RoleBinding", "-operator")["metadata"]["namespace"] == "grafana"
    args = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert "--dashboards-namespace=grafana" in args["args"]


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
    # No other Role/ClusterRole in the chart but the gateway's for the default cordon
    # (test_cordon_grants_exactly_the_calls_the_gateway_makes): the other components get no
    # API access. (the operator's own Role for dashboards:
    # test_default_install_writes_configmaps_...; operator.namespaces: test_namespaces_move_...)
    gateway = one(objs, "ClusterRole", "-gateway")
    assert sorted(
        (o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in ("Role", "ClusterRole")
    ) == sorted(
        [
            ("ClusterRole", role["metadata"]["name"]),
            ("ClusterRole", gateway["metadata"]["name"]),
            ("Role", role["metadata"]["name"]),
            ("Role", one(objs, "Role", "-operator-webhook")["metadata"]["name"]),
        ]
    )
    for obj in objs:
        if obj["kind"] == "Deployment" and obj is not operator:
            token = obj["metadata"]["name"].endswith("-gateway")  # the cordon's API calls
            assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is token


TRAINING_JOB_STATUS = {
    "apiGroups": ["trainsentry.io"],
    "resources": ["trainingjobs/status"],
    "verbs": ["patch"],
}
FIND_RANKS = [
    {"apiGroups": ["trainsentry.io"], "resources": ["trainingjobs"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]


LIST_NODES = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
TOPOLOGY_FROM_NODES = {
    "levels": ["leaf_switch"],
    "kubernetes": True,
    "node_labels": {"leaf_switch": "example.com/leaf"},
}


def gateway_access(objs: Sequence[Manifest]) -> tuple[list[Any] | None, bool]:
    """The gateway ClusterRole's rules (None without one) and whether its token is mounted."""
    gateway = one(objs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    roles = find(objs, "ClusterRole", "-gateway")
    if not roles:
        assert not find(objs, "ClusterRoleBinding", "-gateway")
        return None, gateway["automountServiceAccountToken"]
    binding = one(objs, "ClusterRoleBinding", "-gateway")
    assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == gateway["serviceAccountName"]
    return roles[0]["rules"], gateway["automountServiceAccountToken"]


CORDON = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    {"apiGroups": ["trainsentry.io"], "resources": ["trainingjobs"], "verbs": ["get", "list"]},
    TRAINING_JOB_STATUS,
]
CORDON_OFF = {"remediation": {"cordon": "off"}}
JOB_ALERTING_OFF = {"jobAlerting": {"enabled": False}}
DIAGNOSIS_OFF = {"diagnosis": {"enabled": False}}
# what a default install grants beyond a setting under test: none of the three
DEFAULTS_OFF = {**CORDON_OFF, **JOB_ALERTING_OFF, **DIAGNOSIS_OFF}
JOB_ALERTING = [
    {"apiGroups": ["trainsentry.io"], "resources": ["trainingjobs"], "verbs": ["get", "list"]},
    TRAINING_JOB_STATUS,
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


def test_gateway_gets_api_access_only_for_what_is_turned_on(tmp_path: Path) -> None:
    # the hang diagnosis (finding a job's ranks), job alerting and the cordon (approve mode)
    # are on by default: their grants, nothing else
    assert gateway_access(rendered("defaults")) == ([*FIND_RANKS, *JOB_ALERTING, *CORDON], True)
    assert gateway_access(rendered("everything-on")) == (
        [TRAINING_JOB_STATUS, *FIND_RANKS, *JOB_ALERTING, *CORDON],
        True,
    )
    off = template("defaults", {"gateway": DEFAULTS_OFF}, tmp_path)
    assert gateway_access(off) == (None, False)


@pytest.mark.parametrize(
    ("gateway", "rules"),
    [
        ({"trainingJobStatus": True}, [TRAINING_JOB_STATUS]),
        ({"diagnosis": {"kubernetes": True}}, FIND_RANKS),
        ({"diagnosis": {"enabled": True, "kubernetes": True}}, FIND_RANKS),
        # Diagnosis off, or on with static endpoints only: no API access. (Helm merges maps:
        # the default's kubernetes: true stays unless set to false.)
        ({"diagnosis": {"enabled": False, "kubernetes": True}}, None),
        (
            {
                "diagnosis": {
                    "kubernetes": False,
                    "static_endpoints": {"ml/llama": ["1.2.3.4:9402"]},
                }
            },
            None,
        ),
        # The topology from Node labels: list nodes, nothing else; a static one: no access.
        ({"topology": TOPOLOGY_FROM_NODES}, [LIST_NODES]),
        ({"topology": {"levels": ["rack"], "nodes": {"gpu-node-0": {"rack": "r1"}}}}, None),
    ],
)
def test_gateway_api_access_follows_its_settings(
    gateway: dict[str, Any], rules: list[Any] | None, tmp_path: Path
) -> None:
    values = {"gateway": {**DEFAULTS_OFF, **gateway}}
    objs = template("defaults", values, tmp_path)
    assert gateway_access(objs) == (rules, rules is not None)
    assert diagnosis_settings(objs) == {"kubernetes": True, **values["gateway"]["diagnosis"]}
    assert config_file(objs).get("topology", {}) == gateway.get("topology", {})
    config_settings(objs)  # the gateway loads it


def config_file(objs: Sequence[Manifest]) -> dict[str, Any]:
    """The gateway's config.yaml as the chart wrote it."""
    import yaml

    config_map = next(
        o for o in objs if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})
    )
    raw: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return raw


def config_settings(objs: Sequence[Manifest]) -> Any:
    """The gateway's settings, as it loads the chart's config.yaml."""
    from trainsentry.config import validate_settings

    return validate_settings(config_file(objs))


def diagnosis_settings(objs: Sequence[Manifest]) -> dict[str, Any] | None:
    """The diagnosis section as the chart wrote it (None when it wrote none)."""
    from trainsentry.config.diagnosis import DiagnosisSettings

    config_settings(objs)  # the gateway loads it
    section: dict[str, Any] = config_file(objs).get("diagnosis", {})
    DiagnosisSettings.model_validate(section)
    return section or None


def test_gateway_is_told_to_write_last_alert_when_allowed() -> None:
    for values, expected in (("defaults", False), ("everything-on", True)):
        settings = config_settings(rendered(values))
        assert settings.gateway.trainingjob_status is expected, values


def test_gateway_diagnosis_settings_reach_the_config_file() -> None:
    from trainsentry.config.diagnosis import DiagnosisSettings

    section = config_file(rendered("everything-on"))["diagnosis"]
    settings = DiagnosisSettings.model_validate(section)
    assert (settings.kubernetes, settings.hold_seconds) == (True, 4)
    assert settings.alertnames == ["TrainingJobHang"]


def test_ha_patches_only_its_own_peering_object() -> None:
    rules = one(rendered("ha-postgres"), "ClusterRole", "-operator")["rules"]
    patch = [r for r in rules if "clusterkopfpeerings" in r["resources"] and "patch" in r["verbs"]]
    peering = one(rendered("ha-postgres"), "ClusterKopfPeering")
    assert patch and all(r["resourceNames"] == [peering["metadata"]["name"]] for r in patch)


def test_namespaces_move_writes_into_roles_in_those_namespaces() -> None:
    objs = rendered("operator-namespaces")
    calls = recorded_calls()
    cluster = granted("operator-namespaces")
    assert (
        cluster
        == {c for c in calls - ALL_NAMESPACES_ONLY if c[2].split("/")[0] in CLUSTER_SCOPED}
        != set()
    )
    assert {resource for _, _, resource in cluster} == {"nodes", "mutatingwebhookconfigurations"}
    webhook_role(objs)
    roles = find(objs, "Role", "-operator")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        # every namespaced call, and only those, in each watched namespace
        assert rule_grants(role["rules"]) == {
            c for c in calls - ALL_NAMESPACES_ONLY - CREDENTIALS_SECRET if c not in cluster
        }
        binding = one(
            [o for o in find(objs, "RoleBinding", "-operator")
             if o["metadata"]["namespace"] == role["metadata"]["namespace"]],
            "RoleBinding",
        )  # fmt: skip
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == one(objs, "ClusterRoleBinding", "-operator")["subjects"]
    operator = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]
    args = operator["containers"][0]["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]


def test_ha_with_namespaces_is_refused(tmp_path: Path) -> None:
    from chart.chart_helm import HelmFailed

    with pytest.raises(HelmFailed, match=r"operator\.ha with operator\.namespaces"):
        template("defaults", {"operator": {"ha": True, "namespaces": ["team-a"]}}, tmp_path)


@pytest.mark.parametrize("name", ["Team-A", "team_a", "-a", "a" * 64, "*"])
def test_namespace_names_must_be_exact_dns_labels(name: str, tmp_path: Path) -> None:
    from chart.chart_helm import HelmFailed

    with pytest.raises(HelmFailed):
        template("defaults", {"operator": {"namespaces": [name]}}, tmp_path)


JOB_ALERTING_CALLS = REPO / "tests" / "gateway" / "stages" / "job_alerting_api_calls.json"


def test_job_alerting_grants_exactly_the_calls_the_gateway_makes(tmp_path: Path) -> None:
    # the calls the gateway's job alerting stage makes against the emulator
    # (tests/gateway/stages/test_job_alerting.py writes nothing; it checks the same file)
    calls = {tuple(call) for call in json.loads(JOB_ALERTING_CALLS.read_text(encoding="utf-8"))}
    secrets = {("get", "", "secrets")}
    assert secrets <= calls
    # on by default, in every namespace: everything but Secrets, cluster-wide
    everywhere = template(
        "defaults", {"gateway": {**CORDON_OFF, **DIAGNOSIS_OFF, **DIAGNOSIS_OFF}}, tmp_path
    )
    rules, token = gateway_access(everywhere)
    assert token and rules is not None and rule_grants(rules) == calls - secrets
    assert not find(everywhere, "Role", "-gateway-job-alerting")
    assert not find(everywhere, "Role", "-gateway-job-secrets")
    assert config_file(everywhere)["job_alerting"]["enabled"] is True
    # Secrets only in the namespaces an admin lists, each through a Role of its own
    values = {
        "gateway": {**CORDON_OFF, **DIAGNOSIS_OFF, "jobAlerting": {"secretNamespaces": ["team-b"]}}
    }
    allowed = template("defaults", values, tmp_path)
    assert rule_grants(gateway_access(allowed)[0] or []) == calls - secrets
    [role] = find(allowed, "Role", "-gateway-job-secrets")
    assert role["metadata"]["namespace"] == "team-b" and rule_grants(role["rules"]) == secrets
    [binding] = find(allowed, "RoleBinding", "-gateway-job-secrets")
    assert binding["metadata"]["namespace"] == "team-b"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # with namespaces: a Role in each of them (Secrets included), and no cluster-wide grant
    values = {
        "gateway": {
            **CORDON_OFF,
            **DIAGNOSIS_OFF,
            "jobAlerting": {"namespaces": ["team-a", "team-b"], "secretNamespaces": ["x"]},
        }
    }
    scoped = template("defaults", values, tmp_path)
    assert gateway_access(scoped) == (None, True)
    roles = find(scoped, "Role", "-gateway-job-alerting")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(rule_grants(role["rules"]) == calls for role in roles)
    assert not find(scoped, "Role", "-gateway-job-secrets")  # namespaces already say where
    bindings = find(scoped, "RoleBinding", "-gateway-job-alerting")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert config_file(scoped)["job_alerting"] == {
        "enabled": True,
        "namespaces": ["team-a", "team-b"],
        "refresh_seconds": 15,
        "webhook_prefixes": [
            "https://open.feishu.cn/open-apis/bot/v2/hook/",
            "https://open.larksuite.com/open-apis/bot/v2/hook/",
        ],
    }
    # off: no grant, no section
    off = template("defaults", {"gateway": DEFAULTS_OFF}, tmp_path)
    assert gateway_access(off) == (None, False)
    assert "job_alerting" not in config_file(off)
    # phonePrefixes: the numbers a job's roster may name, as the gateway reads them
    from trainsentry.config.job_alerting import JobAlertingSettings

    values = {"gateway": {**CORDON_OFF, "jobAlerting": {"phonePrefixes": ["+86", "+1555"]}}}
    section = config_file(template("defaults", values, tmp_path))["job_alerting"]
    assert JobAlertingSettings.model_validate(section).phone_prefixes == ["+86", "+1555"]


CORDON_CALLS = REPO / "tests" / "gateway" / "stages" / "cordon_api_calls.json"


def test_cordon_grants_exactly_the_calls_the_gateway_makes(tmp_path: Path) -> None:
    # the calls the cordon stage makes against the emulator (tests/gateway/stages/
    # test_cordon.py checks the same file)
    calls = {tuple(call) for call in json.loads(CORDON_CALLS.read_text(encoding="utf-8"))}
    # on by default, in approve mode; other keys merge into it (job alerting off here: its
    # grants are its own test's)
    cordon_only = template(
        "defaults", {"gateway": {**JOB_ALERTING_OFF, **DIAGNOSIS_OFF, **DIAGNOSIS_OFF}}, tmp_path
    )
    rules, token = gateway_access(cordon_only)
    assert token and rules is not None and rule_grants(rules) == calls
    evidence = {"prometheus_url": "http://prometheus-operated.monitoring.svc:9090"}
    assert config_file(rendered("defaults"))["remediation"] == {
        "cordon": "approve",
        "evidence": evidence,
    }
    # what the gateway makes of it: approve; without a section (no chart, no cluster): nothing
    from trainsentry.config import validate_settings
    from trainsentry.config.remediation import Mode

    settings = config_settings(rendered("defaults")).remediation
    assert settings is not None and settings.cordon is Mode.APPROVE
    assert validate_settings({"remediation": {}}).remediation is None
    values = {"gateway": {**JOB_ALERTING_OFF, **DIAGNOSIS_OFF, "remediation": {"threshold": 20}}}
    on = template("defaults", values, tmp_path)
    assert gateway_access(on) == gateway_access(cordon_only)
    assert config_file(on)["remediation"] == {
        "cordon": "approve",
        "evidence": evidence,
        "threshold": 20,
    }
    # cordon: off, or the section removed: no grant
    off = template("defaults", {"gateway": DEFAULTS_OFF}, tmp_path)
    assert gateway_access(off) == (None, False)
    assert config_file(off)["remediation"] == {"cordon": "off", "evidence": evidence}
    values = {"gateway": {**JOB_ALERTING_OFF, **DIAGNOSIS_OFF, "remediation": None}}
    removed = template("defaults", values, tmp_path)
    assert gateway_access(removed) == (None, False)
    assert "remediation" not in config_file(removed)
    assert config_settings(removed).remediation is None
