"""The policy's regular expressions (routes, alertname and hardware rules, node-health faults,
infrastructure's ignored alertnames) run with RE2 (trainsentry/userregex.py): a backtracking
shape and a crafted label take microseconds, not the seconds Python's `re` took (issue 32
finding 2: `([a-z0-9-]+)+-17` took 12 s on an 18-character label); a pattern RE2 cannot
compile is a PolicyError naming where it is."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.gateway.policy.factory import make_alert
from trainsentry.alerts import Priority
from trainsentry.gateway.policy.classify import classify
from trainsentry.gateway.policy.health import fault_of
from trainsentry.gateway.policy.infra import hardware_component
from trainsentry.gateway.policy.route import route
from trainsentry.gateway.policy.rules import PolicyError, load_policy

CRAFTED = "a" * 26 + "!"


def quick(call: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = call()
    assert time.perf_counter() - started < 0.5  # RE2: microseconds; Python's re: seconds
    return result


def test_a_route_regex_meets_the_issues_label() -> None:
    policy = load_policy(
        None,
        {"routing": {"routes": [{"id": "n17", "labels": {"node": "([a-z0-9-]+)+-17"},
                                 "channels": ["ops"]}]}},
    )  # fmt: skip
    decision = quick(lambda: route(Priority.P1, {"node": "a" * 18}, policy))
    assert decision.route_id == "default:P1"
    assert route(Priority.P1, {"node": "rack-3-gpu-17"}, policy).route_id == "route:n17"


def test_alertname_and_hardware_rules() -> None:
    policy = load_policy(
        None,
        {"classification": {
            "alertname_rules": [{"id": "slow", "alertname": "(a+)+", "priority": "P0"}],
            "hardware_rules": [{"id": "hw", "labels": {"gpu": "(a|aa)+"}, "priority": "P0"}],
        }},
    )  # fmt: skip
    alert = make_alert({"alertname": CRAFTED, "gpu": "a" * 40 + "!", "severity": "info"})
    result = quick(lambda: classify(alert, policy, distinct_nodes_in_window=1))
    assert result.priority != Priority.P0
    assert classify(
        make_alert({"alertname": "aaa"}), policy, distinct_nodes_in_window=1
    ).priority == (Priority.P0)


def test_node_health_faults_and_infrastructure_ignores() -> None:
    policy = load_policy(
        None,
        {
            "node_health": {"faults": [{"kind": "slow", "alertname": "(a+)+", "weight": 1}]},
            "infrastructure": {"ignore_alertnames": "(a+)+"},
        },
    )
    alert = make_alert({"alertname": CRAFTED, "component": "gpu"})
    assert quick(lambda: fault_of(alert, policy)) is None
    assert quick(lambda: hardware_component(alert, policy)) == "gpu"
    assert hardware_component(make_alert({"alertname": "aa", "component": "gpu"}), policy) == ""


@pytest.mark.parametrize(
    ("override", "where", "why"),
    [
        ({"routing": {"routes": [
            {"id": "r", "labels": {"node": "gpu-(?!17)"}, "channels": ["x"]}]}},
         "routing.routes.0.labels", "RE2 syntax"),
        ({"classification": {"alertname_rules": [
            {"id": "x", "alertname": "(a)\\1", "priority": "P1"}]}},
         "classification.alertname_rules.0.alertname", "RE2 syntax"),
        ({"classification": {"hardware_rules": [
            {"id": "x", "alertname": "x" * 1001, "priority": "P1"}]}},
         "classification.hardware_rules.0.alertname", "longer than 1000 characters"),
        ({"infrastructure": {"ignore_alertnames": "Node.{0,500}"}},
         "infrastructure.ignore_alertnames", "too large"),
        ({"node_health": {"faults": [{"kind": "k", "alertname": "(?<=x)y", "weight": 1}]}},
         "node_health.faults.0.alertname", "RE2 syntax"),
    ],
)  # fmt: skip
def test_a_pattern_re2_refuses_names_its_place(
    override: dict[str, Any], where: str, why: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(None, override)
    assert where in str(caught.value) and why in str(caught.value)
