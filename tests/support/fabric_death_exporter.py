"""Stand-in exporters for issue 44's dead leaf switch (tests/support/fabric_death.py drives
them): node_death_exporter's world (dcgm-exporter, node_exporter, kube-state-metrics, the
probes of a 12-node x 8-GPU TrainingJob), with no node dying and every GPU healthy, where
at t0 the leaf switch under the first 8 nodes dies:

- node_exporter (its infiniband collector's names and labels): each of those nodes' 8 HCA
  ports goes Down (`node_infiniband_state_id` 1, `node_infiniband_physical_state_id` 2,
  Polling) and its `node_infiniband_link_downed_total` counts one more;
- the job's ranks wait in their collective (no rank is missing: all of them have it in
  flight), and from `ras_error_after` NCCL RAS reports the communicator in error;
- every node stays Ready; the other leaf's nodes are untouched, and so is a job with no
  node under the dead switch (its scenario's `xid_at` is null: its ranks never wait).

Run from the repository root as `python -m tests.support.fabric_death_exporter --port N
--scenario FILE` (the scenario as node_death_exporter.Scenario's JSON, plus `dead_leaf`,
the nodes under the dead switch, `devices`, their HCAs cabled to it (default: all 8; on a
rail-optimized fabric one), and `ras_error_after`).
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from aiohttp import web

from tests.support import node_death_exporter
from tests.support.node_death_exporter import Scenario, World, make_app

HCAS = tuple((f"mlx5_{k}", "1") for k in range(8))
node_death_exporter.IB_PORTS = HCAS  # 8 HCAs per node (one per GPU), as a DGX H100


class LeafWorld(World):
    def __init__(
        self,
        scenario: Scenario,
        dead_leaf: list[str],
        ras_error_after: float,
        devices: list[str] | None = None,
    ) -> None:
        super().__init__(scenario)
        self.dead_leaf = set(dead_leaf)
        self.ras_error_after = ras_error_after
        # the HCAs cabled to the dead leaf (a rail-optimized fabric: one per node)
        self.devices = "|".join(re.escape(d) for d in devices or [d for d, _ in HCAS])

    def leaf_down(self, node: str) -> bool:
        return node in self.dead_leaf and self.clock.between(self.s.xid_at, None)

    def node_exporter(self, node: str) -> str:
        page = super().node_exporter(node)
        if not self.leaf_down(node):
            return page
        for name, value in (
            ("node_infiniband_state_id", "1"),
            ("node_infiniband_physical_state_id", "2"),
            ("node_infiniband_link_downed_total", "1"),
        ):
            series = rf"{name}\{{[^}}]*device=\"(?:{self.devices})\"[^}}]*\}}"
            page = re.sub(rf"^({series}) \S+$", rf"\g<1> {value}", page, flags=re.M)
        return page

    def probe(self, node: str, local_rank: int) -> str:
        page = super().probe(node, local_rank)
        if self.s.xid_at is None:  # a job under no dead switch: it trains on
            return page
        if self.clock.between(self.s.xid_at + self.ras_error_after, None):
            name = "trainsentry_probe_ras_error_communicators"
            page = re.sub(rf"^({name}\{{[^}}]*\}}) \S+$", r"\g<1> 1", page, flags=re.M)
        return page


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--scenario", required=True)
    args = parser.parse_args()
    with open(args.scenario, encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    dead_leaf, ras_error_after = data.pop("dead_leaf"), data.pop("ras_error_after")
    devices = data.pop("devices", None)
    world = LeafWorld(Scenario.load(data), dead_leaf, ras_error_after, devices)
    app: web.Application = make_app(world)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
