"""The alert policy (pure): classification, dedup, storms, incidents, routing, escalation.

Its public face, for the rest of trainsentry (reports/): the policy's rules as loaded from
the policy file, and the node health scoring the hardware report shares with the console.
Everything else here is the gateway's own (tests/architecture/test_gateway_face.py)."""

from trainsentry.gateway.policy.health import fault_of, score_nodes
from trainsentry.gateway.policy.rules import Policy, load_policy

__all__ = ["Policy", "fault_of", "load_policy", "score_nodes"]
