"""The shipped rule files: promtool-valid, unit-tested, and true to the documented contract."""

from __future__ import annotations

import csv
import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promtool import promtool
from trainsentry import rulesdoc
from trainsentry.assets import dashboards_dir, data_file, rules_dir

OWN_RULE_FILES = ("gpu.yaml", "fabric.yaml", "node.yaml", "kubernetes.yaml")
MINIMUM_ALERTS = {"gpu": 15, "fabric": 8, "node": 8, "kubernetes": 6}
PRIORITIES = {"P0", "P1", "P2", "P3"}
COMPONENTS = {"gpu", "fabric", "node", "kubernetes", "training"}
RUNBOOK_PREFIX = "https://github.com/trainsentry/trainsentry/blob/main/docs/alerts.md#"
XID_CODE = re.compile(r"DCGM_FI_DEV_XID_ERRORS == (\d+)")
DCGM_METRIC = re.compile(r"\bDCGM_FI_[A-Z0-9_]+")
# Old name of DCGM_FI_DEV_CLOCKS_EVENT_REASONS, accepted by the rules, not in the CSV.
DCGM_ALIASES = {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return promtool(*args, cwd=rules_dir())


def _rules(names: tuple[str, ...] = OWN_RULE_FILES) -> list[rulesdoc.AlertRule]:
    return rulesdoc.load_rule_files(rules_dir() / n for n in names)


def _raw_rules(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((rules_dir() / name).read_text())
    return [r for g in document["groups"] for r in g["rules"]]


def test_promtool_check_rules_accepts_every_rule_file() -> None:
    files = sorted(p.name for p in rules_dir().glob("*.yaml") if "groups" in p.read_text())
    assert set(OWN_RULE_FILES) <= set(files)
    result = _promtool("check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", [n.replace(".yaml", "_test.yaml") for n in OWN_RULE_FILES])
def test_promtool_unit_tests_pass(name: str) -> None:
    result = _promtool("test", "rules", f"tests/{name}")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_not_firing_promtool_case() -> None:
    firing: Counter[str] = Counter()
    quiet: Counter[str] = Counter()
    for name in OWN_RULE_FILES:
        tests = yaml.safe_load(
            (rules_dir() / "tests" / name.replace(".yaml", "_test.yaml")).read_text()
        )
        for case in tests["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet)[check["alertname"]] += 1
    names = {r.name for r in _rules()}
    assert names - set(firing) == set(), "alerts without a firing case"
    assert names - set(quiet) == set(), "alerts without a not-firing case"


def test_minimum_alert_counts_per_component() -> None:
    counts = Counter(r.component for r in _rules())
    for component, minimum in MINIMUM_ALERTS.items():
        assert counts[component] >= minimum, (component, counts[component])


def test_every_alert_carries_labels_and_annotations_of_the_contract() -> None:
    rules = _rules()
    assert len({r.name for r in rules}) == len(rules), "duplicate alert names"
    for rule in rules:
        assert rule.priority in PRIORITIES, rule.name
        assert rule.component in COMPONENTS, rule.name
        assert rule.source == f"{rule.component}.yaml", rule.name
        for key in ("summary", "description", "runbook_url", "why", "job_scope"):
            assert rule.annotations.get(key), (rule.name, key)
        assert rule.annotations["runbook_url"] == RUNBOOK_PREFIX + rule.name.lower()
        assert rule.annotations["job_scope"] in {"node", "pod", "cluster"}, rule.name
        # descriptions name the place: node for node scope, pod for pod scope
        scope = rule.annotations["job_scope"]
        if scope == "node":
            assert "$labels.node" in rule.annotations["description"], rule.name
        if scope == "pod":
            assert "$labels.pod" in rule.annotations["description"], rule.name


def test_every_rule_that_can_page_p0_says_what_to_do_first() -> None:
    """A P0 card says what to do first (issue 47: the OOM card, paged as P0, gave no next
    step): every shipped rule whose alert can become P0 (its priority label, raised by the
    shipped policy's blast radius when the same alert fires on enough nodes of a job) has a
    `first_step` annotation, one sentence a person acts on, which the card shows."""
    policy = yaml.safe_load(data_file("policy.yaml").read_text(encoding="utf-8"))
    blast = policy.get("blast_radius") or {}
    raise_by = int(blast.get("raise_by", 0)) if blast.get("enabled") else 0
    can_page = [r for r in _rules() if int(r.priority[1]) - raise_by <= 0]
    assert len(can_page) >= 30, [r.name for r in can_page]  # P0 and P1 rules
    missing = [r.name for r in can_page if not r.annotations.get("first_step")]
    assert not missing, f"rules that can page P0 without a first_step annotation: {missing}"
    for rule in can_page:
        step = rule.annotations["first_step"]
        assert step[0].isupper() and step.endswith(".") and len(step) <= 200, rule.name
        assert "{{" not in step, rule.name  # the same words on every card of the rule


def test_thresholds_occur_exactly_once_and_names_are_unique() -> None:
    seen: list[str] = []
    for rule in _rules():
        for name, default in rule.thresholds:
            matches = rulesdoc.threshold_pattern(default).findall(rule.expr)
            assert len(matches) == 1, (rule.name, name, default, rule.expr)
            seen.append(name)
    assert len(seen) == len(set(seen)), Counter(seen).most_common(3)
    assert len(seen) >= 20


def test_pod_scoped_rules_join_the_membership_series_once() -> None:
    for rule in _rules():
        count = len(re.findall(r"trainsentry:job_pod:info(?![\w:{])", rule.expr))
        if rule.annotations["job_scope"] == "pod":
            assert count == 1, rule.name
            assert "trainingjob" in rule.annotations["description"], rule.name
        else:
            assert count == 0, rule.name


def test_parse_thresholds_rejects_malformed_items() -> None:
    assert rulesdoc.parse_thresholds("a=1, b_2=0.05") == (("a", "1"), ("b_2", "0.05"))
    with pytest.raises(ValueError):
        rulesdoc.parse_thresholds("a 1")


def test_threshold_pattern_skips_label_values_and_durations() -> None:
    expr = 'increase(x{gpu="0"}[10m]) > 0 and y{a="0.5"} < 0.5'
    assert len(rulesdoc.threshold_pattern("0").findall(expr)) == 1
    assert len(rulesdoc.threshold_pattern("0.5").findall(expr)) == 1


def _catalogue() -> dict[str, Any]:
    return yaml.safe_load((rules_dir() / "xid_catalogue.yaml").read_text())


def test_xid_alerts_cover_each_catalogue_code_once_with_its_priority() -> None:
    catalogue = _catalogue()
    by_name = {r["alert"]: r for r in _raw_rules("gpu.yaml")}
    covered: Counter[int] = Counter()
    for name, rule in by_name.items():
        if name == catalogue["unknown"]["alert"] or "DCGM_FI_DEV_XID_ERRORS" not in rule["expr"]:
            continue
        for code in map(int, XID_CODE.findall(rule["expr"])):
            covered[code] += 1
            entry = catalogue["xid"][code]
            assert entry["alert"] == name, code
            assert entry["priority"] == rule["labels"]["priority"], code
    assert set(covered) == set(catalogue["xid"]), "catalogue codes without an alert"
    assert set(covered.values()) == {1}, "a code matched by two alerts"
    unknown = by_name[catalogue["unknown"]["alert"]]
    assert sorted(map(int, XID_CODE.findall(unknown["expr"]))) == sorted(catalogue["xid"])
    assert unknown["labels"]["priority"] == catalogue["unknown"]["priority"]


def test_xid_catalogue_agrees_with_the_policy() -> None:
    policy_path = data_file("policy.yaml")
    if not policy_path.exists():
        pytest.skip("no policy.yaml")
    policy_xid = yaml.safe_load(policy_path.read_text())["classification"]["xid"]
    ours = {code: entry["priority"] for code, entry in _catalogue()["xid"].items()}
    theirs = {int(code): entry["priority"] for code, entry in policy_xid.items()}
    assert ours == theirs


def test_issue_named_xids_have_the_documented_priorities() -> None:
    xid = _catalogue()["xid"]
    assert {c: xid[c]["priority"] for c in (48, 74, 79, 95)} == dict.fromkeys(
        (48, 74, 79, 95), "P0"
    )
    assert {c: xid[c]["priority"] for c in (63, 64, 92, 94)} == {
        63: "P1",
        64: "P0",
        92: "P1",
        94: "P1",
    }


# NVIDIA's "Resolution Bucket (Immediate Action)" for some of our codes, as its Xid catalog
# gives them (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html; NVIDIA's
# machine-readable copy in NVIDIA/NVSentinel, cited in rules/xid_catalogue.yaml). Our own
# earlier guesses had 94, 63, 92 and 121 as RESET_GPU and 64 as CONTACT_SUPPORT.
NVIDIA_IMMEDIATE_ACTION = {
    13: "RESTART_APP",
    43: "IGNORE",
    48: "WORKFLOW_XID_48",
    63: "IGNORE",
    64: "RESET_GPU",
    74: "WORKFLOW_NVLINK_ERR",
    79: "RESTART_BM",
    92: "IGNORE",
    94: "RESTART_APP",
    95: "RESET_GPU",
    121: "IGNORE",
}


def test_resolutions_are_nvidias_immediate_action_buckets() -> None:
    xid = _catalogue()["xid"]
    assert {c: xid[c]["resolution"] for c in NVIDIA_IMMEDIATE_ACTION} == NVIDIA_IMMEDIATE_ACTION
    assert {c: xid[c]["mnemonic"] for c in (79, 94)} == {
        79: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        94: "ROBUST_CHANNEL_CONTAINED_ERROR",
    }
    assert all(entry.get("mnemonic") for entry in xid.values()), "every code names NVIDIA's"


def _csv_fields() -> set[str]:
    lines = [
        line
        for line in (rules_dir() / "dcgm-counters.csv").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    rows = list(csv.reader(lines, skipinitialspace=True))
    assert all(len(row) == 3 and row[1] in {"gauge", "counter"} for row in rows), rows
    return {row[0] for row in rows}


def test_dcgm_counters_csv_enables_every_field_the_rules_and_dashboards_use() -> None:
    used = set(DCGM_METRIC.findall((rules_dir() / "gpu.yaml").read_text()))
    for path in dashboards_dir().glob("*.json"):
        used |= set(DCGM_METRIC.findall(path.read_text()))
    assert used - DCGM_ALIASES - _csv_fields() == set()


def test_alertmanager_snippet_passes_amtool() -> None:
    result = subprocess.run(
        ["amtool", "check-config", str(rules_dir() / "alertmanager-inhibit.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    snippet = yaml.safe_load((rules_dir() / "alertmanager-inhibit.yaml").read_text())
    alert_names = {r.name for r in _rules()}
    for rule in snippet["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            match = re.fullmatch(r'alertname(=|!=)"(\w+)"', matcher)
            if match:
                assert match.group(2) in alert_names, matcher


def test_generated_docs_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert rulesdoc.main(["--check"]) == 0, "run: python -m trainsentry.rulesdoc"


def test_rulesdoc_writes_table_and_runbooks(tmp_path: Path) -> None:
    docs = tmp_path / "alerts.md"
    docs.write_text("# head\n")
    assert rulesdoc.main(["--docs", str(docs)]) == 0
    text = docs.read_text()
    assert text.startswith("# head\n")
    assert (
        "| [GPUFellOffBus](#gpufelloffbus) | P0 | gpu | `DCGM_FI_DEV_XID_ERRORS == 79` | 0s |"
        in text
    )
    # regex alternations are escaped inside the table
    assert 'condition=~"MemoryPressure\\|DiskPressure\\|PIDPressure"' in text
    for rule in _rules():
        assert f"\n### {rule.name}\n" in text
    assert rulesdoc.main(["--docs", str(docs), "--check"]) == 0
    docs.write_text(text.replace("GPUFellOffBus", "Renamed", 1))
    assert rulesdoc.main(["--docs", str(docs), "--check"]) == 1


def test_dashboards_json_is_well_formed() -> None:
    paths = sorted(dashboards_dir().glob("*.json"))
    assert len(paths) >= 2
    uids = set()
    for path in paths:
        board = json.loads(path.read_text())
        uids.add(board["uid"])
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        occupied: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] >= 0 and grid["y"] >= 0
            assert grid["x"] + grid["w"] <= 24, (path.name, panel["title"])
            cells = {
                (x, y)
                for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])
            }
            assert not cells & occupied, (path.name, panel["title"], "overlaps")
            occupied |= cells
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]
    assert len(uids) == len(paths)


def test_trainingjob_dashboard_has_namespace_and_job_variables() -> None:
    board = json.loads((dashboards_dir() / "trainingjob.json").read_text())
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "namespace", "job"]
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert all('namespace="$namespace"' in e and 'trainingjob="$job"' in e for e in exprs)
    annotation = board["annotations"]["list"][0]["expr"]
    # the job's own alerts, and the cluster-wide ones of its nodes (it has no copy of those)
    assert (
        annotation.startswith("(ALERTS{")
        and 'ALERTS{alertstate="firing", namespace=""}' in annotation
    )
    assert "* on(node) group_left(namespace, trainingjob) trainsentry:job_node:info{" in annotation
