"""The NetworkPolicy evaluator (`netpol.py`) against the examples and sentences of
kubernetes.io's "Network Policies" page, before it judges the chart's policies."""

from __future__ import annotations

from typing import Any

import pytest

from chart.netpol import Pod, allowed


def policy(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": spec,
    }


# The page's `test-network-policy` (ingress part): TCP 6379 of role=db pods in `default` from
# role=frontend pods of `default`, any pod of a project=myproject namespace, and 172.17.0.0/16
# except 172.17.1.0/24.
DOCS_EXAMPLE = policy(
    "default",
    {
        "podSelector": {"matchLabels": {"role": "db"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {"ipBlock": {"cidr": "172.17.0.0/16", "except": ["172.17.1.0/24"]}},
                    {"namespaceSelector": {"matchLabels": {"project": "myproject"}}},
                    {"podSelector": {"matchLabels": {"role": "frontend"}}},
                ],
                "ports": [{"protocol": "TCP", "port": 6379}],
            }
        ],
    },
)
DB = Pod("default", {"role": "db"})


@pytest.mark.parametrize(
    ("source", "port", "expected"),
    [
        (Pod("default", {"role": "frontend"}), 6379, True),
        (Pod("default", {"role": "frontend"}), 6380, False),  # another port
        (Pod("other", {"role": "frontend"}), 6379, False),  # a podSelector alone: own namespace
        (Pod("team", {}, {"project": "myproject"}), 6379, True),  # any pod of that namespace
        (Pod("team", {}, {"project": "theirs"}), 6379, False),
        (Pod("outside", ip="172.17.0.5"), 6379, True),
        (Pod("outside", ip="172.17.1.5"), 6379, False),  # the `except`
        (Pod("outside", ip="172.17.2.1"), 6379, True),
        (Pod("outside", ip="10.0.0.1"), 6379, False),
    ],
)
def test_the_pages_example_policy(source: Pod, port: int, expected: bool) -> None:
    assert allowed([DOCS_EXAMPLE], source, DB, port) is expected


def test_a_pod_no_policy_selects_takes_everything() -> None:
    assert allowed([DOCS_EXAMPLE], Pod("x"), Pod("default", {"role": "web"}), 1)
    assert allowed([DOCS_EXAMPLE], Pod("x"), Pod("elsewhere", {"role": "db"}), 6379)


def test_namespace_and_pod_selector_in_one_peer_is_and_in_two_peers_or() -> None:
    both = policy("default", {"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"user": "alice"}},
         "podSelector": {"matchLabels": {"role": "client"}}}]}]})  # fmt: skip
    either = policy("default", {"podSelector": {}, "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"user": "alice"}}},
        {"podSelector": {"matchLabels": {"role": "client"}}}]}]})  # fmt: skip
    dest = Pod("default", {"app": "x"})
    alice_client = Pod("a", {"role": "client"}, {"user": "alice"})
    alice_other = Pod("a", {"role": "other"}, {"user": "alice"})
    local_client = Pod("default", {"role": "client"})
    assert allowed([both], alice_client, dest, 80)
    assert not allowed([both], alice_other, dest, 80)
    assert not allowed([both], local_client, dest, 80)
    assert allowed([either], alice_other, dest, 80) and allowed([either], local_client, dest, 80)


def test_default_deny_allow_all_and_additive_policies() -> None:
    deny = policy("default", {"podSelector": {}, "policyTypes": ["Ingress"]})
    allow_all = policy("default", {"podSelector": {}, "ingress": [{}]})
    dest, source = Pod("default", {"a": "b"}), Pod("x")
    assert not allowed([deny], source, dest, 80)
    assert allowed([allow_all], source, dest, 80)
    assert allowed([deny, allow_all], source, dest, 80)  # policies add up
    egress_only = policy("default", {"podSelector": {}, "policyTypes": ["Egress"]})
    assert allowed([egress_only], source, dest, 80)  # does not isolate for ingress


def test_port_ranges_named_ports_and_protocols() -> None:
    ranged = policy("default", {"podSelector": {}, "ingress": [
        {"ports": [{"protocol": "TCP", "port": 32000, "endPort": 32768}]}]})  # fmt: skip
    named = policy("default", {"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]})
    dest = Pod("default", named_ports={"http": (9095, "TCP")})
    assert allowed([ranged], Pod("x"), dest, 32768)
    assert not allowed([ranged], Pod("x"), dest, 32769)
    assert not allowed([ranged], Pod("x"), dest, 32000, "UDP")
    assert allowed([named], Pod("x"), dest, 9095)
    assert not allowed([named], Pod("x"), dest, 9096)
    assert not allowed([named], Pod("x"), Pod("default"), 9095)  # no such named port
