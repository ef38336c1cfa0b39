"""The console's Nodes page (aiohttp handlers, thin; handlers.py wraps them: the viewer,
CSRF, 400/503, the security headers):

- `GET /ui/nodes`: the nodes as `GET /api/v1/nodes` ranks them (gateway/api/nodes.py
  `ranked_nodes`: the time-decayed hardware fault score, per GPU, the place in the
  topology), the nodes with a cordon waiting or in force first; each with its cordon state
  (store/cordon.py), its open incidents (an alert of theirs fires on it) and the open
  infrastructure incidents over it; the first MAX_NODES drawn;
- `POST /ui/nodes/{node}/uncordon`: through `Cordoner.uncordon`, the service behind
  `POST /api/v1/nodes/{node}/uncordon` (the API token; the same `event=node_uncordoned`
  audit line), as the signed-in name;
- `POST /ui/nodes/{node}/approve` and `/dismiss`: a recommended cordon decided through
  `Cordoner.decide`, the service behind the cordon card's buttons, as the approver the
  signed-in name is (`remediation.approvers`: a name of `oncall.people`); anyone else is
  refused (403) and nothing changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import urlencode

from aiohttp import web

from trainsentry.gateway.absent import Off
from trainsentry.gateway.access import Target
from trainsentry.gateway.acting import node_target
from trainsentry.gateway.api.nodes import ranked_nodes
from trainsentry.gateway.pipeline import GATEWAY_KEY, Gateway
from trainsentry.gateway.policy.cordon import NodeDecision
from trainsentry.gateway.policy.infra import InfraState
from trainsentry.gateway.stages.planning.plan import INFRA_SCOPE
from trainsentry.gateway.ui import auth
from trainsentry.gateway.ui.acting import TargetOf, acting
from trainsentry.gateway.ui.actions import NOTICES
from trainsentry.gateway.ui.handlers import page
from trainsentry.gateway.ui.ops_views import MAX_NODES, nodes_page
from trainsentry.gateway.ui.pages import render
from trainsentry.gateway.ui.views import BadQuery
from trainsentry.kube.names import subdomain_problems
from trainsentry.store import console as store
from trainsentry.store.console_incidents import incident_summaries, open_incidents_on
from trainsentry.store.cordon import cordon_states

log = logging.getLogger("trainsentry.ui")

DECISIONS = {"approve": True, "dismiss": False}


def _decisions(states: dict[str, dict[str, object]]) -> dict[str, NodeDecision]:
    found = {}
    for node, state in states.items():
        try:
            found[node] = NodeDecision.from_json(state)
        except (KeyError, TypeError, ValueError):  # a state this version cannot read
            continue
    return found


def _infra(states: dict[str, object]) -> list[InfraState]:
    found = []
    for state in states.values():
        if isinstance(state, dict) and state.get("open"):
            try:
                found.append(InfraState.from_json(state))
            except (KeyError, TypeError, ValueError):
                continue
    return found


@page()
async def nodes(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    ranked, topology, policy = await ranked_nodes(gateway)
    async with gateway.engine.connect() as conn:
        decisions = _decisions(await cordon_states(conn))
        names = [health.node for health in ranked[:MAX_NODES]] + list(decisions)[:MAX_NODES]
        incidents_on = await open_incidents_on(conn, names)
        summaries = await incident_summaries(
            conn, {i for found in incidents_on.values() for i in found}
        )
        infra = _infra(await store.states_in_scope(conn, INFRA_SCOPE))
    places = {node: topology.place(node) for node in names} if topology is not None else {}
    cordon = gateway.cordon
    mode, threshold, approver = "off", None, False
    if not isinstance(cordon, Off):
        mode, threshold = cordon.settings.cordon.value, cordon.settings.threshold
        approver = who.name is not None and bool(cordon.approver_id(who.name))
    view = nodes_page(
        ranked, places, decisions, incidents_on, summaries, infra,
        half_life_s=policy.node_health.half_life, cordon=mode, threshold=threshold,
    )  # fmt: skip
    return render(
        request, who, "nodes.html.j2", view=view,
        notice=NOTICES.get(request.query.get("done", "")),
        can_uncordon=_can_uncordon(gateway) and who.can_act,
        can_decide=bool(approver) and who.can_act,
    )  # fmt: skip


def _can_uncordon(gateway: Gateway) -> bool:
    return not isinstance(gateway.cordon, Off) and gateway.settings.api_token is not None


def _node(request: web.Request) -> str:
    node = request.match_info["node"]
    if subdomain_problems(node):  # Kubernetes' rule for a node's name
        raise BadQuery("the node is not a node name")
    return node


def _node_target(request: web.Request) -> TargetOf:
    """What a node's change acts on: the node, the cluster's (its admins')."""

    async def target(_fields: Mapping[str, str]) -> Target:
        return node_target(_node(request))

    return target


@page()
async def post_uncordon(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/nodes/{node}/uncordon (form field `csrf`)."""
    gateway = request.app[GATEWAY_KEY]
    done = await acting(request, who, _node_target(request))
    if isinstance(done, web.Response):
        return done
    if gateway.settings.api_token is None:
        return render(
            request, who, "error.html.j2", status=403,
            message="uncordon needs TRAINSENTRY_API_TOKEN on the gateway",
        )  # fmt: skip
    node = _node(request)
    cordon = gateway.cordon
    if isinstance(cordon, Off):
        return render(
            request, who, "error.html.j2", status=409,
            message="remediation.cordon is off on this gateway",
        )  # fmt: skip
    outcome = await cordon.uncordon(node, done.actor.audit_name)
    log.info("event=node_uncordoned node=%s by=%s ok=%s", node, done.actor.audit_name, outcome.ok)
    if not outcome.ok:
        return render(request, who, "error.html.j2", status=409, message=outcome.message)
    raise web.HTTPSeeOther("/ui/nodes?" + urlencode({"done": "uncordoned"}))


@page()
async def post_decision(request: web.Request, who: auth.Viewer) -> web.StreamResponse:
    """POST /ui/nodes/{node}/approve or /dismiss (form field `csrf`)."""
    gateway = request.app[GATEWAY_KEY]
    done = await acting(request, who, _node_target(request))
    if isinstance(done, web.Response):
        return done
    name = done.actor.name
    decision = request.match_info["decision"]
    if decision not in DECISIONS:
        return render(request, who, "error.html.j2", status=404, message="no such action")
    node = _node(request)
    cordon = gateway.cordon
    if isinstance(cordon, Off):
        return render(
            request, who, "error.html.j2", status=409,
            message="remediation.cordon is off on this gateway",
        )  # fmt: skip
    presser = cordon.approver_id(name)
    if presser is None:
        return render(
            request, who, "error.html.j2", status=403,
            message=f"{name} may not decide cordons (remediation.approvers)",
        )  # fmt: skip
    outcome = await cordon.decide(node, DECISIONS[decision], presser)
    log.info(
        "event=cordon_decision node=%s action=%s who=%s ok=%s",
        node, decision, done.actor.audit_name, outcome.ok,
    )  # fmt: skip
    if not outcome.ok:
        return render(request, who, "error.html.j2", status=409, message=outcome.message)
    notice = "cordon-approved" if DECISIONS[decision] else "cordon-dismissed"
    raise web.HTTPSeeOther("/ui/nodes?" + urlencode({"done": notice}))
