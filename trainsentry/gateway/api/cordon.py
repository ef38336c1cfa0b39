"""Cordon with a human in the loop, over HTTP (stages/services/cordon.py does the work):

- the cordon card's Approve / Dismiss buttons arrive through the signed Feishu card
  callback (app.py `card_ack` → `card_cordon`); a replayed event id is acted on once; a
  press by anyone not in `remediation.approvers` is refused (toast) and changes nothing;
- `POST /api/v1/nodes/{node}/uncordon {"by": WHO}`: the node schedulable again (API token, or
  an admin signed in through the trusted proxy: a node is the cluster's, gateway/access.py;
  logged with who asked and how they signed in: the audit line `event=node_uncordoned`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from aiohttp import web

from trainsentry.gateway.absent import Off
from trainsentry.gateway.acting import api_actor, named, node_target, refusal
from trainsentry.gateway.api.auth import error_response
from trainsentry.gateway.api.request_body import BodyRejected, read_json
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.policy.cordon import NodeDecision
from trainsentry.gateway.policy.cordon_cards import entry, payload
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.kube.names import subdomain_problems
from trainsentry.notifiers.feishu.callback import CardAction
from trainsentry.notifiers.feishu.card import CardOptions, cordon_card
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.store.callbacks import first_delivery, forget_delivery
from trainsentry.store.errors import STORE_FAILURES

log = logging.getLogger("trainsentry.gateway")

MAX_BODY_BYTES = 4096


async def card_cordon(gateway: Gateway, action: CardAction) -> dict[str, Any]:
    """Approve / Dismiss pressed on a cordon card."""
    stage = gateway.cordon
    if isinstance(stage, Off) or action.node is None:
        return {"toast": {"type": "error", "content": "cordon is off on this gateway"}}
    event_id = action.event_id
    try:
        if event_id is not None:
            async with gateway.engine.begin() as conn:
                first = await first_delivery(conn, event_id, gateway.clock())
            if not first:
                return {"toast": {"type": "info", "content": "already handled"}}
        try:
            outcome = await stage.decide(action.node, action.action == "cordon_approve", action.who)
        except Exception:
            if event_id is not None:
                async with gateway.engine.begin() as conn:
                    await forget_delivery(conn, event_id)
            raise
    except STORE_FAILURES as exc:
        log.warning("cordon action: store unavailable (%s)", type(exc).__name__)
        return {"toast": {"type": "error", "content": "store unavailable, press again"}}
    log.info(
        "event=cordon_decision node=%s action=%s who=%s ok=%s",
        action.node, action.action, action.who, outcome.ok,
    )  # fmt: skip
    kind = "success" if outcome.ok else "error"
    answer: dict[str, Any] = {"toast": {"type": kind, "content": outcome.message[:500]}}
    if outcome.card:  # the card redrawn in place: who decided; buttons for the nodes left
        data = decided_card(outcome.card, bool(stage.settings.approvers), gateway.clock())
        answer["card"] = {"type": "raw", "data": data}
    return answer


def decided_card(
    card: Mapping[str, NodeDecision], approvable: bool, now: datetime
) -> dict[str, Any]:
    """The cordon card after a press: each node's status and who decided it, and the
    buttons of the nodes still recommended."""
    entries = [entry(node, decision) for node, decision in card.items()]
    incident = ""  # the redraw keeps the nodes; the incident line is the sent card's
    body = parse_payload(payload(entries, incident, approvable, now))
    return cordon_card(body, CardOptions(actions=True))


async def post_uncordon(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    token = gateway.settings.api_token
    if token is None:
        return error_response(403, "uncordon needs TRAINSENTRY_API_TOKEN on the gateway")
    actor = api_actor(request, gateway, token)
    if isinstance(actor, web.Response):
        return actor
    node = request.match_info["node"]
    if subdomain_problems(node):  # Kubernetes' rule for a node's name
        return error_response(400, "the node is not a node name")
    cordon = gateway.cordon
    if isinstance(cordon, Off):
        return error_response(409, "remediation.cordon is off on this gateway")
    try:
        body = await read_json(request, MAX_BODY_BYTES)
    except BodyRejected as exc:
        return error_response(exc.status, exc.reason)
    if actor.via == "api-token":
        who = body.get("by") if isinstance(body, dict) else None
        if not isinstance(who, str) or not who.strip() or len(who) > 200:
            return error_response(400, "'by' (who uncordons) is required, up to 200 characters")
        if (problem := text_problem(who)) is not None:
            return error_response(400, f"'by': {problem}")
        actor = named(actor, who.strip())
    if (refused := refusal(gateway, actor, node_target(node))) is not None:
        return refused
    try:
        outcome = await cordon.uncordon(node, actor.audit_name)
    except STORE_FAILURES as exc:
        return error_response(503, f"store unavailable, retry: {type(exc).__name__}")
    log.info(
        "event=node_uncordoned node=%s by=%s via=%s ok=%s", node, actor.name, actor.via, outcome.ok
    )
    if not outcome.ok:
        return error_response(409, outcome.message)
    return web.json_response({"node": node, "status": "uncordoned", "by": actor.name})


def add_cordon_routes(app: web.Application) -> None:
    app.router.add_post("/api/v1/nodes/{node}/uncordon", post_uncordon)
