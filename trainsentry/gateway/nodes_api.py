"""`GET /api/v1/nodes?sort=health|name&limit=N`: the nodes with their time-decayed hardware
fault score (gateway/policy/health.py), per GPU, and their place in the topology. Read
token, bounded parameters, 503 when the store is unavailable (read_api.py's guard)."""

from __future__ import annotations

from datetime import timedelta

from aiohttp import web

from trainsentry.alerts import Alert, AlertStatus
from trainsentry.gateway.pipeline import GATEWAY_KEY
from trainsentry.gateway.policy.health import NodeHealth, score_nodes
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.read_api import query_choice, query_int, read_guard
from trainsentry.store.node_health import node_occurrences


@read_guard
async def get_nodes(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    sort = query_choice(request, "sort", ("health", "name")) or "health"
    limit = query_int(request, "limit", 100, 1, 1000) or 100
    policy = gateway.policy or load_policy(gateway.settings.policy_file)
    now = gateway.clock()
    since = now - timedelta(seconds=policy.node_health.horizon)
    async with gateway.engine.connect() as conn:
        rows = await node_occurrences(conn, since)
    occurrences = (
        Alert(row.fingerprint, AlertStatus.FIRING, row.labels, row.annotations, row.starts_at, None)
        for row in rows
    )
    ranked = score_nodes(occurrences, policy, now)
    topology = gateway.topology.current() if gateway.topology is not None else None
    if topology is not None:  # placed nodes without a fault are healthy: score 0
        seen = {health.node for health in ranked}
        ranked += [NodeHealth(node) for node in sorted(topology.places) if node not in seen]
    if sort == "name":
        ranked.sort(key=lambda health: health.node)
    items = [
        health.to_json(topology.place(health.node) if topology is not None else None)
        for health in ranked[:limit]
    ]
    return web.json_response(
        {"items": items, "total": len(ranked), "half_life_s": policy.node_health.half_life}
    )
