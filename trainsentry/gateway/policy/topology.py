"""Where each node stands: its topology element at each configured level (pure).

A topology has ordered level names (most specific first, e.g. `[leaf_switch, rack]`) and,
per node, the element it sits under at each level (`{leaf_switch: leaf-7, rack: r1}`). It
comes from the gateway config's `topology:` section (config/topology.py, checked when the
settings load): either listed there (`nodes:`), or read from the Kubernetes Node objects'
labels (`kubernetes: true`, `node_labels:` maps each level to a label key;
gateway/stages/services/topology.py reads them).

Invariants: a place only ever names configured levels, in the configured order; node names,
level names and element names are bounded in length (node labels are attacker-controlled:
a value that is too long or not printable is dropped, never stored or shown); a node the
topology does not know has no place (`{}`), which changes nothing downstream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trainsentry.alerts import Alert
from trainsentry.config.topology import (
    MAX_DEVICE,
    MAX_ELEMENT,
    MAX_NODE_NAME,
    MAX_NODES,
    MAX_RAILS,
    TopologySettings,
    printable,
)
from trainsentry.labels import hca_port

Place = Mapping[str, str]
# A Node object as read: (name, labels) or (name, labels, annotations).
NodeObject = tuple[str, Mapping[str, str]] | tuple[str, Mapping[str, str], Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class Topology:
    """Node -> place, for the configured levels; on a rail-optimized fabric also where each
    HCA of a node is cabled: `rails` (level -> device -> element, the same for every node
    known) and `devices` (node -> device -> {level: element}, read per node)."""

    levels: tuple[str, ...] = ()
    places: Mapping[str, Place] = field(default_factory=dict)
    rails: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    devices: Mapping[str, Mapping[str, Place]] = field(default_factory=dict)

    def place(self, node: str, device: str = "") -> dict[str, str]:
        """The node's element at each level it has one, in level order ({} if unknown); for
        an alert about one of its HCAs (`device`), that HCA's rail overrides the node's."""
        if not node or (node not in self.places and node not in self.devices):
            return {}
        merged = dict(self.places.get(node) or {})
        if device:
            for level, by_device in self.rails.items():
                if device in by_device:
                    merged[level] = by_device[device]
            merged.update(self.devices.get(node, {}).get(device) or {})
        return {level: merged[level] for level in self.levels if level in merged}

    def nodes(self) -> set[str]:
        return set(self.places) | set(self.devices)

    def __len__(self) -> int:
        return len(self.nodes())


def from_settings(settings: TopologySettings) -> Topology:
    """Pure: the static topology listed in the config (empty when read from Kubernetes);
    with `rails`, a node listed with an empty place is known too (its HCAs have one)."""
    return Topology(
        levels=settings.levels,
        places={
            node: dict(place) for node, place in settings.nodes.items() if place or settings.rails
        },
        rails={level: dict(devices) for level, devices in settings.rails.items()},
    )


def rail_items(value: str) -> dict[str, str]:
    """Pure: "mlx5_0=leaf-0,mlx5_1=leaf-1" as {device: element}; an item that is not
    `device=element` with printable, bounded names is dropped (annotations are
    attacker-controlled), at most MAX_RAILS kept."""
    found: dict[str, str] = {}
    for item in value.split(",")[: 4 * MAX_RAILS]:
        device, sep, element = (part.strip() for part in item.partition("="))
        fit = printable(device, MAX_DEVICE) and printable(element, MAX_ELEMENT)
        if sep and fit and len(found) < MAX_RAILS:
            found[device] = element
    return found


def from_node_labels(
    settings: TopologySettings,
    nodes: Iterable[
        tuple[str, Mapping[str, str]] | tuple[str, Mapping[str, str], Mapping[str, str]]
    ],
) -> Topology:
    """Pure: the topology of Node objects given as (name, labels[, annotations]). A label
    value that is not a printable name of at most MAX_ELEMENT characters is skipped (labels
    are attacker-controlled), as is a rail annotation's bad item (`rail_items`); at most
    MAX_NODES nodes are kept."""
    places: dict[str, dict[str, str]] = {}
    devices: dict[str, dict[str, dict[str, str]]] = {}
    kept = 0
    for name, labels, *rest in nodes:
        if kept >= MAX_NODES:
            break
        if not isinstance(name, str) or not printable(name, MAX_NODE_NAME):
            continue
        place = {}
        for level in settings.levels:
            key = settings.node_labels.get(level)
            value = labels.get(key) if key else None
            if isinstance(value, str) and printable(value, MAX_ELEMENT):
                place[level] = value
        annotations = rest[0] if rest else {}
        hcas: dict[str, dict[str, str]] = {}
        for level, key in settings.rail_annotations.items():
            value = annotations.get(key)
            if isinstance(value, str) and len(value) <= 64 * MAX_ELEMENT:
                for device, element in rail_items(value).items():
                    hcas.setdefault(device, {})[level] = element
        if place:
            places[name] = place
        if hcas:
            devices[name] = hcas
        kept += bool(place or hcas)
    return Topology(
        levels=settings.levels,
        places=places,
        rails={level: dict(d) for level, d in settings.rails.items()},
        devices=devices,
    )


def place_of(topology: Topology, alert: Alert) -> dict[str, str]:
    """Pure: the place of what an alert is about: its node's, or, for an alert about an
    HCA's port (`labels.hca_port`: `device` and `port`), that HCA's on its rail."""
    device = alert.labels.get("device", "") if hca_port(alert.labels) else ""
    return topology.place(alert.node, device)


def members(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Pure: per element key (`level=element`), the nodes under it (a rail's leaf: the
    nodes with an HCA cabled to it), sorted."""
    found: dict[str, set[str]] = {}
    rail_keys = [f"{lv}={el}" for lv, by in topology.rails.items() for el in set(by.values())]
    for node in topology.nodes():
        place = topology.places.get(node) or {}
        keys = [f"{level}={place[level]}" for level in topology.levels if level in place]
        keys += rail_keys
        for hca in (topology.devices.get(node) or {}).values():
            keys += [f"{level}={element}" for level, element in hca.items()]
        for key in keys:
            found.setdefault(key, set()).add(node)
    return {key: tuple(sorted(nodes)) for key, nodes in found.items()}
