"""Route table: defaults per priority, matchers, paging channels, configured channels."""

from __future__ import annotations

import pytest

from trainsentry.alerts import Priority
from trainsentry.gateway.policy.route import route, unconfigured_names
from trainsentry.gateway.policy.rules import load_policy, merge_policy

POLICY = load_policy()
TEAM_A = {"alertname": "GPUHot", "namespace": "team-a", "trainingjob": "llm", "component": "gpu"}

DEFAULTS = [
    (Priority.P0, ("feishu", "phone", "sheet", "console")),
    (Priority.P1, ("feishu", "sheet", "console")),
    (Priority.P2, ("feishu", "sheet", "console")),
    (Priority.P3, ("sheet", "console")),
]


@pytest.mark.parametrize(("priority", "channels"), DEFAULTS)
def test_default_routes(priority: Priority, channels: tuple[str, ...]) -> None:
    decision = route(priority, TEAM_A, POLICY)
    assert decision.channels == channels
    assert decision.route_id == f"default:{priority.value}"


def test_non_paging_notices_never_ring_the_phone() -> None:
    decision = route(Priority.P0, TEAM_A, POLICY, paging=False)
    assert decision.channels == ("feishu", "sheet", "console")


def test_console_only_when_configured_and_unconfigured_reported() -> None:
    decision = route(Priority.P0, TEAM_A, POLICY, configured={"feishu", "sheet"})
    assert decision.channels == ("feishu", "sheet")
    assert decision.unconfigured == ("phone",)  # console is optional, phone is a gap
    with_console = route(Priority.P3, TEAM_A, POLICY, configured={"sheet", "console"})
    assert with_console.channels == ("sheet", "console")


ROUTED = merge_policy(
    POLICY,
    {
        "routing": {
            "routes": [
                {"id": "llm-night", "priorities": ["P0", "P1"], "jobs": ["llm"],
                 "channels": ["feishu", "phone", "email"]},
                {"id": "team-b", "namespaces": ["team-b"], "channels": ["email"]},
                {"id": "fabric", "labels": {"component": "fabric|network"},
                 "channels": ["feishu", "console"]},
            ]
        }
    },
)  # fmt: skip

MATCHES = [
    ("job and priority match", Priority.P1, TEAM_A, "route:llm-night",
     ("feishu", "phone", "email", "console")),
    ("priority outside the route -> default", Priority.P2, TEAM_A, "default:P2",
     ("feishu", "sheet", "console")),
    ("namespace route", Priority.P3, {"namespace": "team-b", "trainingjob": "x"}, "route:team-b",
     ("email", "console")),
    ("label regex route, no duplicate console", Priority.P2,
     {"namespace": "z", "component": "network"}, "route:fabric", ("feishu", "console")),
    ("label regex must match whole value", Priority.P2,
     {"namespace": "z", "component": "fabricX"}, "default:P2", ("feishu", "sheet", "console")),
    ("first matching route wins", Priority.P0,
     {"namespace": "team-b", "trainingjob": "llm", "component": "fabric"}, "route:llm-night",
     ("feishu", "phone", "email", "console")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("priority", "labels", "route_id", "channels"),
    [m[1:] for m in MATCHES],
    ids=[m[0] for m in MATCHES],
)
def test_route_table(
    priority: Priority, labels: dict[str, str], route_id: str, channels: tuple[str, ...]
) -> None:
    decision = route(priority, labels, ROUTED)
    assert (decision.route_id, decision.channels) == (route_id, channels)


def test_a_kind_stands_for_the_feishu_channels_this_gateway_runs() -> None:
    """The shipped policy says `feishu`; the channels register as feishu_bot / feishu_app."""
    bot_only = {"feishu_bot", "feishu_sheet", "phone", "console"}
    p0 = route(Priority.P0, TEAM_A, POLICY, configured=bot_only)
    assert (p0.channels, p0.unconfigured) == (
        ("feishu_bot", "phone", "feishu_sheet", "console"),
        (),
    )
    both = route(Priority.P1, TEAM_A, POLICY, configured={"feishu_app", "feishu_bot"})
    assert both.channels == ("feishu_bot", "feishu_app")
    nothing = route(Priority.P1, TEAM_A, POLICY, configured={"console"})
    assert (nothing.channels, nothing.unconfigured) == (("console",), ("feishu",))
    # a route may still name one channel of the kind
    own = merge_policy(POLICY, {"routing": {"routes": [
        {"id": "app-only", "priorities": ["P1"], "channels": ["feishu_app"]}]}})  # fmt: skip
    assert route(Priority.P1, TEAM_A, own, configured={"feishu_app", "feishu_bot"}).channels == (
        "feishu_app",
    )


def test_names_the_routing_uses_without_a_channel_are_listed_for_a_warning() -> None:
    assert unconfigured_names(POLICY, {"feishu_bot", "phone", "console"}) == []
    assert unconfigured_names(POLICY, {"console"}) == ["feishu", "phone"]  # the archive is optional
    routed = merge_policy(POLICY, {"routing": {"routes": [
        {"id": "mail", "priorities": ["P2"], "channels": ["email"]}]}})  # fmt: skip
    assert unconfigured_names(routed, {"feishu_app", "phone"}) == ["email"]
