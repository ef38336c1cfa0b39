"""docs/deploy.md's plain alertmanager.yml snippet is a valid Alertmanager configuration
(checked by the real amtool) that reaches the gateway the chart renders."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

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
