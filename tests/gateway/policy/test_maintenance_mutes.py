"""The maintenance decisions, pure (gateway/policy/maintenance_mutes.py): which drafts a window
mutes, what a mute owes when its stretch ends, and the "ends soon" notice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.gateway.policy import maintenance_mutes as policy
from trainsentry.gateway.policy.maintenance_mutes import (
    draft_from_json,
    draft_to_json,
    ending_notice,
    ending_soon,
    mute,
    release,
)
from trainsentry.gateway.policy.payload_build import ALERT_KIND, STORM_KIND
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.maintenance.windows import parse_window
from trainsentry.store import maintenance_windows as store

T = datetime(2026, 10, 27, 2, 0, tzinfo=UTC)


def window(window_id: str, node: str, hours: float = 2, start: datetime = T) -> Any:
    body = {
        "matchers": {"node": node},
        "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(hours=hours)).isoformat(),
    }
    return parse_window(body, window_id=window_id, created_at=start)


def draft(
    alert_id: int | None, node: str, status: str = "firing", **extra: Any
) -> NotificationDraft:
    return NotificationDraft(
        channel=extra.pop("channel", "feishu"),
        kind=extra.pop("kind", ALERT_KIND),
        priority=Priority.P0,
        idempotency_key=f"k-{alert_id}-{status}-{extra.get('n', 0)}",
        payload={"priority": "P0", "status": status, "labels": {"node": node}, "reason": "r"},
        alert_id=alert_id,
    )


def test_the_states_are_the_stores() -> None:
    assert (policy.MUTED, policy.RESOLVED) == (store.MUTED, store.RESOLVED)


def test_a_window_mutes_matching_firing_notices_only() -> None:
    w = window("mw-1", "gpu-17")
    drafts = [
        draft(1, "gpu-17"),
        draft(1, "gpu-17", channel="phone"),
        draft(2, "gpu-18"),
        draft(None, "gpu-17", kind=STORM_KIND),  # storm summaries are never muted
        draft(1, "gpu-17", channel="sheet"),  # nor the archive
    ]
    result = mute(drafts, windows=[w], mutes={}, now=T, spare_channels={"sheet"})
    assert [(d.alert_id, d.channel) for d in result.kept] == [
        (2, "feishu"), (None, "feishu"), (1, "sheet")
    ]  # fmt: skip
    assert result.muted == 2 and list(result.new) == [1]
    assert result.new[1].window_id == "mw-1" and result.new[1].until == T + timedelta(hours=2)
    assert [d.channel for d in result.new[1].drafts] == ["feishu", "phone"]
    # not yet active, or over: nothing muted
    for at in (T - timedelta(seconds=1), T + timedelta(hours=2)):
        assert mute(drafts, windows=[w], mutes={}, now=at).muted == 0


def test_resolves_of_muted_alerts_are_muted_and_owe_nothing() -> None:
    w = window("mw-1", "gpu-17")
    # muted earlier: the resolve closes the mute
    result = mute([draft(1, "gpu-17", "resolved")], windows=[w], mutes={1: "muted"}, now=T)
    assert result.kept == [] and result.resolved == {1}
    # fired and resolved in one batch: no mute kept
    result = mute(
        [draft(1, "gpu-17"), draft(1, "gpu-17", "resolved")], windows=[w], mutes={}, now=T
    )
    assert result.kept == [] and result.new == {}
    # a resolution the flap hold released after the mute closed: still muted
    result = mute([draft(1, "gpu-17", "resolved")], windows=[], mutes={1: "resolved"}, now=T)
    assert result.kept == []
    # an alert announced before the window (no mute) or at its end: its resolve is sent
    for mutes in ({}, {1: "notified"}):
        result = mute([draft(1, "gpu-17", "resolved")], windows=[w], mutes=mutes, now=T)
        assert len(result.kept) == 1


def test_release_notifies_still_firing_alerts_and_moves_those_another_window_mutes() -> None:
    short, long = window("mw-short", "gpu-17", 1), window("mw-long", "gpu-17", 3)
    held = [draft_to_json(draft(1, "gpu-17"))]
    end = T + timedelta(hours=1)
    due = [
        (1, "mw-short", True, {"node": "gpu-17"}, held),
        (2, "mw-short", False, {"node": "gpu-17"}, held),
    ]
    result = release(due, windows=[short, long], now=end)
    assert result.moved == {1: ("mw-long", T + timedelta(hours=3))}
    assert result.resolved == {2} and result.notify == []
    result = release(due, windows=[short], now=end)
    assert result.notified == {1} and len(result.notify) == 1
    notice = result.notify[0]
    assert notice.payload["maintenance"]["window_id"] == "mw-short"
    assert "held by maintenance window mw-short" in notice.payload["reason"]
    assert notice.idempotency_key == held[0]["idempotency_key"]


def test_drafts_survive_the_store_round_trip() -> None:
    original = draft(7, "gpu-1")
    original.extra["status"] = "pending"
    assert draft_from_json(draft_to_json(original)) == original


def test_ending_soon_and_its_notice() -> None:
    w = window("mw-1", "gpu-17", 1)
    assert ending_soon([w], T, 15 * 60) == []
    at = T + timedelta(minutes=50)
    assert ending_soon([w], at, 15 * 60) == [(w, T + timedelta(hours=1))]
    firing = [
        (1, "GPUXidError", "P1", {"node": "gpu-17"}),
        (2, "NodeDown", "P0", {"node": "gpu-17"}),
    ]
    drafts = ending_notice(
        w, T + timedelta(hours=1), firing, policy=load_policy(None),
        channels={"feishu_bot", "phone", "console"}, now=at,
    )  # fmt: skip
    assert sorted(d.channel for d in drafts) == ["console", "feishu_bot"]  # never a phone
    assert {d.priority for d in drafts} == {Priority.P0}  # the most urgent muted alert's
    assert drafts[0].payload["maintenance"]["firing"] == [1, 2]
    assert "NodeDown (#2)" in drafts[0].payload["annotations"]["summary"]
    assert ending_notice(w, T, [], policy=load_policy(None), channels=None, now=at) == []


def racked(alert_id: int, node: str, place: str, **labels: str) -> NotificationDraft:
    found = draft(alert_id, node)
    found.payload["labels"] = {"node": node, **labels}
    found.payload["topology"] = {"rack": place, "leaf_switch": f"leaf-{place}"}
    return found


def rack_window(window_id: str, matchers: dict[str, Any]) -> Any:
    body = {
        "matchers": matchers,
        "starts_at": T.isoformat(),
        "ends_at": (T + timedelta(hours=2)).isoformat(),
    }
    return parse_window(body, window_id=window_id, created_at=T)


def test_a_window_matches_the_alerts_place_in_the_topology() -> None:
    """docs/oncall.md's `--match rack=r7`: the alerts of r7's nodes carry no rack label; the
    topology stage put their place in the payload, and the window matches it."""
    w = rack_window("mw-rack", {"rack": "r7", "alertname": {"regex": "GPU.*"}})
    drafts = [
        racked(1, "gpu-1", "r7", alertname="GPUXidError"),
        racked(2, "gpu-2", "r8", alertname="GPUXidError"),  # another rack
        racked(3, "gpu-3", "r7", alertname="NCCLHang"),  # another alert name
        # the alert's own rack label wins over the topology's
        racked(4, "gpu-4", "r7", alertname="GPUXidError", rack="r9"),
        draft(5, "gpu-5"),  # no place known: no rack to match
    ]
    out = mute(drafts, windows=[w], mutes={}, now=T + timedelta(minutes=1))
    assert sorted(out.new) == [1]
    assert sorted(d.alert_id for d in out.kept if d.alert_id is not None) == [2, 3, 4, 5]
    assert policy.match_labels({"rack": "r9"}, {"topology": {"rack": "r7", "pod": "p1"}}) == {
        "rack": "r9",
        "pod": "p1",
    }


def test_release_rematches_by_the_place_the_alert_had() -> None:
    """At a window's end another window on the alert's rack keeps it muted."""
    later = rack_window("mw-rack", {"rack": "r7"})
    held = [draft_to_json(racked(1, "gpu-1", "r7"))]
    out = release(
        [(1, "mw-node", True, {"node": "gpu-1"}, held)], windows=[later], now=T + timedelta(hours=1)
    )
    assert out.moved == {1: ("mw-rack", T + timedelta(hours=2))}
    assert out.notify == []
