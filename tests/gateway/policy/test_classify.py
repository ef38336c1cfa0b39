"""Classification P0–P3: table-driven over the shipped policy, every rule kind, XID codes."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.policy.factory import make_alert
from trainsentry.alerts import Priority
from trainsentry.assets import rules_dir
from trainsentry.gateway.policy.classify import Classification, classify, parse_priority
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy

POLICY = load_policy()
NO_BLAST = 1

CASES: list[tuple[str, dict[str, str], dict[str, str], Priority, str]] = [
    # (case, labels, annotations, expected priority, expected deciding rule id)
    ("priority label wins", {"priority": "P1", "severity": "info"}, {}, Priority.P1,
     "label:priority"),
    ("priority label lower case", {"priority": "p0"}, {}, Priority.P0, "label:priority"),
    ("priority label beats alertname rule", {"alertname": "Watchdog", "priority": "P2"}, {},
     Priority.P2, "label:priority"),
    ("invalid priority label falls through to severity", {"priority": "urgent",
     "severity": "warning"}, {}, Priority.P2, "severity:warning"),
    ("severity critical", {"severity": "critical"}, {}, Priority.P1, "severity:critical"),
    ("severity error", {"severity": "error"}, {}, Priority.P1, "severity:error"),
    ("severity warning", {"severity": "warning"}, {}, Priority.P2, "severity:warning"),
    ("severity info", {"severity": "info"}, {}, Priority.P3, "severity:info"),
    ("severity none", {"severity": "none"}, {}, Priority.P3, "severity:none"),
    ("severity P0 spelling", {"severity": "P0"}, {}, Priority.P0, "severity:p0"),
    ("severity p3 spelling", {"severity": "p3"}, {}, Priority.P3, "severity:p3"),
    ("severity upper case", {"severity": "CRITICAL"}, {}, Priority.P1, "severity:critical"),
    ("unknown severity -> default", {"severity": "bogus"}, {}, Priority.P2, "default"),
    ("nothing -> default", {}, {}, Priority.P2, "default"),
    ("alertname rule beats severity", {"alertname": "Watchdog", "severity": "critical"}, {},
     Priority.P3, "alertname:watchdog"),
    ("training down", {"alertname": "TrainingJobHang"}, {}, Priority.P0,
     "alertname:training-down"),
    ("collective hang pattern", {"alertname": "NCCLCollectiveHang"}, {}, Priority.P0,
     "alertname:training-down"),
    ("slow job", {"alertname": "TrainingJobSlowStep"}, {}, Priority.P1,
     "alertname:training-slow"),
    ("pattern must match the whole name", {"alertname": "MyWatchdogX"}, {}, Priority.P2,
     "default"),
    # Hardware meaning raises, never lowers.
    ("xid 79 raises a P2 rule", {"alertname": "GPUXid", "priority": "P2", "xid": "79"}, {},
     Priority.P0, "xid:79"),
    ("xid as float sample value", {"alertname": "GPUXid", "priority": "P2", "xid": "48.0"}, {},
     Priority.P0, "xid:48"),
    ("xid from err_code label", {"alertname": "GPUXid", "err_code": "74"}, {}, Priority.P0,
     "xid:74"),
    ("xid from annotation", {"alertname": "GPUXid", "priority": "P3"}, {"xid": "63"},
     Priority.P1, "xid:63"),
    ("xid 92 SBE rate is P1", {"alertname": "GPUXid", "priority": "P2", "xid": "92"}, {},
     Priority.P1, "xid:92"),
    ("xid 94 contained is P1", {"alertname": "GPUXid", "priority": "P3", "xid": "94"}, {},
     Priority.P1, "xid:94"),
    ("xid 95 uncontained is P0", {"alertname": "GPUXid", "priority": "P2", "xid": "95"}, {},
     Priority.P0, "xid:95"),
    ("xid 64 remap failure is P0", {"alertname": "GPUXid", "priority": "P1", "xid": "64"}, {},
     Priority.P0, "xid:64"),
    ("xid never lowers", {"alertname": "GPUXid", "priority": "P0", "xid": "13"}, {},
     Priority.P0, "label:priority"),
    ("unknown xid changes nothing", {"alertname": "GPUXid", "priority": "P2", "xid": "999"}, {},
     Priority.P2, "label:priority"),
    ("non-numeric xid ignored", {"alertname": "GPUXid", "priority": "P2", "xid": "abc"}, {},
     Priority.P2, "label:priority"),
    ("uncorrectable ECC by name", {"alertname": "GPUMemoryUncorrectableErrors",
     "priority": "P2"}, {}, Priority.P0, "hardware:ecc-uncorrectable"),
    ("uncorrectable ECC by label", {"alertname": "GPUECCErrors", "severity": "warning",
     "ecc": "DBE"}, {}, Priority.P0, "hardware:ecc-uncorrectable-label"),
    ("row remap failure", {"alertname": "GPURowRemapFailure", "priority": "P2"}, {},
     Priority.P0, "hardware:row-remap-failure"),
    ("row remap pending", {"alertname": "GPURowRemapPending", "priority": "P3"}, {},
     Priority.P1, "hardware:row-remap-pending"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("labels", "annotations", "expected", "rule_id"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_classification_table(
    labels: dict[str, str], annotations: dict[str, str], expected: Priority, rule_id: str
) -> None:
    alert = make_alert({"alertname": "Something", **labels}, annotations=annotations or None)
    result = classify(alert, POLICY, distinct_nodes_in_window=NO_BLAST)
    assert (result.priority, result.rule_id) == (expected, rule_id)
    assert result.rule_ids[-1] == rule_id
    assert result.reason  # every decision says why


@pytest.mark.parametrize(("code", "entry"), sorted(POLICY.classification.xid.items()))
def test_every_xid_in_the_table_sets_its_priority_on_a_p3_alert(code: int, entry: object) -> None:
    alert = make_alert({"alertname": "GPUXid", "priority": "P3", "xid": str(code)})
    result = classify(alert, POLICY, distinct_nodes_in_window=NO_BLAST)
    expected = POLICY.classification.xid[code].priority
    assert result.priority == expected
    if expected is not Priority.P3:
        assert result.rule_id == f"xid:{code}"
        assert POLICY.classification.xid[code].name in result.reason


@given(st.text(max_size=12))
def test_any_xid_label_value_classifies_without_error(raw: str) -> None:
    """Labels come from any sender: a value that is no XID code is ignored, never an error
    (an exception here stops the alert policy for every alert behind this one)."""
    alert = make_alert({"alertname": "GPUXid", "priority": "P3", "xid": raw})
    result = classify(alert, POLICY, distinct_nodes_in_window=NO_BLAST)
    assert result.priority in Priority


@pytest.mark.parametrize("raw", ["²", "٧٩", "7⁹", "79.5", "-79", "0x4f", ""])
def test_values_that_are_not_ascii_xid_codes_are_ignored(raw: str) -> None:
    alert = make_alert({"alertname": "GPUXid", "priority": "P3", "xid": raw})
    result = classify(alert, POLICY, distinct_nodes_in_window=NO_BLAST)
    assert not result.rule_id.startswith("xid:")


BLAST = [
    # (nodes in window, base priority label, expected)
    (1, "P2", Priority.P2),
    (7, "P2", Priority.P2),  # below N=8
    (8, "P2", Priority.P1),  # at N: one level up
    (500, "P2", Priority.P1),  # one level, however many
    (8, "P3", Priority.P2),
    (8, "P0", Priority.P0),  # cannot go above P0
]


@pytest.mark.parametrize(("nodes", "label", "expected"), BLAST)
def test_blast_radius_raises_one_level(nodes: int, label: str, expected: Priority) -> None:
    alert = make_alert({"alertname": "NodeNICDown", "priority": label})
    result = classify(alert, POLICY, distinct_nodes_in_window=nodes)
    assert result.priority == expected
    if expected != Priority(label):
        assert result.rule_id == "blast-radius"
        assert f"{nodes} nodes" in result.reason


def test_blast_radius_applies_after_hardware_raise() -> None:
    alert = make_alert({"alertname": "GPUXid", "priority": "P3", "xid": "92"})
    result = classify(alert, POLICY, distinct_nodes_in_window=10)
    assert result.priority == Priority.P0
    assert result.rule_ids == ("label:priority", "xid:92", "blast-radius")


def test_blast_radius_is_configurable() -> None:
    policy = merge_policy(POLICY, {"blast_radius": {"nodes": 3, "raise_by": 2}})
    alert = make_alert({"alertname": "NodeNICDown", "priority": "P3"})
    assert classify(alert, policy, distinct_nodes_in_window=3).priority == Priority.P1
    disabled = merge_policy(POLICY, {"blast_radius": {"enabled": False}})
    assert classify(alert, disabled, distinct_nodes_in_window=999).priority == Priority.P3


def test_alertname_rule_with_label_matchers() -> None:
    policy = merge_policy(
        POLICY,
        {
            "classification": {
                "alertname_rules": [
                    {"id": "ib-prod", "alertname": "IB.*", "labels": {"namespace": "prod-.*"},
                     "priority": "P0"},
                ]
            }
        },
    )  # fmt: skip
    prod = make_alert({"alertname": "IBLinkDown", "namespace": "prod-a", "severity": "warning"})
    dev = make_alert({"alertname": "IBLinkDown", "namespace": "dev", "severity": "warning"})
    assert classify(prod, policy, distinct_nodes_in_window=1).rule_id == "alertname:ib-prod"
    assert classify(dev, policy, distinct_nodes_in_window=1).priority == Priority.P2


def test_classification_round_trips_through_json() -> None:
    alert = make_alert({"alertname": "GPUXid", "priority": "P3", "xid": "92"})
    result = classify(alert, POLICY, distinct_nodes_in_window=10)
    assert Classification.from_json(result.to_json()) == result


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [("P0", Priority.P0), (" p2 ", Priority.P2), ("P4", None), ("", None), ("high", None)],
)
def test_parse_priority(raw: str, parsed: Priority | None) -> None:
    assert parse_priority(raw) == parsed


def test_default_priority_is_policy_data() -> None:
    policy: Policy = merge_policy(POLICY, {"classification": {"default_priority": "P3"}})
    result = classify(make_alert({"alertname": "X"}), policy, distinct_nodes_in_window=1)
    assert (result.priority, result.rule_id) == (Priority.P3, "default")


def test_names_that_merely_contain_dbe_are_not_hardware() -> None:
    alert = make_alert({"alertname": "MySQLDBErrors", "severity": "warning"})
    assert classify(alert, POLICY, distinct_nodes_in_window=1).priority == Priority.P2
    dbe = make_alert({"alertname": "GPUDBEErrors", "severity": "warning"})
    assert classify(dbe, POLICY, distinct_nodes_in_window=1).priority == Priority.P0


def _shipped_rules() -> list[tuple[str, dict[str, str]]]:
    rules: list[tuple[str, dict[str, str]]] = []
    for path in sorted(rules_dir().glob("*.yaml")):
        loaded = yaml.safe_load(path.read_text()) or {}
        for group in loaded.get("groups", []) if isinstance(loaded, dict) else []:
            for rule in group.get("rules", []):
                if "alert" in rule:
                    labels = {
                        k: str(v)
                        for k, v in (rule.get("labels") or {}).items()
                        if "{{" not in str(v)
                    }
                    rules.append((rule["alert"], labels))
    return rules


def test_the_policy_keeps_the_priority_of_our_own_rules() -> None:
    """The policy may raise foreign alerts; it must not re-prioritise the shipped rules."""
    shipped = _shipped_rules()
    if not shipped:
        pytest.skip("no rule files yet")
    changed = []
    for alertname, labels in shipped:
        alert = make_alert({**labels, "alertname": alertname})
        result = classify(alert, POLICY, distinct_nodes_in_window=1)
        if "priority" in labels and result.priority != Priority(labels["priority"]):
            changed.append((alertname, labels["priority"], result.priority.value, result.rule_id))
    assert changed == []


LABEL_VALUES = {
    "alertname": ("DCGMXidError", "GPUFellOffBus", "Watchdog", "NodeNICDown", "GPUHot"),
    "priority": ("P0", "P2", "urgent"),
    "severity": ("critical", "warning", "bogus"),
    "xid": ("13", "79", "92", "79.0"),
    "ecc": ("uncorrectable", "1"),
    "node": ("gpu-1", "gpu-2"),
    "gpu": ("0", "7"),
}


@st.composite
def classified_alerts(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str], int]:
    labels = {
        name: draw(st.sampled_from(values))
        for name, values in LABEL_VALUES.items()
        if draw(st.booleans())
    }
    annotations = {"xid": draw(st.sampled_from(("13", "79", "95")))} if draw(st.booleans()) else {}
    return labels, annotations, draw(st.integers(1, 12))


@given(st.lists(classified_alerts(), min_size=1, max_size=30))
def test_memoised_classification_is_the_one_worked_out_afresh(
    cases: list[tuple[dict[str, str], dict[str, str], int]],
) -> None:
    """A storm's alerts are classified by what classification reads (issue 46): the answers
    of one policy, asked over and over, are those of a fresh copy of it asked once each; and
    another policy (here: another blast radius) is never answered from the first's."""
    other = merge_policy(POLICY, {"blast_radius": {"nodes": 3, "raise_by": 2}})
    # each alert also without its annotations, and on another node: what differs is asked
    asked = [(make_alert(labels, annotations=notes), n) for labels, notes, n in cases] + [
        (make_alert({**labels, "node": "gpu-9"}), n + 1) for labels, _, n in cases
    ]
    for policy in (POLICY, other, POLICY):
        memoised = [classify(alert, policy, distinct_nodes_in_window=n) for alert, n in asked]
        afresh = [
            classify(alert, policy.model_copy(deep=True), distinct_nodes_in_window=n)
            for alert, n in asked
        ]
        assert memoised == afresh
