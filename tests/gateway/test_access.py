"""The access decision (gateway/access.py), pure: who may act on which teams' incidents."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trainsentry.config import AccessSettings, TeamSettings
from trainsentry.gateway.access import (
    Actor,
    Target,
    feishu_actor,
    groups_of,
    may_act_on,
    namespaces_of,
    scope_of,
    window_namespaces,
)
from trainsentry.maintenance.types import MaintenanceWindow
from trainsentry.maintenance.windows import parse_window

ACCESS = AccessSettings(
    teams={
        "team-a": TeamSettings(namespaces=("team-a", "team-a-dev"), schedules=("a-primary",)),
        "team-b": TeamSettings(namespaces=("team-b",), groups=("b-oncall",)),
    },
    admin_groups=("sre",),
)
ANN = Actor("ann", "proxy", frozenset({"team-a"}))


def incident(*namespaces: str) -> Target:
    return Target("incident 7", frozenset(namespaces))


def test_a_member_acts_on_their_teams_namespaces_only() -> None:
    assert may_act_on(ANN, incident("team-a"), ACCESS).allowed
    assert may_act_on(ANN, incident("team-a", "team-a-dev"), ACCESS).allowed
    refused = may_act_on(ANN, incident("team-b"), ACCESS)
    assert not refused.allowed
    assert refused.reason.startswith("ann may not act on incident 7: it is in namespaces team-b")
    assert "your teams (team-a)" in refused.reason
    # a shared incident is every one of its teams': one namespace not theirs refuses it
    assert not may_act_on(ANN, incident("team-a", "team-b"), ACCESS).allowed
    # the cluster's own (no namespace), or nothing to tell it by: not a team's
    assert not may_act_on(ANN, incident(""), ACCESS).allowed
    assert not may_act_on(ANN, Target("something"), ACCESS).allowed


def test_a_card_presser_is_a_teams_by_its_feishu_list() -> None:
    """A Feishu press: the signed open_id and the `oncall.people` name it has; a team's
    `feishu` list (either), `admin_feishu` for every team; the proxy's groups never count."""
    access = AccessSettings(
        teams={
            "team-a": TeamSettings(namespaces=("team-a",), feishu=("ann",)),
            "team-b": TeamSettings(namespaces=("team-b",), feishu=("ou_bo",)),
        },
        admin_feishu=("ou_sam",),
    )
    ann = feishu_actor("ou_ann", {"ou_ann": "ann"})
    assert (ann.name, ann.via, ann.audit_name) == ("ann", "feishu", "ann (Feishu card button)")
    assert may_act_on(ann, incident("team-a"), access).allowed
    refused = may_act_on(ann, incident("team-b"), access)
    assert not refused.allowed and "your teams (team-a)" in refused.reason
    assert may_act_on(feishu_actor("ou_bo", {}), incident("team-b"), access).allowed
    assert may_act_on(feishu_actor("ou_sam", {}), incident("team-b", ""), access).allowed
    stranger = may_act_on(feishu_actor("ou_x", {}), incident("team-a"), access)
    assert "none (no team's feishu list names you)" in stranger.reason
    # a proxy person whose group is named like a presser: the feishu lists are not groups
    assert not may_act_on(
        Actor("eve", "proxy", frozenset({"ann"})), incident("team-a"), access
    ).allowed
    # undivided: every press acts, as before
    assert may_act_on(feishu_actor("ou_x", {}), incident("team-a"), AccessSettings()).allowed


def test_a_team_is_known_by_its_groups_or_its_name() -> None:
    bo = Actor("bo", "proxy", frozenset({"b-oncall"}))
    assert may_act_on(bo, incident("team-b"), ACCESS).allowed
    named_like_b = Actor("eve", "proxy", frozenset({"team-b"}))  # team-b lists its groups
    assert not may_act_on(named_like_b, incident("team-b"), ACCESS).allowed
    nobody = may_act_on(Actor("joe", "proxy", frozenset()), incident("team-a"), ACCESS)
    assert not nobody.allowed and "none (no group of yours is a team's)" in nobody.reason
    both = Actor("cy", "proxy", frozenset({"team-a", "b-oncall"}))
    assert may_act_on(both, incident("team-a", "team-b"), ACCESS).allowed
    assert scope_of(both, ACCESS).teams == ("team-a", "team-b")


def test_schedules_are_the_teams_too() -> None:
    assert may_act_on(ANN, Target("s", schedules=frozenset({"a-primary"})), ACCESS).allowed
    refused = may_act_on(ANN, Target("s", schedules=frozenset({"b-primary"})), ACCESS)
    assert not refused.allowed and "on-call schedules b-primary" in refused.reason


@pytest.mark.parametrize(
    "actor",
    [
        Actor("root", "proxy", frozenset({"sre", "other"})),
        Actor("erin", "break-glass"),
        Actor("ci-bot", "api-token"),
    ],
)
def test_admins_and_the_tokens_act_on_everything(actor: Actor) -> None:
    for target in (incident("team-b"), incident(""), Target("nothing")):
        assert may_act_on(actor, target, ACCESS).allowed


def test_undivided_access_lets_everyone_signed_in_act() -> None:
    assert may_act_on(ANN, incident("team-b"), AccessSettings()).allowed
    assert not AccessSettings().divided and ACCESS.divided
    assert AccessSettings(admin_groups=("sre",)).divided


def test_the_audit_names_how_they_signed_in() -> None:
    assert ANN.audit_name == "ann (signed in through the proxy)"
    assert ANN.acting_name == "ann"
    assert Actor("erin", "break-glass").acting_name == "erin (break-glass token)"
    assert Actor("ci", "api-token").audit_name == "ci (API token)"
    assert Actor("ci", "api-token").acting_name == "ci"


def test_groups_are_read_as_oauth2_proxy_joins_them() -> None:
    assert groups_of(["team-a,sre", " b-oncall , ", ""]) == {"team-a", "sre", "b-oncall"}
    assert groups_of([]) == frozenset()
    assert len(groups_of([",".join(f"g{i}" for i in range(10_000))])) == 200


def test_an_incident_is_its_jobs_namespaces() -> None:
    # a node's alert from the monitoring namespace joined team-a's job incident
    assert namespaces_of({("team-a", True), ("monitoring", False)}) == {"team-a"}
    assert namespaces_of({("team-a", True), ("team-b", True)}) == {"team-a", "team-b"}
    # no job among them: all of them
    assert namespaces_of({("monitoring", False), ("", False)}) == {"monitoring", ""}


def window(matchers: dict[str, object]) -> MaintenanceWindow:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    body = {"matchers": matchers, "starts_at": now.isoformat(),
            "ends_at": (now + timedelta(hours=1)).isoformat(), "created_by": "x"}  # fmt: skip
    return parse_window(body, window_id="mw-1", created_at=now,
                        max_window=timedelta(days=1), max_total=timedelta(days=1))  # fmt: skip


def test_a_window_is_the_namespace_it_names() -> None:
    assert window_namespaces(window({"namespace": "team-b", "node": "n1"})) == {"team-b"}
    assert window_namespaces(window({"node": "n1"})) == {""}, "every namespace's: the cluster's"
    assert window_namespaces(window({"namespace": {"regex": "team-.*"}})) == {""}


def test_a_jobs_bulk_ack_is_each_incidents_it_acknowledges() -> None:
    """An incident of team-a's job that team-b's job alert joined is team-b's too: team-a's
    person cannot bulk-acknowledge it (a node's alert of another namespace does not count)."""
    from trainsentry.gateway.acting import job_target

    alone = job_target("team-a", "train-a", frozenset({("team-a", True), ("monitoring", False)}))
    assert alone.namespaces == {"team-a"} and may_act_on(ANN, alone, ACCESS).allowed
    joined = job_target("team-a", "train-a", frozenset({("team-a", True), ("team-b", True)}))
    refused = may_act_on(ANN, joined, ACCESS)
    assert not refused.allowed and "namespaces team-b" in refused.reason
