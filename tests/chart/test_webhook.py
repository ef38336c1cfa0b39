"""The admission webhook as the chart renders it: the MutatingWebhookConfiguration (pods,
CREATE, failing open), the Service and port it calls, the operator's flags for it, and the
generated certificate (a CA in caBundle that signs a certificate for the Service's name)."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

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
    assert service_ref["path"] == f"/{WEBHOOK_ID}" and service_ref["namespace"] == NAMESPACE
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
    # never the control plane's or trainsentry's own pods
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(expr["values"])


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
    url = f"http://{gateway['metadata']['name']}.{NAMESPACE}.svc:{gateway['spec']['ports'][0]['port']}"
    assert serving.settings.gateway_url == url
    assert url.endswith(":9095")  # the gateway Service's port, not the operator's health port
    mounts = image["volumeMounts"]
    tls = next(m for m in mounts if m["name"] == "webhook-tls")
    assert serving.certfile == f"{tls['mountPath']}/tls.crt"
    env = {e["name"]: e for e in image["env"]}
    assert env["TRAINSENTRY_PROBE_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "probe-token"


def _verify(issuer: x509.Certificate, cert: x509.Certificate) -> None:
    key = issuer.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(),
                   cert.signature_hash_algorithm)  # fmt: skip
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey)
        key.verify(cert.signature, cert.tbs_certificate_bytes,
                   ec.ECDSA(cert.signature_hash_algorithm))  # fmt: skip


def test_the_generated_certificate_is_for_the_service_and_signed_by_the_ca_bundle() -> None:
    objs = rendered("defaults")
    (config,) = find(objs, "MutatingWebhookConfiguration")
    service = config["webhooks"][0]["clientConfig"]["service"]
    secret = one(objs, "Secret", "-operator-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(config["webhooks"][0]["clientConfig"][
        "caBundle"]))  # fmt: skip
    assert secret["data"]["ca.crt"] == config["webhooks"][0]["clientConfig"]["caBundle"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    _verify(ca, cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # the name the API server checks: <service>.<namespace>.svc
    assert f"{service['name']}.{service['namespace']}.svc" in names.get_values_for_type(
        x509.DNSName
    )
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert days >= 3649


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
    assert not find(objs, "Secret", "-operator-webhook-tls")
    if find(objs, "Deployment", "-operator"):
        assert not [a for a in operator_args(objs) if a.startswith("--webhook")]
