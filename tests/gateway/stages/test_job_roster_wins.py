"""A page that follows its TrainingJob's own roster (issue 20) follows no escalation policy,
even where `routing.escalation` names one for its priority; other pages do."""

from __future__ import annotations

from tests.support.oncall_gateway import START
from trainsentry.alerts import NotificationDraft, Person, Priority
from trainsentry.gateway.policy import job_roster
from trainsentry.gateway.policy.escalation import (
    EscalationPolicy,
    Escalator,
    Layer,
    Roster,
    new_state,
)
from trainsentry.gateway.stages.services.paging import Paging

GATEWAY = Escalator(Roster((Layer("global", (Person("gina"),)),)), EscalationPolicy())
NAMED = {"gpu-p0": Escalator(Roster((Layer("policy", (Person("pat"),)),)), EscalationPolicy())}
JOB = Roster((Layer("job", (Person("jo"),)),))


def draft(alert_id: int, job_route: dict[str, object] | None) -> NotificationDraft:
    payload: dict[str, object] = {"priority": "P0", "status": "firing", "route": "default:P0"}
    if job_route is not None:
        payload["job_route"] = job_route
    return NotificationDraft("phone", "alert", Priority.P0, f"k{alert_id}", payload, alert_id)


def test_the_jobs_roster_wins_over_the_escalation_policy() -> None:
    paging = Paging(
        GATEWAY,
        rosters=lambda job: JOB if job == "ml/llama" else None,
        choose=lambda _route, _priority: "gpu-p0",
    )
    drafts = [draft(1, None), draft(2, {"job": "ml/llama", "roster": True})]
    pages = [paging._page(d) for d in drafts]
    assert [page.policy for page in pages] == ["gpu-p0", ""]
    _, calls = job_roster.batch(
        GATEWAY,
        new_state(),
        START,
        pages=pages,
        page_rosters={2: "ml/llama"},
        resolved=(),
        forget_before=None,
        roster_of=lambda job: JOB if job == "ml/llama" else None,
        named=NAMED,
    )
    assert [(c.alert_id, c.person.name) for c in calls] == [(1, "pat"), (2, "jo")]


async def test_the_card_names_who_is_called_first_for_the_page() -> None:
    paging = Paging(GATEWAY, rosters=lambda job: JOB if job == "ml/llama" else None)
    cards = [
        NotificationDraft("feishu_bot", "alert", Priority.P0, "c1", draft(1, None).payload, 1),
        NotificationDraft(
            "feishu_bot",
            "alert",
            Priority.P0,
            "c2",
            draft(2, {"job": "ml/llama", "roster": True}).payload,
            2,
        ),
    ]
    annotated = await paging.annotate(None, cards, START)  # type: ignore[arg-type]
    assert [card.payload["on_call"] for card in annotated] == ["gina (global)", "jo (job)"]


def test_a_job_naming_an_escalation_policy_follows_it() -> None:
    """The job's roster reference names `gpu-p0` (issue 21): its page follows that policy,
    in no job group, whatever the route would have chosen."""
    paging = Paging(
        GATEWAY,
        choose=lambda _route, _priority: "",
        job_policies=lambda job, _priority: "gpu-p0" if job == "ml/llama" else "",
    )
    drafts = [draft(1, None), draft(2, {"job": "ml/llama", "roster": True})]
    pages = [paging._page(d) for d in drafts]
    assert [page.policy for page in pages] == ["", "gpu-p0"]
    assert [paging._roster_group(d) for d in drafts] == [None, None]
    state, calls = job_roster.batch(
        GATEWAY,
        new_state(),
        START,
        pages=pages,
        page_rosters={},
        resolved=(),
        forget_before=None,
        roster_of=lambda _job: None,
        named=NAMED,
    )
    assert [(c.alert_id, c.person.name) for c in calls] == [(1, "gina"), (2, "pat")]
    assert state.incidents[2].policy == "gpu-p0"
    assert state.incidents[2].roster is None


def test_a_roster_reference_holds_layers_or_a_policy_name() -> None:
    where = "ConfigMap oncall key roster.yaml"
    found = job_roster.parse_roster("escalation_policy: gpu-p0\n", where)
    assert found == job_roster.JobOnCall(policies=dict.fromkeys(Priority, "gpu-p0"))
    found = job_roster.parse_roster("escalation_policy: {P0: gpu-p0, P1: gpu-p1}\n", where)
    assert found == job_roster.JobOnCall(policies={Priority.P0: "gpu-p0", Priority.P1: "gpu-p1"})
    layers = "layers: [{name: a, members: [{name: jo}]}]\n"
    found = job_roster.parse_roster(layers, where)
    assert isinstance(found, job_roster.JobOnCall) and found.roster is not None
    bad = (
        "escalation_policy: gpu-p0\n" + layers,
        "{}",
        "escalation_policy: 'a b'",
        "escalation_policy: {}",
        "escalation_policy: {P7: gpu-p0}",
        "escalation_policy: {P0: 'a b'}",
    )
    for text in bad:
        problem = job_roster.parse_roster(text, where)
        assert isinstance(problem, tuple) and problem[0] == "InvalidRoster", text
        assert where in problem[1]


async def test_the_card_of_a_job_naming_a_policy_names_that_policys_first_call() -> None:
    async def named(_conn: object, _now: object) -> dict[str, Escalator]:
        return NAMED

    paging = Paging(
        GATEWAY,
        named=named,
        choose=lambda _route, _priority: "",
        job_policies=lambda job, _priority: "gpu-p0" if job == "ml/llama" else "",
    )
    payload = draft(2, {"job": "ml/llama", "roster": True}).payload
    cards = [
        NotificationDraft("feishu_bot", "alert", Priority.P0, "c1", draft(1, None).payload, 1),
        NotificationDraft("feishu_bot", "alert", Priority.P0, "c2", payload, 2),
    ]
    annotated = await paging.annotate(None, cards, START)  # type: ignore[arg-type]
    assert [card.payload["on_call"] for card in annotated] == ["gina (global)", "pat (policy)"]


def test_a_job_may_name_a_policy_per_priority() -> None:
    """`escalation_policy: {P0: gpu-p0}`: its P0 pages follow gpu-p0; its P1 pages, for
    which it names none, follow what their route chooses (here: none, the inline layers)."""
    paging = Paging(
        GATEWAY,
        choose=lambda _route, _priority: "",
        job_policies=lambda _job, priority: "gpu-p0" if priority is Priority.P0 else "",
    )
    p0 = draft(1, {"job": "ml/llama", "roster": True})
    p1 = NotificationDraft("phone", "alert", Priority.P1, "k2", dict(p0.payload), 2)
    assert [paging._page(d).policy for d in (p0, p1)] == ["gpu-p0", ""]
    assert [paging._roster_group(d) for d in (p0, p1)] == [None, None]
