"""rules/training.yaml: promtool unit tests, the renderer contract, per-job rendering."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from rules.jobscope import render_for_job
from tests.support.promtool import promtool
from trainsentry import rulesdoc
from trainsentry.assets import rules_dir

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing")

RULES = rules_dir() / "training.yaml"
UNIT_TESTS = rules_dir() / "tests" / "training_test.yaml"
MEMBERSHIP = "trainsentry:job_pod:info"


def alert_rules() -> list[rulesdoc.AlertRule]:
    return rulesdoc.alert_rules_from_document(yaml.safe_load(RULES.read_text()), RULES.name)


def test_promtool_check_and_unit_tests_pass() -> None:
    check = promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_firing_and_quiet_cases() -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule.name]
        assert any(c["exp_alerts"] for c in mine), f"{rule.name} never fires in a test"
        assert any(not c["exp_alerts"] for c in mine), f"{rule.name} has no quiet case"


def test_contract_labels_annotations_thresholds_and_scope() -> None:
    rules = alert_rules()
    assert len(rules) >= 8
    names: set[str] = set()
    for rule in rules:
        assert rule.priority in {"P0", "P1", "P2", "P3"}, rule.name
        assert rule.component == "training", rule.name
        for key in ("summary", "description", "why", "runbook_url"):
            assert rule.annotations.get(key), (rule.name, key)
        assert rule.annotations["runbook_url"].endswith("#" + rule.name.lower())
        assert rule.annotations["job_scope"] == "pod", rule.name
        token = re.compile(re.escape(MEMBERSHIP) + r"(?![\w:{])")
        assert len(token.findall(rule.expr)) == 1, rule.name
        assert "trainingjob" in rule.annotations["description"], rule.name
        for name, default in rule.thresholds:
            assert len(rulesdoc.threshold_pattern(default).findall(rule.expr)) == 1, name
            assert name not in names, f"threshold {name} declared twice"
            names.add(name)
    assert {"hang_seconds", "rank_stall_seconds"} <= names
    priorities = {r.name: r.priority for r in rules}
    assert priorities["TrainingJobHang"] == "P0"


def _series(name: str, pod: str, job: str, values: str, **labels: str) -> dict[str, str]:
    all_labels = {"namespace": "ns1", "pod": pod, "trainingjob": job, "pg": "0", **labels}
    body = ",".join(f'{k}="{v}"' for k, v in all_labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def test_rendered_for_one_job_only_covers_it_and_uses_the_override(tmp_path: Path) -> None:
    document = yaml.safe_load(RULES.read_text())
    rendered = render_for_job(document, "ns1", "tj", thresholds={"hang_seconds": "120"})
    rule_file = tmp_path / "tj-training.yaml"
    rule_file.write_text(yaml.safe_dump(rendered, sort_keys=False))
    check = promtool("check", "rules", str(rule_file))
    assert check.returncode == 0, check.stdout + check.stderr

    series: list[dict[str, str]] = []
    for job in ("tj", "other"):
        member = f'namespace="ns1",pod="{job}-0",node="n1",trainingjob="{job}"'
        series.append({"series": f"{MEMBERSHIP}{{{member}}}", "values": "1x10"})
        series.append(
            _series("trainsentry_probe_seconds_since_last_completion", f"{job}-0", job, "0+60x10")
        )
        series.append(_series("trainsentry_probe_inflight_seq", f"{job}-0", job, "7x10"))
    expected: dict[str, Any] = {
        "alertname": "TrainingJobHang",
        "priority": "P0",
        "component": "training",
        "namespace": "ns1",
        "trainingjob": "tj",
        "pg": "0",
    }
    hang = next(
        r for g in rendered["groups"] for r in g["rules"] if r["alert"] == "TrainingJobHang"
    )
    unit = {
        "rule_files": [rule_file.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "2m", "alertname": "TrainingJobHang", "exp_alerts": []},
                    {
                        "eval_time": "4m",
                        "alertname": "TrainingJobHang",
                        "exp_alerts": [
                            {
                                "exp_labels": expected,
                                "exp_annotations": {
                                    **hang["annotations"],
                                    "summary": "Job ns1/tj is hung in process group 0",
                                    "description": "No rank of TrainingJob ns1/tj completed a "
                                    "collective in process group 0 () for 4m 0s while ranks "
                                    "have one in flight.",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    assert hang["annotations"]["thresholds"] == "hang_seconds=120"
    test_file = tmp_path / "tj-training_test.yaml"
    test_file.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
