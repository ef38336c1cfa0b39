"""docs/deploy.md's plain alertmanager.yml snippet is a valid Alertmanager configuration
(checked by the real amtool) that reaches the gateway the chart renders."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart.chart_helm import CHART, REPO, helm

DEPLOY_DOC = REPO / "docs" / "deploy.md"


def snippet() -> str:
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- alertmanager-snippet -->\n```yaml\n(.*?)```", text, re.S)
    assert match, "docs/deploy.md lost its alertmanager snippet"
    return match.group(1)


@pytest.mark.skipif(
    shutil.which("amtool") is None, reason="amtool (prometheus-alertmanager) missing"
)
def test_snippet_passes_amtool_check_config(tmp_path: Path) -> None:
    config = yaml.safe_load(snippet())
    http = config["receivers"][1]["webhook_configs"][0]["http_config"]["authorization"]
    token = tmp_path / "webhook-token"
    token.write_text("t0ken", encoding="utf-8")
    http["credentials_file"] = str(token)
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_snippet_points_at_the_gateway_service_of_a_default_release() -> None:
    out = helm("template", "trainsentry", str(CHART), "--namespace", "trainsentry")
    objs = [o for o in yaml.safe_load_all(out) if o]
    service = next(
        o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-gateway")
    )
    secret = next(
        o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-gateway-auth")
    )
    config = yaml.safe_load(snippet())
    webhook = config["receivers"][1]["webhook_configs"][0]
    name, port = service["metadata"]["name"], service["spec"]["ports"][0]["port"]
    assert webhook["url"] == f"http://{name}.trainsentry.svc:{port}/api/v1/alertmanager"
    assert webhook["send_resolved"] is True
    credentials = webhook["http_config"]["authorization"]["credentials_file"]
    assert credentials.endswith(f"/{secret['metadata']['name']}/webhook-token")


def test_snippet_inhibit_rule_is_one_of_the_rules_file() -> None:
    shipped = yaml.safe_load(
        (REPO / "rules" / "alertmanager-inhibit.yaml").read_text(encoding="utf-8")
    )
    for rule in yaml.safe_load(snippet())["inhibit_rules"]:
        assert rule in shipped["inhibit_rules"]


def _default_release() -> list[Any]:
    out = helm("template", "trainsentry", str(CHART), "--namespace", "trainsentry")
    return [o for o in yaml.safe_load_all(out) if o]


def test_every_gateway_url_in_the_docs_uses_the_gateways_service_port() -> None:
    """docs/probe.md once said :8080 (the operator's health port): every URL naming the
    gateway's Service, in the docs and the READMEs, now says one of the Service's ports, and
    the probes' (docs/probe.md) its trigger port."""
    objs = _default_release()
    service = next(
        o
        for o in objs
        if o["kind"] == "Service" and str(o["metadata"]["name"]).endswith("-gateway")
    )
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    pages = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", CHART / "README.md"]
    found = []
    for page in pages:
        for match in re.finditer(r"https?://[a-z0-9.-]*gateway[a-z0-9.-]*:(\d+)", page.read_text()):
            found.append((page.name, match.group(0)))
            expected = ports["triggers"] if page.name == "probe.md" else ports["http"]
            assert int(match.group(1)) == expected, f"{page.name}: {match.group(0)}"
    assert found  # the pattern still finds the docs' URLs


def manual_pod_template() -> Any:
    text = (REPO / "docs" / "probe.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- manual-pod-template -->\n```yaml\n(.*?)```", text, re.S)
    assert match, "docs/probe.md lost its manual pod template"
    template = yaml.safe_load(match.group(1))
    return template


def test_the_manual_pod_template_works_with_a_default_release() -> None:
    """The pod template docs/probe.md gives clusters without the webhook: a valid Pod, every
    variable one the probe reads, the gateway's real Service and port, the Secret name and
    key the operator writes, the label the NetworkPolicy admits, the webhook's dump folder."""
    import kubernetes_validate

    from trainsentry.operator.instrument import DUMP_VOLUME, TOKEN_KEY, token_secret_name
    from trainsentry.operator.spec import JOB_LABEL
    from trainsentry.probe.identity import config_from_env
    from trainsentry.probe.inject import DUMP_MOUNT

    template = manual_pod_template()
    pod = {"apiVersion": "v1", "kind": "Pod", **template}
    pod["metadata"] = {"name": "llama-worker-0", **template["metadata"]}
    for version in ("1.30.0", "1.37.0"):
        kubernetes_validate.validate(pod, version, strict=True)
    container = template["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    literal = {name: e["value"] for name, e in env.items() if "value" in e}
    config = config_from_env({**literal, "TRAINSENTRY_NAMESPACE": "team-a", "POD_NAME": "p",
                              "TRAINSENTRY_NODE": "n", "TRAINSENTRY_PROBE_TOKEN": "t"})  # fmt: skip
    assert (config.trainingjob, config.gateway_url) == ("llama", literal["TRAINSENTRY_GATEWAY_URL"])
    assert config.token == "t" and config.pod == "p" and config.node == "n"
    objs = _default_release()
    service = next(o for o in objs if o["kind"] == "Service"
                   and str(o["metadata"]["name"]).endswith("-gateway"))  # fmt: skip
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    name, port = service["metadata"]["name"], ports["triggers"]
    assert config.gateway_url == f"http://{name}.trainsentry.svc:{port}"  # the trigger port
    ref = env["TRAINSENTRY_PROBE_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": token_secret_name("llama"), "key": TOKEN_KEY}
    assert template["metadata"]["labels"][JOB_LABEL] == "llama"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[DUMP_VOLUME] == DUMP_MOUNT
