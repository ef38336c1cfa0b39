"""The topology (gateway/policy/topology.py): config checked field by field, places read from
the config or from Node labels (attacker-controlled values dropped), and the payload a card
shows."""

from __future__ import annotations

import pytest

from trainsentry.config import ConfigError, load_settings, validate_settings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.policy.topology import (
    from_node_labels,
    from_settings,
    members,
)
from trainsentry.gateway.sections import build_topology
from trainsentry.notifiers.feishu.card import build_card

LEVELS = ["leaf_switch", "rack"]


def parse_settings(raw: dict) -> TopologySettings:  # type: ignore[type-arg]
    return validate_settings({"topology": raw}).topology


def test_static_places_follow_the_level_order() -> None:
    settings = parse_settings(
        {"levels": LEVELS, "nodes": {"gpu-node-0": {"rack": "r1", "leaf_switch": "leaf-7"}}}
    )
    topology = from_settings(settings)
    assert list(topology.place("gpu-node-0").items()) == [("leaf_switch", "leaf-7"), ("rack", "r1")]
    assert topology.place("elsewhere") == {} and topology.place("") == {}
    assert members(topology) == {"leaf_switch=leaf-7": ("gpu-node-0",), "rack=r1": ("gpu-node-0",)}


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"levels": LEVELS, "nodes": {"n0": {"leaf_swich": "x"}}}, "topology.nodes.n0.leaf_swich"),
        ({"levels": ["Leaf Switch"]}, "topology.levels"),
        ({"levels": ["rack", "rack"]}, "topology.levels"),
        ({"nodes": {"n0": {"rack": "r1"}}}, "topology.levels"),
        ({"levels": ["rack"], "kubernetes": True}, "topology.node_labels"),
        (
            {"levels": ["rack"], "node_labels": {"row": "example.com/row"}},
            "topology.node_labels.row",
        ),
        ({"levels": ["rack"], "node_labels": {"rack": "bad key!"}}, "topology.node_labels.rack"),
        ({"levels": ["rack"], "nodes": {"n0": {"rack": 5}}}, "topology.nodes.n0.rack"),
        ({"levels": ["rack"], "nodes": {"n0": {"rack": "r\n1"}}}, "topology.nodes.n0.rack"),
        ({"levels": ["rack"], "refresh_seconds": 1}, "topology.refresh_seconds"),
        ({"levels": ["rack"], "lvls": []}, "topology.lvls"),
    ],
)
def test_bad_topology_config_is_an_error_naming_the_field(raw: dict, names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw)
    assert names in str(caught.value)


def test_the_gateway_config_section_is_checked_when_loaded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config.yaml"
    config.write_text("topology:\n  levels: [leaf_switch]\n  nodes: {n0: {rack: r1}}\n")
    with pytest.raises(ConfigError, match=r"topology\.nodes\.n0\.rack"):
        load_settings(config, env={})
    config.write_text("topology: [leaf_switch]\n")
    with pytest.raises(ConfigError, match="topology"):
        load_settings(config, env={})
    assert build_topology(TopologySettings()) is None, "no levels, no topology"


def test_node_labels_give_places_and_bad_values_are_dropped() -> None:
    settings = parse_settings(
        {
            "levels": LEVELS,
            "kubernetes": True,
            "node_labels": {"leaf_switch": "example.com/leaf", "rack": "topology.example.com/rack"},
        }
    )
    topology = from_node_labels(
        settings,
        [
            ("n0", {"example.com/leaf": "leaf-7", "topology.example.com/rack": "r1"}),
            ("n1", {"example.com/leaf": "x" * 300, "topology.example.com/rack": "r1"}),
            ("n2", {"example.com/leaf": "bad\x00value"}),
            ("n3", {"unrelated": "yes"}),
        ],
    )
    assert topology.place("n0") == {"leaf_switch": "leaf-7", "rack": "r1"}
    assert topology.place("n1") == {"rack": "r1"}, "an over-long label value is dropped"
    assert topology.place("n2") == {} and topology.place("n3") == {}
    assert len(topology) == 2


def test_the_card_shows_the_place() -> None:
    payload = {
        "priority": "P1",
        "status": "firing",
        "alertname": "IBPortNotActive",
        "labels": {"node": "gpu-node-0"},
        "topology": {"leaf_switch": "leaf-7", "rack": "r1"},
    }
    card = build_card("alert", payload)  # type: ignore[arg-type]
    fields = [e["content"] for e in card["body"]["elements"] if "**Node:**" in e.get("content", "")]
    assert fields == ["**Node:** gpu-node-0\n**Place:** leaf_switch=leaf-7, rack=r1"]


def test_the_gateway_refuses_to_start_on_a_bad_topology(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.test_cli_errors import assert_usage_error, run_cli

    config = tmp_path / "config.yaml"
    config.write_text("topology:\n  levels: [leaf_switch]\n  nodes: {n0: {rack: r1}}\n")
    result = run_cli(
        tmp_path,
        "gateway",
        "--config",
        str(config),
        "--db",
        f"sqlite:///{tmp_path / 'gw.db'}",
        "--listen",
        "127.0.0.1:0",
    )
    assert_usage_error(result, "topology.nodes.n0.rack: not one of the levels")


def test_a_rail_optimized_fabric_places_each_hca_of_a_node() -> None:
    """Issue 44: on a rail-optimized fabric HCA k of every node is cabled to leaf k; an
    alert's `device` places it on its rail's leaf, the node's other levels kept."""
    rails = {"leaf_switch": {f"mlx5_{k}": f"leaf-{k}" for k in range(8)}}
    settings = parse_settings(
        {"levels": LEVELS, "nodes": {"n0": {"rack": "r1"}, "n1": {}}, "rails": rails}
    )
    topology = from_settings(settings)
    assert topology.place("n0", "mlx5_3") == {"leaf_switch": "leaf-3", "rack": "r1"}
    assert topology.place("n0") == {"rack": "r1"}, "a node-wide alert: no rail"
    assert topology.place("n0", "mlx5_9") == {"rack": "r1"} and topology.place("n1") == {}
    assert topology.place("n1", "mlx5_0") == {"leaf_switch": "leaf-0"}
    assert topology.place("n7", "mlx5_0") == {}, "a node the topology does not list"
    assert members(topology)["leaf_switch=leaf-3"] == ("n0", "n1")


def test_node_annotations_give_each_hca_its_leaf_and_bad_items_are_dropped() -> None:
    settings = parse_settings(
        {
            "levels": LEVELS,
            "kubernetes": True,
            "node_labels": {"rack": "topology.example.com/rack"},
            "rail_annotations": {"leaf_switch": "example.com/rail-leaves"},
        }
    )
    topology = from_node_labels(
        settings,
        [
            (
                "n0",
                {"topology.example.com/rack": "r1"},
                {"example.com/rail-leaves": "mlx5_0=su1-leaf-0, mlx5_1=su1-leaf-1,bad,=x"},
            ),
            ("n1", {}, {"example.com/rail-leaves": "mlx5_0=" + "x" * 300 + ",mlx5_1=su2-leaf-1"}),
        ],
    )
    assert topology.place("n0", "mlx5_1") == {"leaf_switch": "su1-leaf-1", "rack": "r1"}
    assert topology.place("n1", "mlx5_0") == {}, "an over-long element is dropped"
    assert topology.place("n1", "mlx5_1") == {"leaf_switch": "su2-leaf-1"}
    assert members(topology)["leaf_switch=su1-leaf-0"] == ("n0",)


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"levels": LEVELS, "rails": {"row": {"mlx5_0": "l0"}}}, "topology.rails.row"),
        ({"levels": LEVELS, "rails": {"leaf_switch": {"mlx5_0": "a\nb"}}},
         "topology.rails.leaf_switch.mlx5_0"),
        ({"levels": LEVELS, "rail_annotations": {"rack": "bad key!"}},
         "topology.rail_annotations.rack"),
    ],
)  # fmt: skip
def test_bad_rails_are_an_error_naming_the_field(raw: dict, names: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as caught:
        parse_settings(raw)
    assert names in str(caught.value)
