"""Which escalation policy a page follows (route.escalation_for, issue 21 "per priority and
per team"): the matched route's own `escalation`, else `routing.escalation` for the
priority, else "" (the inline layers); the route a TrainingJob's own chat changed
(`route:ID+job`) keeps its route's policy."""

from __future__ import annotations

import pytest

from trainsentry.alerts import JobRef, Priority
from trainsentry.gateway.policy.route import (
    JobRoute,
    apply_job_route,
    escalation_for,
    escalation_names,
    route,
)
from trainsentry.gateway.policy.rules import load_policy, merge_policy

POLICY = merge_policy(
    load_policy(),
    {
        "routing": {
            "routes": [
                {"id": "ml", "namespaces": ["ml"], "priorities": ["P0", "P1"],
                 "channels": ["feishu", "phone"], "escalation": "ml-p0"},
                {"id": "infra", "namespaces": ["infra"], "channels": ["feishu", "phone"],
                 "escalation": "infra-p0"},
                {"id": "quiet", "namespaces": ["quiet"], "channels": ["feishu", "phone"]},
            ],
            "escalation": {"P0": "gpu-p0"},
        }
    },
)  # fmt: skip


@pytest.mark.parametrize(
    ("namespace", "priority", "wanted"),
    [
        ("ml", Priority.P0, "ml-p0"),  # the route's own, per team
        ("ml", Priority.P1, "ml-p0"),  # whatever the priority, the route chose
        ("infra", Priority.P0, "infra-p0"),
        ("infra", Priority.P2, "infra-p0"),
        ("quiet", Priority.P0, "gpu-p0"),  # a route naming none: per priority
        ("quiet", Priority.P1, ""),  # ... and none for P1: the inline layers
        ("other", Priority.P0, "gpu-p0"),  # the default route: per priority
        ("other", Priority.P1, ""),
    ],
)
def test_the_routes_policy_else_the_prioritys(
    namespace: str, priority: Priority, wanted: str
) -> None:
    decision = route(priority, {"namespace": namespace, "alertname": "X"}, POLICY)
    assert escalation_for(decision.route_id, priority, POLICY) == wanted


def test_a_route_changed_by_a_jobs_own_chat_keeps_its_policy() -> None:
    labels = {"namespace": "ml", "trainingjob": "llama", "alertname": "X"}
    decision = route(Priority.P0, labels, POLICY, configured={"feishu_app", "phone"})
    changed, extra = apply_job_route(
        decision, Priority.P0, JobRef("ml", "llama"), JobRoute(feishu=True), POLICY.routing.jobs
    )
    assert extra is not None and changed.route_id == "route:ml+job"
    assert escalation_for(changed.route_id, Priority.P0, POLICY) == "ml-p0"


def test_an_unknown_or_foreign_route_id_falls_back_to_the_priority() -> None:
    assert escalation_for("route:gone", Priority.P0, POLICY) == "gpu-p0"
    assert escalation_for("storm:ml", Priority.P1, POLICY) == ""


def test_every_named_policy_is_listed_for_the_start_check() -> None:
    assert escalation_names(POLICY) == {
        "routing.routes[0].escalation": "ml-p0",
        "routing.routes[1].escalation": "infra-p0",
        "routing.escalation.P0": "gpu-p0",
    }
