"""`GET /api/v1/nodes?sort=health|name&limit=N`: the nodes with their time-decayed hardware
fault score (gateway/policy/health.py), per GPU, and their place in the topology. Read
token, bounded parameters, 503 when the store is unavailable (read.py's guard).

Only trusted evidence is scored (tenancy.py: the chart's cluster-wide rules, no `namespace`
label), as for the cordon (policy/cordon.py): a team's own rules can raise hardware alerts
for any node, and a node's health is the cluster's, not one team's word."""

from __future__ import annotations

from datetime import timedelta

from aiohttp import web

from trainsentry.gateway.api.read import query_choice, query_int, read_guard
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.policy.health import NodeHealth, score_nodes
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.policy.tenancy import trusted
from trainsentry.gateway.policy.topology import Topology
from trainsentry.store.node_health import node_occurrences


async def ranked_nodes(gateway: Gateway) -> tuple[list[NodeHealth], Topology | None, Policy]:
    """The nodes sickest first (ties by name): those with a fault within the policy's
    horizon, then (with a topology) the placed nodes without one, healthy (score 0); the
    topology they were placed by and the policy that scored them. What `GET /api/v1/nodes`
    and the console's Nodes page show."""
    policy = gateway.policy
    now = gateway.clock()
    since = now - timedelta(seconds=policy.node_health.horizon)
    async with gateway.engine.connect() as conn:
        rows = await node_occurrences(conn, since)
    ranked = score_nodes((row.alert() for row in rows if trusted(row.labels)), policy, now)
    topology = gateway.topology.current()
    if topology is not None:  # placed nodes without a fault are healthy: score 0
        seen = {health.node for health in ranked}
        ranked += [NodeHealth(node) for node in sorted(topology.places) if node not in seen]
    return ranked, topology, policy


@read_guard
async def get_nodes(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    sort = query_choice(request, "sort", ("health", "name")) or "health"
    limit = query_int(request, "limit", 100, 1, 1000) or 100
    ranked, topology, policy = await ranked_nodes(gateway)
    if sort == "name":
        ranked.sort(key=lambda health: health.node)
    items = [
        health.to_json(topology.place(health.node) if topology is not None else None)
        for health in ranked[:limit]
    ]
    return web.json_response(
        {"items": items, "total": len(ranked), "half_life_s": policy.node_health.half_life}
    )
