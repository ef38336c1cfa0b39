"""Where each node stands: its topology element at each configured level (pure).

A topology has ordered level names (most specific first, e.g. `[leaf_switch, rack]`) and,
per node, the element it sits under at each level (`{leaf_switch: leaf-7, rack: r1}`). It
comes from the gateway config's `topology:` section: either listed there (`nodes:`), or read
from the Kubernetes Node objects' labels (`kubernetes: true`, `node_labels:` maps each level
to a label key; gateway/stages/topology.py reads them).

Invariants: a place only ever names configured levels, in the configured order; node names,
level names and element names are bounded in length (node labels are attacker-controlled:
a value that is too long or not printable is dropped, never stored or shown); a node the
topology does not know has no place (`{}`), which changes nothing downstream.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# Kubernetes object names are at most 253 characters; label values at most 63.
MAX_NODE_NAME = 253
MAX_ELEMENT = 253
MAX_LEVELS = 8
MAX_NODES = 100_000
_LEVEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# A label key: an optional DNS prefix and a name (Kubernetes' own shape, bounded).
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


class TopologyError(ValueError):
    """The `topology:` config section is invalid; the message names the field."""


def printable(value: str, limit: int) -> bool:
    """Pure: a value fit to store and show (non-empty, bounded, printable, no surrogates)."""
    return (
        0 < len(value) <= limit
        and value.isprintable()
        and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)
    )


class TopologySettings(BaseModel):
    """The `topology:` section of the gateway config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Level names, most specific first (an infrastructure incident is looked for at each,
    # in this order).
    levels: tuple[str, ...] = ()
    # Without a cluster: node name -> {level: element}.
    nodes: dict[str, dict[str, str]] = Field(default_factory=dict)
    # With a cluster: read the Node objects' labels (RBAC: list nodes).
    kubernetes: bool = False
    # level -> the Node label key holding its element (e.g. rack: example.com/rack).
    node_labels: dict[str, str] = Field(default_factory=dict)
    refresh_seconds: float = Field(default=300.0, ge=10, le=86400)

    @model_validator(mode="after")
    def _consistent(self) -> TopologySettings:
        for problem in _problems(self):
            raise ValueError(problem)
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.levels)


def _problems(settings: TopologySettings) -> Iterable[str]:
    levels = settings.levels
    if len(levels) > MAX_LEVELS:
        yield f"levels: at most {MAX_LEVELS} levels"
    for name in levels:
        if not _LEVEL_NAME.fullmatch(name):
            yield f"levels: {name!r} is not a level name (lowercase letters, digits, _)"
    if len(set(levels)) != len(levels):
        yield "levels: a level is named twice"
    if not levels and (settings.nodes or settings.node_labels or settings.kubernetes):
        yield "levels: name the levels (e.g. [leaf_switch, rack]) before nodes or node_labels"
    if len(settings.nodes) > MAX_NODES:
        yield f"nodes: at most {MAX_NODES} nodes"
    for node, place in settings.nodes.items():
        if not printable(node, MAX_NODE_NAME):
            yield f"nodes: {node[:80]!r} is not a node name"
        for level, element in place.items():
            if level not in levels:
                yield f"nodes.{node}.{level}: not one of the levels {list(levels)}"
            elif not isinstance(element, str) or not printable(element, MAX_ELEMENT):
                yield f"nodes.{node}.{level}: the element must be a printable name"
    for level, key in settings.node_labels.items():
        if level not in levels:
            yield f"node_labels.{level}: not one of the levels {list(levels)}"
        elif not _LABEL_KEY.fullmatch(key):
            yield f"node_labels.{level}: {key[:80]!r} is not a label key"
    if settings.kubernetes and not settings.node_labels:
        yield "node_labels: kubernetes: true needs the label key of at least one level"
    if settings.kubernetes and settings.nodes:
        yield "nodes: give either nodes (static) or kubernetes: true, not both"


def parse_settings(raw: Mapping[str, Any] | None) -> TopologySettings:
    """Pure: the `topology:` section checked; TopologyError names the field at fault."""
    try:
        return TopologySettings.model_validate(dict(raw or {}))
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False, include_context=False):
            where = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"topology.{where}: {message}" if where else f"topology.{message}")
        raise TopologyError("; ".join(problems)) from None


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
