"""Where each node stands: its topology element at each configured level (pure).

A topology has ordered level names (most specific first, e.g. `[leaf_switch, rack]`) and,
per node, the element it sits under at each level (`{leaf_switch: leaf-7, rack: r1}`). It
comes from the gateway config's `topology:` section (config/topology.py, checked when the
settings load): either listed there (`nodes:`), or read from the Kubernetes Node objects'
labels (`kubernetes: true`, `node_labels:` maps each level to a label key;
gateway/stages/topology.py reads them).

Invariants: a place only ever names configured levels, in the configured order; node names,
level names and element names are bounded in length (node labels are attacker-controlled:
a value that is too long or not printable is dropped, never stored or shown); a node the
topology does not know has no place (`{}`), which changes nothing downstream.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trainsentry.config.topology import (
    MAX_ELEMENT,
    MAX_NODE_NAME,
    MAX_NODES,
    TopologySettings,
    printable,
)

Place = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Topology:
    """Node -> place, for the configured levels."""

    levels: tuple[str, ...] = ()
    places: Mapping[str, Place] = field(default_factory=dict)

    def place(self, node: str) -> dict[str, str]:
        """The node's element at each level it has one, in level order ({} if unknown)."""
        found = self.places.get(node) if node else None
        if not found:
            return {}
        return {level: found[level] for level in self.levels if level in found}

    def __len__(self) -> int:
        return len(self.places)


def from_settings(settings: TopologySettings) -> Topology:
    """Pure: the static topology listed in the config (empty when read from Kubernetes)."""
    return Topology(
        levels=settings.levels,
        places={node: dict(place) for node, place in settings.nodes.items() if place},
    )


def from_node_labels(
    settings: TopologySettings, nodes: Iterable[tuple[str, Mapping[str, str]]]
) -> Topology:
    """Pure: the topology of Node objects given as (name, labels). A label value that is not
    a printable name of at most MAX_ELEMENT characters is skipped (labels are
    attacker-controlled); at most MAX_NODES nodes are kept."""
    places: dict[str, dict[str, str]] = {}
    for name, labels in nodes:
        if len(places) >= MAX_NODES:
            break
        if not isinstance(name, str) or not printable(name, MAX_NODE_NAME):
            continue
        place = {}
        for level in settings.levels:
            key = settings.node_labels.get(level)
            value = labels.get(key) if key else None
            if isinstance(value, str) and printable(value, MAX_ELEMENT):
                place[level] = value
        if place:
            places[name] = place
    return Topology(levels=settings.levels, places=places)


def place_text(place: Place) -> str:
    """Pure: `leaf_switch=leaf-7, rack=r1` (for cards and logs)."""
    return ", ".join(f"{level}={element}" for level, element in place.items())


def members(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Pure: per element key (`level=element`), the nodes under it, sorted."""
    found: dict[str, list[str]] = {}
    for node, place in topology.places.items():
        for level in topology.levels:
            if level in place:
                found.setdefault(f"{level}={place[level]}", []).append(node)
    return {key: tuple(sorted(nodes)) for key, nodes in found.items()}
