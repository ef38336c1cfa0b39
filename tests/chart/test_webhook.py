"""The admission webhook as the chart renders it: the MutatingWebhookConfiguration (pods,
CREATE, failing open, only namespaces holding a TrainingJob), the Service and port it calls,
the operator's flags for it, and the credentials the operator keeps (the Secret rendered
empty; caBundle and path left to the operator, so every render is the same)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from chart.chart_helm import NAMESPACE, find, one, rendered, template
from trainsentry.operator.handlers import WEBHOOK_ID


def operator_args(objs: Any) -> list[str]:
    container = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    args: list[str] = container["args"]
    return args


def test_defaults_render_a_failing_open_webhook_for_pod_creation() -> None:
    objs = rendered("defaults")
    (config,) = find(objs, "MutatingWebhookConfiguration")
    (hook,) = config["webhooks"]
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 10 and hook["sideEffects"] == "NoneOnDryRun"
    assert hook["admissionReviewVersions"] == ["v1"]
    service_ref = hook["clientConfig"]["service"]
    # path and caBundle: the operator's (test_the_chart_leaves_the_credentials_to_the_operator)
    assert "path" not in service_ref and "caBundle" not in hook["clientConfig"]
    assert service_ref["namespace"] == NAMESPACE
    # the Service it names reaches the operator's webhook port
    service = one(objs, "Service", "-operator-webhook")
    assert service["metadata"]["name"] == service_ref["name"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == service_ref["port"]
    operator = one(objs, "Deployment", "-operator")
    labels = operator["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    container = operator["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--webhook-port={named[port['targetPort']]}" in container["args"]
    # Issue 43 finding 10: only namespaces the operator labels as holding a TrainingJob (it
    # was every namespace but the system ones), never the control plane's or trainsentry's.
    assert hook["namespaceSelector"]["matchLabels"] == {"trainsentry.io/trainingjobs": "true"}
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(expr["values"])
    assert "--label-namespaces" in operator_args(objs)


def test_the_operator_flags_parse_and_name_the_image_and_the_gateways_service() -> None:
    from trainsentry.operator import operator_command

    objs = rendered("defaults")
    parser = argparse.ArgumentParser()
    operator_command.add_arguments(parser)
    args = operator_args(objs)
    assert args[0] == "operator"
    parsed = parser.parse_args(args[1:])
    serving = operator_command.webhook_serving(parsed, {"TRAINSENTRY_PROBE_TOKEN": "x"})
    assert serving is not None
    image = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
    assert serving.settings.image == image["image"]
    gateway = one(objs, "Service", "-gateway")
    ports = {p["name"]: p["port"] for p in gateway["spec"]["ports"]}
    url = f"http://{gateway['metadata']['name']}.{NAMESPACE}.svc:{ports['triggers']}"
    assert serving.settings.gateway_url == url
    assert url.endswith(":9096")  # the Service's trigger port, not the operator's health port
    # The operator keeps the credentials in the chart's Secret, the configuration's caBundle
    # and path, and serves the files from a memory-backed folder it writes.
    credentials = serving.credentials
    assert credentials is not None
    secret = one(objs, "Secret", "-operator-webhook-credentials")
    assert (credentials.namespace, credentials.secret) == (NAMESPACE, secret["metadata"]["name"])
    (config,) = find(objs, "MutatingWebhookConfiguration")
    assert credentials.configuration == config["metadata"]["name"]
    assert credentials.webhook == config["webhooks"][0]["name"]
    assert credentials.webhook_id == WEBHOOK_ID
    service = config["webhooks"][0]["clientConfig"]["service"]
    # the name the API server checks: <service>.<namespace>.svc
    assert credentials.names[0] == f"{service['name']}.{service['namespace']}.svc"
    assert credentials.days == 365
    mount = next(m for m in image["volumeMounts"] if m["name"] == "webhook")
    assert str(credentials.folder) == mount["mountPath"]
    volumes = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "webhook")["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e for e in image["env"]}
    assert env["TRAINSENTRY_PROBE_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "probe-token"


def test_the_chart_leaves_the_credentials_to_the_operator(tmp_path: Path) -> None:
    """Issue 43 finding 10: the chart made a CA and a certificate with genCA at every
    render (a `helm template` per GitOps sync: a diff each time, a caBundle/certificate
    mismatch window), valid 10 years, never renewed. Now two renders are the same bytes:
    the Secret is rendered empty (the operator fills it), the configuration without
    caBundle and path (the operator keeps them; Helm's three-way merge leaves fields the
    chart never sets alone)."""
    first = template("defaults", {}, tmp_path)
    second = template("defaults", {}, tmp_path)
    webhook_objects = [
        o for o in first
        if o["kind"] == "MutatingWebhookConfiguration" or "-operator-webhook" in o["metadata"][
            "name"]
    ]  # fmt: skip
    assert len(webhook_objects) >= 3
    assert webhook_objects == [o for o in second if o in webhook_objects]
    secret = one(first, "Secret", "-operator-webhook-credentials")
    assert secret["type"] == "Opaque" and "data" not in secret and "stringData" not in secret
    assert not find(first, "Secret", "-operator-webhook-tls")


def test_with_operator_namespaces_only_those_namespaces_are_seen() -> None:
    objs = rendered("operator-namespaces")  # operator.namespaces: [team-a, team-b]
    (config,) = find(objs, "MutatingWebhookConfiguration")
    (expr,) = config["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert expr == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["team-a", "team-b"],
    }


@pytest.mark.parametrize(
    "values",
    [{"operator": {"webhook": {"enabled": False}}}, {"operator": {"enabled": False}}],
    ids=["webhook off", "operator off"],
)
def test_without_the_webhook_nothing_of_it_is_rendered(
    values: dict[str, Any], tmp_path: Path
) -> None:
    objs = template("defaults", values, tmp_path)
    assert not find(objs, "MutatingWebhookConfiguration")
    assert not find(objs, "Service", "-operator-webhook")
    assert not find(objs, "Secret", "-operator-webhook-credentials")
    if find(objs, "Deployment", "-operator"):
        assert not [a for a in operator_args(objs) if a.startswith("--webhook")]


def test_a_client_ca_makes_the_operator_require_the_api_servers_certificate(
    tmp_path: Path,
) -> None:
    from trainsentry.operator import operator_command

    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    objs = template("defaults", {"operator": {"webhook": {"clientCA": pem}}}, tmp_path)
    config_map = one(objs, "ConfigMap", "-operator-webhook-client-ca")
    assert config_map["data"]["ca.crt"] == pem
    parser = argparse.ArgumentParser()
    operator_command.add_arguments(parser)
    parsed = parser.parse_args(operator_args(objs)[1:])
    serving = operator_command.webhook_serving(parsed, {"TRAINSENTRY_PROBE_TOKEN": "x"})
    assert serving is not None and serving.client_ca is not None
    operator = one(objs, "Deployment", "-operator")["spec"]["template"]["spec"]
    mount = next(m for m in operator["containers"][0]["volumeMounts"]
                 if m["name"] == "webhook-client-ca")  # fmt: skip
    assert serving.client_ca == f"{mount['mountPath']}/ca.crt"
    volume = next(v for v in operator["volumes"] if v["name"] == "webhook-client-ca")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    # Without it: no ConfigMap, no flag.
    assert not find(rendered("defaults"), "ConfigMap", "-operator-webhook-client-ca")
    assert not [a for a in operator_args(rendered("defaults")) if "client-ca" in a]
