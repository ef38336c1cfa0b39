"""The gateway's own alert rules: promtool-tested, and every metric they use really exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase

from trainsentry.gateway.metrics import GatewayMetrics

SELF_RULES = Path(__file__).resolve().parents[2] / "rules" / "self"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def test_promtool_checks_and_unit_tests_pass() -> None:
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(SELF_RULES / "trainsentry.yaml")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [PROMTOOL, "test", "rules", "trainsentry_test.yaml"],
        capture_output=True, text=True, cwd=SELF_RULES / "tests",
    )  # fmt: skip
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_trainsentry_metric_in_the_rules_is_exported_by_the_gateway() -> None:
    exposed = generate_latest(GatewayMetrics().registry).decode()
    rules = yaml.safe_load((SELF_RULES / "trainsentry.yaml").read_text())
    used = {
        name
        for group in rules["groups"]
        for rule in group["rules"]
        for name in re.findall(r"trainsentry_[a-z_]+", rule["expr"])
    }
    assert used, "the rules should use the gateway's metrics"
    missing = [
        name
        for name in sorted(used)
        if f"# TYPE {name} " not in exposed
        and f"# TYPE {name.removesuffix('_total')} " not in exposed
    ]
    assert not missing, missing


def test_label_matchers_in_the_rules_name_labels_the_metrics_have() -> None:
    # A renamed label (say `urgency` for `priority`) would leave a rule that never matches.
    label_names = {
        metric._name: set(metric._labelnames)
        for metric in vars(GatewayMetrics()).values()
        if isinstance(metric, MetricWrapperBase)
    }
    rules = yaml.safe_load((SELF_RULES / "trainsentry.yaml").read_text())
    checked = 0
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        for name, matchers in re.findall(r"(trainsentry_[a-z_]+)\{([^}]*)\}", rule["expr"]):
            known = label_names[name.removesuffix("_total")]
            for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=)", matchers):
                assert label in known, f"{rule['alert']}: {name} has no label {label!r}"
                checked += 1
    assert checked >= 3


def test_every_rule_has_a_runbook_entry() -> None:
    runbook = (SELF_RULES.parents[1] / "docs" / "gateway.md").read_text().split("## Runbook")[1]
    rules = yaml.safe_load((SELF_RULES / "trainsentry.yaml").read_text())
    missing = [
        rule["alert"]
        for group in rules["groups"]
        for rule in group["rules"]
        if f"**{rule['alert']}**" not in runbook
    ]
    assert not missing, missing


def test_rules_carry_priority_component_and_runbook() -> None:
    rules = yaml.safe_load((SELF_RULES / "trainsentry.yaml").read_text())
    for rule in (r for g in rules["groups"] for r in g["rules"]):
        assert rule["labels"]["priority"] in {"P0", "P1", "P2", "P3"}
        assert rule["labels"]["component"] == "trainsentry"
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
