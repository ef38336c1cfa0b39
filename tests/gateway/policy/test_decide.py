"""One change planned as the planner plans it (tests/gateway/policy/planned.py: `fold_into`
then `flush`) and the timers (`decide_tick`): drafts, channels, payloads, idempotency keys,
storms, metrics."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.gateway.policy.factory import at, fire, make_alert, resolve
from tests.gateway.policy.planned import DecideResult, decide
from trainsentry.alerts import AlertChange, ChangeKind, NotificationDraft, Priority
from trainsentry.gateway.metrics import PolicyMetrics
from trainsentry.gateway.policy.decide import decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.incident import IncidentBook, IncidentState
from trainsentry.gateway.policy.payload_build import alert_from_json, alert_to_json
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy
from trainsentry.gateway.policy.storm import StormState, job_key

POLICY = load_policy()
CHANNELS = {"feishu", "phone", "sheet", "console"}
P0_LABELS = {"alertname": "GPUFellOffBus", "priority": "P0", "node": "n1", "gpu": "3"}
P2_LABELS = {"alertname": "GPUHot", "priority": "P2", "node": "n1", "gpu": "3"}


class Gateway:
    """Plays the lead's intake: loads states, calls decide, persists states as JSON (the
    incidents too, as the store keeps them: their JSON and the alerts' memberships)."""

    def __init__(self, policy: Policy = POLICY, channels: set[str] | None = None) -> None:
        self.policy = policy
        self.channels = CHANNELS if channels is None else channels
        self.fingerprints: dict[str, dict[str, object]] = {}
        self.storms: dict[str, dict[str, object]] = {}
        self.incidents: dict[int, dict[str, Any]] = {}
        self.members: dict[int, int] = {}
        self.drafts: list[NotificationDraft] = []

    def book(self) -> IncidentBook:
        states = [IncidentState.from_json(data) for data in self.incidents.values()]
        return IncidentBook(self.policy, states, self.members)

    def keep(self, book: IncidentBook) -> None:
        for state in book.by_id.values():
            self.incidents[state.id] = json.loads(json.dumps(state.to_json()))
        self.members.update(book.members)

    def send(self, change: AlertChange, nodes: int = 1) -> DecideResult:
        fp = self.fingerprints.get(change.alert.fingerprint)
        key = job_key(change.alert.labels)
        storm = self.storms.get(key)
        book = self.book()
        result = decide(
            change,
            fingerprint_state=FingerprintState.from_json(fp) if fp else None,
            storm_state=StormState.from_json(storm) if storm else None,
            distinct_nodes_in_window=nodes,
            policy=self.policy,
            now=change.at,
            channels=self.channels,
            incidents=book,
        )
        self.keep(book)
        self.fingerprints[change.alert.fingerprint] = json.loads(
            json.dumps(result.fingerprint_state.to_json())
        )
        self.storms[key] = json.loads(json.dumps(result.storm_state.to_json()))
        self.drafts.extend(result.drafts)
        return result

    def tick(self, seconds: float) -> list[NotificationDraft]:
        book = self.book()
        book.wake(list(book.by_id.values()))
        result = decide_tick(
            [FingerprintState.from_json(s) for s in self.fingerprints.values()],
            [StormState.from_json(s) for s in self.storms.values()],
            policy=self.policy,
            now=at(seconds),
            channels=self.channels,
            incidents=book,
        )
        self.keep(book)
        for fingerprint, state in result.fingerprint_states.items():
            self.fingerprints[fingerprint] = state.to_json()
        for key, storm in result.storm_states.items():
            self.storms[key] = storm.to_json()
        self.drafts.extend(result.drafts)
        return result.drafts


def channels_of(drafts: list[NotificationDraft]) -> list[str]:
    return [d.channel for d in drafts]


def test_new_p0_pages_every_routed_channel_with_a_full_payload() -> None:
    gw = Gateway()
    result = gw.send(fire(0, labels=P0_LABELS, alert_id=42))
    assert channels_of(result.drafts) == ["feishu", "phone", "sheet", "console"]
    draft = result.drafts[0]
    assert draft.kind == "alert" and draft.priority is Priority.P0 and draft.alert_id == 42
    assert draft.group_key.startswith("incident:")  # the incident's cards keep their order
    payload = draft.payload
    assert payload["status"] == "firing" and payload["event"] == "firing"
    assert payload["labels"]["alertname"] == "GPUFellOffBus"
    assert payload["annotations"] == {"summary": "something happened"}
    assert payload["rule_id"] == "label:priority" and payload["reason"]
    assert payload["job"] == "team-a/llm" and payload["alert_id"] == 42
    assert "label:priority" in draft.reason
    json.dumps(payload)  # JSON-serialisable as is
    assert len({d.idempotency_key for d in result.drafts}) == 4  # one per channel


def test_payload_follows_the_channels_contract() -> None:
    payload_mod = pytest.importorskip("trainsentry.notifiers.payload_contract")
    gw = Gateway(merge_policy(POLICY, {"storm": {"threshold": 2}}))
    for i in range(6):  # six causes: six incidents, the last ones folded into the storm
        labels = {**P2_LABELS, "alertname": f"GPUHot{i}", "node": f"n{i}"}
        gw.send(fire(i, fingerprint=f"fp-{i}", labels=labels))
    gw.send(resolve(10, 0, fingerprint="fp-0"))
    gw.tick(500)
    kinds = Counter(d.payload["event"] for d in gw.drafts)
    assert {"firing", "storm_started", "storm_summary"} <= set(kinds)
    for draft in gw.drafts:
        parsed = payload_mod.parse_payload(draft.payload)
        assert parsed["priority"] == draft.priority.value


def test_same_inputs_give_the_same_keys() -> None:
    change = fire(0, labels=P0_LABELS)
    first = decide(change, fingerprint_state=None, storm_state=None, distinct_nodes_in_window=1,
                   policy=POLICY, now=at(0))  # fmt: skip
    again = decide(change, fingerprint_state=None, storm_state=None, distinct_nodes_in_window=1,
                   policy=POLICY, now=at(5))  # fmt: skip
    assert [d.idempotency_key for d in first.drafts] == [d.idempotency_key for d in again.drafts]


def test_replaying_a_change_sends_nothing_new() -> None:
    gw = Gateway()
    change = fire(0, labels=P0_LABELS)
    assert gw.send(change).drafts
    assert gw.send(change).drafts == []
    assert gw.send(fire(30, 0, labels=P0_LABELS)).drafts == []  # Alertmanager's repeat


def test_resolve_keeps_the_firing_priority_and_never_rings_the_phone() -> None:
    gw = Gateway()
    labels = {**P2_LABELS, "priority": "P1"}
    gw.send(fire(0, labels=labels), nodes=20)  # blast radius: P1 -> P0
    resolved = gw.send(
        AlertChange(2, ChangeKind.RESOLVED, make_alert(labels, starts_at=at(0)), at(60))
    )
    assert channels_of(resolved.drafts) == ["feishu", "sheet", "console"]
    assert {d.priority for d in resolved.drafts} == {Priority.P0}
    assert resolved.drafts[0].payload["status"] == "resolved"
    assert resolved.drafts[0].payload["rule_id"] == "blast-radius"


def test_recurrence_is_shown_not_paged() -> None:
    gw = Gateway()
    gw.send(fire(0, labels=P0_LABELS))
    gw.send(resolve(60, 0))
    recurred = gw.send(fire(300, labels=P0_LABELS))
    assert channels_of(recurred.drafts) == ["feishu", "sheet", "console"]
    assert recurred.drafts[0].payload["event"] == "recurrence"
    assert recurred.drafts[0].payload["count"] == 2  # the second time it fires


def test_flapping_notice_then_held_resolution_released_by_tick() -> None:
    gw = Gateway()
    gw.send(fire(0, labels=P2_LABELS))
    gw.send(resolve(60, 0))
    gw.send(fire(120, labels=P2_LABELS))
    flapping = gw.send(resolve(180, 120))
    assert [d.payload["event"] for d in flapping.drafts] == ["flapping"] * 3
    assert flapping.drafts[0].payload["count"] == 4
    assert flapping.drafts[0].payload["status"] == "firing"  # not resolved until the hold ends
    assert flapping.drafts[0].payload["held_until"] == at(180 + 600).isoformat()
    assert gw.tick(700) == []
    released = gw.tick(800)
    assert [d.payload["event"] for d in released] == ["resolved"] * 3
    assert released[0].payload["labels"]["alertname"] == "GPUHot"  # from the remembered context
    assert released[0].payload["status"] == "resolved"
    assert gw.tick(900) == []
    keys = [d.idempotency_key for d in gw.drafts]
    assert len(keys) == len(set(keys))


def test_the_storm_card_goes_out_only_once_something_is_folded() -> None:
    """One incident of 25 alerts (one cause, 25 nodes) puts the job in storm mode, yet
    nothing is folded: its own card speaks for every alert, so no storm card. The first
    incident folded into the storm brings the storm's start card with it."""
    gw = Gateway(merge_policy(POLICY, {"storm": {"threshold": 20, "summary_interval": 60}}))
    for i in range(25):
        gw.send(fire(i, fingerprint=f"fp-{i}", labels={**P2_LABELS, "node": f"n{i}"}))
    assert gw.storms[job_key(make_alert().labels)]["active"]
    assert {d.kind for d in gw.drafts} == {"alert"}, Counter(d.payload["event"] for d in gw.drafts)
    assert {d.kind for d in gw.tick(300)} == {"alert"}  # the incident's follow-up alone
    folded = gw.send(fire(30, fingerprint="fp-x", labels={**P2_LABELS, "alertname": "Disk"}))
    assert [d.payload["event"] for d in folded.drafts] == ["storm_started"] * 3
    assert folded.collapsed == 1
    assert folded.drafts[0].payload["storm"]["total"] >= 21


def test_storm_folds_new_incidents_and_a_new_cause_pages_on_its_own() -> None:
    """Issue 34: during a storm a new incident is folded into the summary, unless it pages:
    the first P0, or a P0 of another cause than the storm's bulk (once per cause), which
    gets its own card and page at once and is still counted in the summary. Incidents
    announced before the storm keep their own cards."""
    policy = merge_policy(POLICY, {"storm": {"threshold": 3, "summary_interval": 30}})
    gw = Gateway(policy)

    def hot(i: int) -> AlertChange:  # a P2 of its own cause (alertname) on its own node
        labels = {**P2_LABELS, "alertname": f"GPUHot{i % 2}", "node": f"n{i}"}
        return fire(i, fingerprint=f"fp-{i}", labels=labels)

    assert [d.payload["event"] for d in gw.send(hot(0)).drafts] == ["firing"] * 3
    assert [d.payload["event"] for d in gw.send(hot(1)).drafts] == ["firing"] * 3
    assert gw.send(hot(2)).drafts == []  # joins GPUHot0's incident: a follow-up, later
    entering = gw.send(hot(3))  # the fourth new alert: the storm starts
    assert entering.drafts == []  # nothing folded yet: no storm card
    assert entering.storm_state.active and entering.storm_state.bulk == "GPUHot0/"
    folded = gw.send(fire(4, fingerprint="fp-4", labels={**P2_LABELS, "alertname": "Disk"}))
    assert folded.collapsed == 1  # a new incident, folded: the storm's start is announced
    assert [d.payload["event"] for d in folded.drafts] == ["storm_started"] * 3
    page = gw.send(fire(5, fingerprint="fp-5", labels={**P0_LABELS, "node": "n5"}))
    assert channels_of(page.drafts) == ["feishu", "phone", "sheet", "console"]
    assert "pages on its own" in page.drafts[0].payload["incident"]["note"]
    # the same incident again: no second page, no new card
    assert gw.send(fire(6, fingerprint="fp-6", labels={**P0_LABELS, "node": "n6"})).drafts == []
    other = gw.send(fire(7, fingerprint="fp-7", labels={**P0_LABELS, "alertname": "NodeDown"}))
    assert "phone" in channels_of(other.drafts), "another new cause pages on its own too"
    # An incident announced before the storm resolves on its own card, storm or not.
    assert gw.send(resolve(8, 1, fingerprint="fp-1")).drafts == []  # one of its two alerts
    alone = gw.send(resolve(9, 3, fingerprint="fp-3"))  # its last: the incident resolves
    assert [d.payload["event"] for d in alone.drafts] == ["resolved"] * 3
    assert alone.drafts[0].payload["incident"]["alerts"] == 2
    summary = gw.tick(40)
    assert [d.payload["event"] for d in summary] == ["storm_summary"] * 3
    storm = summary[0].payload["storm"]
    # the folded incident and the two pages sent on their own (still counted)
    assert (storm["total"], storm["firing"], storm["resolved"]) == (3, 3, 0)
    assert sorted(name.split(" ", 1)[1] for name in storm["by_incident"]) == [
        "Disk", "GPUFellOffBus", "NodeDown"
    ]  # fmt: skip
    assert "phone" not in channels_of(summary)
    assert gw.tick(200) == [], "the storm ends: nothing was collected since, no empty card"
    # After the storm: the folded incident's resolve is summarised, not sent alone.
    late = gw.send(resolve(300, 4, fingerprint="fp-4"))
    assert late.drafts == [] and late.collapsed == 1
    later = gw.tick(400)
    assert [d.payload["storm"]["resolved"] for d in later if d.kind == "storm"] == [1, 1, 1]
    # GPUHot0's and GPUFellOffBus' incidents gained an alert each: one follow-up card each
    # per channel, 300 s (follow_up_interval) after their first
    follow_up = [d for d in later if d.kind == "alert"]
    assert len(follow_up) == 6 and {d.payload["incident"]["alerts"] for d in follow_up} == {2}
    assert {d.payload["alertname"] for d in follow_up} == {"GPUHot0", "GPUFellOffBus"}
    keys = [d.idempotency_key for d in gw.drafts]
    assert len(keys) == len(set(keys))


def test_storm_state_of_another_job_is_refused() -> None:
    other = StormState.new({"namespace": "x", "trainingjob": "other"})
    with pytest.raises(ValueError, match="other"):
        decide(fire(0), fingerprint_state=None, storm_state=other, distinct_nodes_in_window=1,
               policy=POLICY, now=at(0))  # fmt: skip


def test_unconfigured_channels_are_reported() -> None:
    gw = Gateway(channels={"feishu"})
    result = gw.send(fire(0, labels=P0_LABELS))
    assert channels_of(result.drafts) == ["feishu"]
    # the archive is optional: when configured it takes every change by itself (policy_plan)
    assert result.unconfigured == ("phone",)


def test_p3_goes_to_the_sheet_only() -> None:
    result = Gateway().send(fire(0, labels={**P2_LABELS, "priority": "P3"}))
    assert channels_of(result.drafts) == ["sheet", "console"]


def test_alert_json_round_trip() -> None:
    alert = make_alert({"a": "b"}, ends_at=at(5))
    assert alert_from_json(json.loads(json.dumps(alert_to_json(alert)))) == alert


def test_metrics_count_decisions() -> None:
    registry = CollectorRegistry()
    metrics = PolicyMetrics(registry)
    gw = Gateway(merge_policy(POLICY, {"storm": {"threshold": 1}}))
    metrics.observe(gw.send(fire(0, labels=P0_LABELS)))
    metrics.observe(gw.send(fire(10, 0, labels=P0_LABELS)))
    metrics.observe(gw.send(fire(11, fingerprint="fp-2", labels=P2_LABELS)))
    metrics.observe(gw.send(fire(12, fingerprint="fp-3", labels=P2_LABELS)))

    def value(name: str, **labels: str) -> float:
        found = registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    assert value("trainsentry_alerts_classified_total", priority="P0") == 2
    assert value("trainsentry_notifications_suppressed_total", reason="repeat") == 1
    assert value("trainsentry_notifications_suppressed_total", reason="storm") == 2
    assert value("trainsentry_storms_total") == 1
    assert value("trainsentry_notifications_drafted_total", channel="phone", kind="alert") == 1
    assert value("trainsentry_policy_notices_total", notice="firing") == 3
