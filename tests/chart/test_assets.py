"""The chart ships the repository's own rules/ and dashboards/ files (one source, via
symlinks), its version follows the package, and the vendored CRD schemas are current."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart.chart_helm import CHART, REPO, find, helm, one, rendered, template
from trainsentry.config import WebhookChannelSettings
from trainsentry.config.channels import ChannelsSettings
from trainsentry.config.reports import ReportSettings

MATCHER = re.compile(r'^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$')


def test_chart_files_are_the_repository_folders() -> None:
    for name in ("rules", "dashboards"):
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} must be a symlink to the top-level {name}/"
        assert link.resolve() == (REPO / name).resolve()


def _source(name: str) -> Path:
    path = REPO / "rules" / name
    if not path.is_file():
        pytest.fail(f"rules/{name} is missing (the rules engineer ships it; the chart needs it)")
    return path


def test_dcgm_counters_config_map_is_the_rules_csv() -> None:
    cm = one(rendered("defaults"), "ConfigMap", "-dcgm-exporter")
    assert cm["data"]["counters.csv"] == _source("dcgm-counters.csv").read_text(encoding="utf-8")
    ds = one(rendered("defaults"), "DaemonSet", "-dcgm-exporter")
    args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--collectors=/etc/dcgm-exporter/counters.csv" in args and "--kubernetes" in args


def _crd_matchers(rule: dict[str, Any], side: str) -> list[dict[str, str]]:
    """Alertmanager's matcher forms, converted independently of the template."""
    out = []
    for text in rule.get(f"{side}_matchers", []):
        match = MATCHER.match(text)
        assert match, text
        out.append({"name": match[1], "matchType": match[2], "value": match[3]})
    out += [
        {"name": k, "matchType": "=", "value": str(v)}
        for k, v in rule.get(f"{side}_match", {}).items()
    ]
    out += [
        {"name": k, "matchType": "=~", "value": str(v)}
        for k, v in rule.get(f"{side}_match_re", {}).items()
    ]
    return out


def _alertmanager_snippet() -> dict[str, Any]:
    source = yaml.safe_load(_source("alertmanager-inhibit.yaml").read_text(encoding="utf-8"))
    assert isinstance(source, dict) and source.get("inhibit_rules"), "no inhibit_rules"
    return source


def test_inhibit_rules_are_the_rules_file() -> None:
    expected = []
    for rule in _alertmanager_snippet()["inhibit_rules"]:
        converted: dict[str, Any] = {
            "sourceMatch": _crd_matchers(rule, "source"),
            "targetMatch": _crd_matchers(rule, "target"),
        }
        if rule.get("equal"):
            converted["equal"] = rule["equal"]
        expected.append(converted)
    amc = one(rendered("defaults"), "AlertmanagerConfig")
    assert amc["spec"]["inhibitRules"] == expected


def test_route_grouping_and_child_routes_are_the_rules_file() -> None:
    source = _alertmanager_snippet().get("route", {})
    route = one(rendered("defaults"), "AlertmanagerConfig")["spec"]["route"]
    names = {
        "groupBy": "group_by",
        "groupWait": "group_wait",
        "groupInterval": "group_interval",
        "repeatInterval": "repeat_interval",
    }
    for ours, theirs in names.items():
        assert route.get(ours) == source.get(theirs), ours
    children = route.get("routes", [])
    assert len(children) == len(source.get("routes", []))
    for child, source_child in zip(children, source.get("routes", []), strict=True):
        assert child["matchers"] == _crd_matchers({"x_matchers": source_child["matchers"]}, "x")
        for ours, theirs in names.items():
            assert child.get(ours) == source_child.get(theirs), ours
        assert "receiver" not in child  # inherits the gateway receiver


def test_route_values_override_the_file(tmp_path: Path) -> None:
    values = {"alertmanager": {"config": {"route": {"groupWait": "1s", "childRoutes": False}}}}
    amc = one(template(overrides=values, tmp=tmp_path), "AlertmanagerConfig")
    assert amc["spec"]["route"]["groupWait"] == "1s"
    assert "routes" not in amc["spec"]["route"]


def test_dashboards_are_config_maps_for_the_grafana_sidecar() -> None:
    sources = sorted((REPO / "dashboards").glob("*.json"))
    if not sources:
        pytest.fail("dashboards/ holds no *.json: the chart has no dashboards to ship")
    objs = rendered("defaults")
    maps = [
        cm
        for cm in find(objs, "ConfigMap")
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1"
    ]
    shipped = {key: value for cm in maps for key, value in cm["data"].items()}
    assert shipped == {p.name: p.read_text(encoding="utf-8") for p in sources}
    assert len({cm["metadata"]["name"] for cm in maps}) == len(maps) == len(sources)
    for cm in maps:
        json.loads(next(iter(cm["data"].values())))
        assert len(json.dumps(cm)) < 1_000_000  # ConfigMap size limit
    other_ns = [
        cm
        for cm in find(rendered("everything-on"), "ConfigMap")
        if "-dashboard-" in cm["metadata"]["name"]
    ]
    assert {cm["metadata"]["namespace"] for cm in other_ns} == {"monitoring"}


def test_packaged_chart_carries_the_files_not_the_links(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("trainsentry-*.tgz")
    with tarfile.open(package) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert not [m for m in members.values() if m.issym()]
        assert not [n for n in members if n.startswith("trainsentry/files/rules/tests/")]
        for source in (
            sorted((REPO / "rules").glob("*.*"))
            + sorted((REPO / "rules" / "self").glob("*.yaml"))
            + sorted((REPO / "dashboards").glob("*.json"))
        ):
            if source.suffix == ".md":
                continue
            member = f"trainsentry/files/{source.relative_to(REPO).as_posix()}"
            assert member in members, member
            extracted = tar.extractfile(members[member])
            assert extracted is not None and extracted.read() == source.read_bytes()


def test_chart_version_follows_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["version"] == project["version"]
    assert chart["appVersion"] == project["version"]


def test_settings_sections_in_the_values_schema_match_the_settings_models() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    props = schema["properties"]
    channels = props["channels"]["properties"]["config"]["propertyNames"]["enum"]
    assert set(channels) == set(ChannelsSettings.model_fields)
    reports = props["report"]["properties"]["config"]["propertyNames"]["enum"]
    assert set(reports) == set(ReportSettings.model_fields)
    webhook = props["webhooks"]["additionalProperties"]["properties"]
    assert set(webhook) == set(WebhookChannelSettings.model_fields)


def _rule_files(folder: str = "rules") -> list[Path]:
    files = []
    for path in sorted((REPO / folder).glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and "groups" in doc:
            files.append(path)
    if not files:
        pytest.fail(f"{folder}/ holds no rule files")
    return files


def _spec(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _alerts(specs: list[Any]) -> list[str]:
    return [
        rule["alert"]
        for spec in specs
        for group in spec["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def test_rule_files_become_prometheus_rules_unchanged() -> None:
    """One PrometheusRule per rule file of rules/ and of rules/self/, nothing else."""
    sources = _rule_files() + _rule_files("rules/self")
    specs = [r["spec"] for r in find(rendered("defaults"), "PrometheusRule")]
    assert len(specs) == len(sources)
    for path in sources:
        assert _spec(path) in specs, path
    assert not find(rendered("everything-on"), "PrometheusRule", "-rules-xid-catalogue")


def test_self_monitoring_alerts_are_installed_and_can_be_turned_off(tmp_path: Path) -> None:
    """rules/self/ (the gateway watching itself, "installed cluster-wide") is rendered by
    default; prometheusRules.selfMonitoring=false drops it and only it."""
    self_alerts = _alerts([_spec(p) for p in _rule_files("rules/self")])
    job_alerts = _alerts([_spec(p) for p in _rule_files()])
    assert self_alerts
    for values in ("defaults", "everything-on"):
        shipped = _alerts([r["spec"] for r in find(rendered(values), "PrometheusRule")])
        assert sorted(shipped) == sorted(job_alerts + self_alerts), values
    off = template(overrides={"prometheusRules": {"selfMonitoring": False}}, tmp=tmp_path)
    shipped = _alerts([r["spec"] for r in find(off, "PrometheusRule")])
    assert sorted(shipped) == sorted(job_alerts)
    none = template(overrides={"prometheusRules": {"enabled": False}}, tmp=tmp_path)
    assert not find(none, "PrometheusRule")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (prometheus) missing")
def test_rendered_prometheus_rules_pass_promtool(tmp_path: Path) -> None:
    files = []
    for rule in find(rendered("defaults"), "PrometheusRule"):
        path = tmp_path / f"{rule['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
        files.append(str(path))
    assert files
    proc = subprocess.run(["promtool", "check", "rules", *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
