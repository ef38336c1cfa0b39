"""The `topology:` section: where each node stands (gateway/policy/topology.py, filled by
gateway/stages/services/topology.py from this list or from the Node objects' labels).

Invariants: level names are short identifiers, named once, in order (most specific first);
every node and label key refers to a configured level; node and element names are bounded,
printable text; a topology comes from the list or the cluster, never both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainsentry.config.problems import SectionProblems

# Kubernetes object names are at most 253 characters; label values at most 63.
MAX_NODE_NAME = 253
MAX_ELEMENT = 253
MAX_LEVELS = 8
MAX_NODES = 100_000
MAX_DEVICE = 64  # an HCA's device name (mlx5_0, ibp12s0)
MAX_RAILS = 64  # HCAs per node placed on rails
_LEVEL_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
# A label key: an optional DNS prefix and a name (Kubernetes' own shape, bounded).
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


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
    # A rail-optimized fabric: level -> HCA device -> element. HCA k of every node listed
    # (or read from the cluster) is cabled to that element (e.g. leaf_switch: {mlx5_3:
    # leaf-3}); an alert naming the device is placed there (gateway/policy/topology.py).
    rails: dict[str, dict[str, str]] = Field(default_factory=dict)
    # With a cluster: level -> the Node annotation key whose value maps each HCA to its
    # element there ("mlx5_0=su1-leaf-0,mlx5_1=su1-leaf-1"): rails that differ per node.
    rail_annotations: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> TopologySettings:
        problems = list(_problems(self))
        if problems:
            raise SectionProblems(problems)
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.levels)


def _problems(settings: TopologySettings) -> Iterable[tuple[str, str]]:
    """Pure: (path below `topology`, why) of each inconsistency."""
    levels = settings.levels
    if len(levels) > MAX_LEVELS:
        yield "levels", f"at most {MAX_LEVELS} levels"
    for name in levels:
        if not _LEVEL_NAME.fullmatch(name):
            yield "levels", f"{name!r} is not a level name (lowercase letters, digits, _)"
    if len(set(levels)) != len(levels):
        yield "levels", "a level is named twice"
    if not levels and (
        settings.nodes or settings.node_labels or settings.kubernetes or settings.rails
    ):
        yield "levels", "name the levels (e.g. [leaf_switch, rack]) before nodes or node_labels"
    if len(settings.nodes) > MAX_NODES:
        yield "nodes", f"at most {MAX_NODES} nodes"
    for node, place in settings.nodes.items():
        if not printable(node, MAX_NODE_NAME):
            yield "nodes", f"{node[:80]!r} is not a node name"
        for level, element in place.items():
            if level not in levels:
                yield f"nodes.{node}.{level}", f"not one of the levels {list(levels)}"
            elif not isinstance(element, str) or not printable(element, MAX_ELEMENT):
                yield f"nodes.{node}.{level}", "the element must be a printable name"
    for level, key in settings.node_labels.items():
        if level not in levels:
            yield f"node_labels.{level}", f"not one of the levels {list(levels)}"
        elif not _LABEL_KEY.fullmatch(key):
            yield f"node_labels.{level}", f"{key[:80]!r} is not a label key"
    for level, devices in settings.rails.items():
        if level not in levels:
            yield f"rails.{level}", f"not one of the levels {list(levels)}"
            continue
        if len(devices) > MAX_RAILS:
            yield f"rails.{level}", f"at most {MAX_RAILS} devices"
        for device, element in devices.items():
            if not printable(device, MAX_DEVICE):
                yield f"rails.{level}", f"{device[:80]!r} is not a device name"
            elif not isinstance(element, str) or not printable(element, MAX_ELEMENT):
                yield f"rails.{level}.{device}", "the element must be a printable name"
    for level, key in settings.rail_annotations.items():
        if level not in levels:
            yield f"rail_annotations.{level}", f"not one of the levels {list(levels)}"
        elif not _LABEL_KEY.fullmatch(key):
            yield f"rail_annotations.{level}", f"{key[:80]!r} is not an annotation key"
    if settings.kubernetes and not (settings.node_labels or settings.rail_annotations):
        yield "node_labels", "kubernetes: true needs the label key of at least one level"
    if settings.kubernetes and settings.nodes:
        yield "nodes", "give either nodes (static) or kubernetes: true, not both"
