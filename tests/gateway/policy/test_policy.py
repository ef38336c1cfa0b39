"""The policy file: shipped default, file and override merging, validation, XID agreement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainsentry.alerts import Priority
from trainsentry.assets import data_file, rules_dir
from trainsentry.gateway.policy.rules import (
    PolicyError,
    deep_merge,
    default_policy_raw,
    load_policy,
    merge_policy,
)


def test_shipped_policy_loads_with_the_documented_defaults() -> None:
    policy = load_policy()
    assert data_file("policy.yaml").is_file()
    assert policy.routing.defaults[Priority.P0] == ("feishu", "phone", "sheet")
    assert policy.routing.defaults[Priority.P1] == ("feishu", "sheet")
    assert policy.routing.defaults[Priority.P2] == ("feishu", "sheet")
    assert policy.routing.defaults[Priority.P3] == ("sheet",)
    assert policy.classification.severity["critical"] is Priority.P1
    assert {48, 63, 64, 74, 79, 92, 94, 95} <= set(policy.classification.xid)
    assert policy.dedup.flap_transitions >= 2


def test_policy_file_merges_over_the_default(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "storm": {"threshold": 7},
                "classification": {"xid": {79: {"name": "off the bus", "priority": "P1"}}},
                "routing": {"defaults": {"P3": ["email"]}},
            }
        )
    )
    policy = load_policy(path)
    assert policy.storm.threshold == 7
    assert policy.storm.window == 60  # untouched sibling keeps the default
    assert policy.classification.xid[79].priority is Priority.P1
    assert policy.classification.xid[48].priority is Priority.P0  # other codes kept
    assert policy.routing.defaults[Priority.P3] == ("email",)
    assert policy.routing.defaults[Priority.P0] == ("feishu", "phone", "sheet")


def test_overrides_apply_in_order_and_lists_replace() -> None:
    policy = load_policy(
        None,
        [
            {"storm": {"threshold": 5}, "routing": {"always": []}},
            {"storm": {"threshold": 9}},
            {"classification": {"alertname_rules": []}},
        ],
    )
    assert policy.storm.threshold == 9
    assert policy.routing.always == ()
    assert policy.classification.alertname_rules == ()


def test_string_xid_keys_override_int_keys() -> None:
    policy = merge_policy(load_policy(), {"classification": {"xid": {"74": {"priority": "P1"}}}})
    assert policy.classification.xid[74].priority is Priority.P1
    assert policy.classification.xid[74].name == "NVLink error"


def test_merge_policy_without_override_is_identity() -> None:
    base = load_policy()
    assert merge_policy(base, {}) is base
    assert merge_policy(base, {"dedup": {"flap_hold": 5}}).dedup.flap_hold == 5


def test_deep_merge() -> None:
    base: dict[str, Any] = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert deep_merge(base, {"a": {"c": [3]}, "e": 2}) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}  # not mutated


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"version": 2}, "unsupported policy version"),
        ({"storm": {"threshold": 0}}, "threshold"),
        ({"storm": {"treshold": 5}}, "treshold"),  # typos are errors, not silently ignored
        ({"dedup": {"flap_window": -1}}, "flap_window"),
        ({"classification": {"severity": {"warning": "P7"}}}, "severity"),
        (
            {
                "classification": {
                    "alertname_rules": [{"id": "x", "alertname": "(", "priority": "P1"}]
                }
            },
            "invalid regex",
        ),
        (
            {
                "classification": {
                    "alertname_rules": [
                        {"id": "x", "priority": "P1"},
                        {"id": "x", "priority": "P2"},
                    ]
                }
            },
            "duplicate rule ids",
        ),
        ({"routing": {"routes": [{"id": "r", "labels": {"a": "["}, "channels": ["x"]}]}}, "regex"),
        ({"routing": {"defaults": {"P9": ["x"]}}}, "P9"),
        ({"storm": {"list_url": "https://x/{jobs}"}}, "list_url"),
    ],
)
def test_invalid_policies_are_rejected_with_a_reason(
    override: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy(None, override)


def test_missing_route_default_is_rejected() -> None:
    raw = default_policy_raw()
    del raw["routing"]["defaults"]["P2"]
    from trainsentry.gateway.policy.rules import Policy

    with pytest.raises(ValueError, match="P2"):
        Policy.model_validate(raw)


def test_unreadable_or_malformed_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(PolicyError, match="mapping"):
        load_policy(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_policy(empty) == load_policy()


def test_xid_table_agrees_with_the_rules_catalogue() -> None:
    catalogue_path = rules_dir() / "xid_catalogue.yaml"
    if not catalogue_path.is_file():
        pytest.skip("rules/xid_catalogue.yaml not present")
    catalogue = yaml.safe_load(catalogue_path.read_text())["xid"]
    table = load_policy().classification.xid
    assert set(table) == {int(code) for code in catalogue}
    for code, entry in catalogue.items():
        assert table[int(code)].priority == Priority(entry["priority"]), f"XID {code}"
        assert table[int(code)].name == entry["name"], f"XID {code}"
        assert table[int(code)].resolution == entry["resolution"], f"XID {code}"


def test_every_xid_resolution_has_a_node_health_weight() -> None:
    """A bucket missing from `node_health.xid_buckets` would silently weigh 0."""
    policy = load_policy()
    buckets = {entry.resolution for entry in policy.classification.xid.values()}
    assert buckets <= set(policy.node_health.xid_buckets)
