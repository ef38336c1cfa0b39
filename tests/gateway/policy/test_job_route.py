"""A TrainingJob's own route on top of the policy's (pure): what it replaces, what the admin's
`routing.jobs` forbids or forces, and that it never touches another job's alerts; the
escalations that follow a job's own roster."""

from __future__ import annotations

from datetime import timedelta

from tests.gateway.policy.factory import T0, fire, layers_from
from tests.gateway.policy.planned import decide
from trainsentry.alerts import JobRef, Person, Priority
from trainsentry.gateway.policy import job_roster
from trainsentry.gateway.policy.escalation import (
    EscalationPolicy,
    Escalator,
    IncidentPage,
    new_state,
)
from trainsentry.gateway.policy.route import (
    JOB_CHANNEL,
    JobRoute,
    RouteDecision,
    apply_job_route,
    route,
)
from trainsentry.gateway.policy.rules import Policy, load_policy
from trainsentry.notifiers.payload_contract import JobRoutePayload

POLICY = load_policy()
CONFIGURED = {"feishu_bot", "feishu_app", "phone", "console", JOB_CHANNEL}
LLM = JobRef("team-a", "llm")
OWN = JobRoute(feishu=True, owners=("ou_alice",), roster=True)


def job_decision(
    priority: Priority, job_route: JobRoute, policy: Policy = POLICY
) -> tuple[RouteDecision, JobRoutePayload | None]:
    decision = route(priority, {"namespace": "team-a"}, policy, configured=CONFIGURED)
    return apply_job_route(
        decision, priority, LLM, job_route, policy.routing.jobs, paging_channels=("phone",)
    )


def test_the_jobs_destination_replaces_the_gateways_feishu_channels() -> None:
    decision, extra = job_decision(Priority.P0, OWN)
    assert decision.channels == (JOB_CHANNEL, "phone", "console")
    assert extra == {
        "fallback": ["feishu_bot", "feishu_app"],
        "owners": ["ou_alice"],
        "roster": True,
        "job": "team-a/llm",
    }
    # P2: no mentions (routing.jobs.mention is P0, P1); P3 has no card to redirect
    _, p2 = job_decision(Priority.P2, OWN)
    assert p2 is not None and p2["owners"] == [] and "roster" not in p2
    p3, nothing = job_decision(Priority.P3, OWN)
    assert JOB_CHANNEL not in p3.channels and nothing is None


def test_the_admin_can_forbid_and_force_per_priority() -> None:
    policy = load_policy(
        overrides={"routing": {"jobs": {"allow": ["P0", "P1"], "force": {"P0": ["feishu_app"]}}}}
    )
    decision, extra = job_decision(Priority.P0, OWN, policy)
    # every P0 also to the gateway's own group (forced), and to the job's chat
    assert decision.channels == (JOB_CHANNEL, "feishu_app", "phone", "console")
    assert extra is not None and extra["fallback"] == ["feishu_bot"]
    forbidden, none = job_decision(Priority.P2, OWN, policy)
    assert forbidden.channels == ("feishu_bot", "feishu_app", "console") and none is None


def test_owners_alone_go_through_the_job_channel_to_the_gateways_feishu() -> None:
    decision, extra = job_decision(Priority.P1, JobRoute(owners=("a@example.com",)))
    assert decision.channels == (JOB_CHANNEL, "console")
    assert extra is not None and extra["fallback"] == ["feishu_bot", "feishu_app"]
    unchanged, none = job_decision(Priority.P2, JobRoute(owners=("a@example.com",)))
    assert JOB_CHANNEL not in unchanged.channels and none is None


def test_a_jobs_route_applies_to_its_own_alerts_only() -> None:
    routes = {LLM: OWN}
    own = decide(
        fire(0, labels={"priority": "P0"}), fingerprint_state=None, storm_state=None,
        distinct_nodes_in_window=1, policy=POLICY, now=T0, channels=CONFIGURED,
        job_routes=routes,
    )  # fmt: skip
    other = decide(
        fire(0, labels={"priority": "P0", "trainingjob": "other"}, fingerprint="fp-2"),
        fingerprint_state=None, storm_state=None, distinct_nodes_in_window=1, policy=POLICY,
        now=T0, channels=CONFIGURED, job_routes=routes,
    )  # fmt: skip
    same_name_other_namespace = decide(
        fire(0, labels={"priority": "P0", "namespace": "team-b"}, fingerprint="fp-3"),
        fingerprint_state=None, storm_state=None, distinct_nodes_in_window=1, policy=POLICY,
        now=T0, channels=CONFIGURED, job_routes=routes,
    )  # fmt: skip
    assert {d.channel for d in own.drafts} >= {JOB_CHANNEL}
    assert all(d.payload["job_route"]["job"] == "team-a/llm" for d in own.drafts if
               d.channel in (JOB_CHANNEL, "phone"))  # fmt: skip
    for result in (other, same_name_other_namespace):
        assert JOB_CHANNEL not in {d.channel for d in result.drafts}
        assert all("job_route" not in d.payload for d in result.drafts)


def person(name: str) -> Person:
    return Person(name, f"+1{len(name)}", f"ou_{name}", "")


def test_pages_of_a_job_with_its_own_roster_call_that_roster_all_along() -> None:
    escalator = Escalator(
        layers_from([("g1", [person("gus")]), ("g2", [person("gina")]), ("g3", [person("gil")])]),
        EscalationPolicy(ack_timeout=timedelta(minutes=5)),
    )
    team = layers_from([("one", [person("carol")]), ("two", [person("dave")])])
    rosters = {"team-a/llm": team}
    pages = [IncidentPage(1, Priority.P0, "job a"), IncidentPage(2, Priority.P0, "job b")]
    state, calls = job_roster.batch(
        escalator, new_state(), T0, pages=pages, page_rosters={1: "team-a/llm"},
        resolved=(), forget_before=None, roster_of=rosters.get,
    )  # fmt: skip
    assert [(c.alert_id, c.person.name) for c in calls] == [(1, "carol"), (2, "gus")]
    state, calls = job_roster.plan(
        escalator, state, T0 + timedelta(minutes=5), roster_of=rosters.get
    )
    assert [(c.alert_id, c.person.name) for c in calls] == [(1, "dave"), (2, "gina")]
    # the job's roster is gone (or unusable now): its incident falls back to the global one
    _, calls = job_roster.plan(escalator, state, T0 + timedelta(minutes=10), roster_of={}.get)
    assert [(c.alert_id, c.person.name) for c in calls] == [(1, "gil"), (2, "gil")]
