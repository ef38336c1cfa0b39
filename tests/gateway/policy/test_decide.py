"""decide()/decide_tick(): drafts, channels, payloads, idempotency keys, storms, metrics."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from tests.gateway.policy.factory import at, fire, make_alert, resolve
from trainsentry.alerts import AlertChange, ChangeKind, NotificationDraft, Priority
from trainsentry.gateway.metrics import PolicyMetrics
from trainsentry.gateway.policy.decide import DecideResult, decide, decide_tick
from trainsentry.gateway.policy.dedup import FingerprintState
from trainsentry.gateway.policy.payload import alert_from_json, alert_to_json
from trainsentry.gateway.policy.rules import Policy, load_policy, merge_policy
from trainsentry.gateway.policy.storm import StormState, job_key

POLICY = load_policy()
CHANNELS = {"feishu", "phone", "sheet", "console"}
P0_LABELS = {"alertname": "GPUFellOffBus", "priority": "P0", "node": "n1", "gpu": "3"}
P2_LABELS = {"alertname": "GPUHot", "priority": "P2", "node": "n1", "gpu": "3"}


class Gateway:
    """Plays the lead's intake: loads states, calls decide, persists states as JSON."""

    def __init__(self, policy: Policy = POLICY, channels: set[str] | None = None) -> None:
        self.policy = policy
        self.channels = CHANNELS if channels is None else channels
        self.fingerprints: dict[str, dict[str, object]] = {}
        self.storms: dict[str, dict[str, object]] = {}
        self.drafts: list[NotificationDraft] = []

    def send(self, change: AlertChange, nodes: int = 1) -> DecideResult:
        fp = self.fingerprints.get(change.alert.fingerprint)
        key = job_key(change.alert.labels)
        storm = self.storms.get(key)
        result = decide(
            change,
            fingerprint_state=FingerprintState.from_json(fp) if fp else None,
            storm_state=StormState.from_json(storm) if storm else None,
            distinct_nodes_in_window=nodes,
            policy=self.policy,
            now=change.at,
            channels=self.channels,
        )
        self.fingerprints[change.alert.fingerprint] = json.loads(
            json.dumps(result.fingerprint_state.to_json())
        )
        self.storms[key] = json.loads(json.dumps(result.storm_state.to_json()))
        self.drafts.extend(result.drafts)
        return result

    def tick(self, seconds: float) -> list[NotificationDraft]:
        result = decide_tick(
            [FingerprintState.from_json(s) for s in self.fingerprints.values()],
            [StormState.from_json(s) for s in self.storms.values()],
            policy=self.policy,
            now=at(seconds),
            channels=self.channels,
        )
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
    assert draft.group_key == "alert:fp-1"
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
    payload_mod = pytest.importorskip("trainsentry.notifiers.payload")
    gw = Gateway(merge_policy(POLICY, {"storm": {"threshold": 2}}))
    for i in range(6):
        gw.send(fire(i, fingerprint=f"fp-{i}", labels={**P2_LABELS, "node": f"n{i}"}))
    gw.send(resolve(10, 0, fingerprint="fp-0"))
    gw.tick(500)
    kinds = Counter(d.payload["event"] for d in gw.drafts)
    assert {"firing", "storm_started", "storm_ended"} <= set(kinds)
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


def test_storm_pages_p0_once_per_job_and_summarises_the_rest() -> None:
    policy = merge_policy(POLICY, {"storm": {"threshold": 3, "summary_interval": 30}})
    gw = Gateway(policy)
    for i in range(3):  # up to S: one by one
        result = gw.send(fire(i, fingerprint=f"fp-{i}", labels={**P2_LABELS, "node": f"n{i}"}))
        assert [d.payload["event"] for d in result.drafts] == ["firing"] * 3
    entering = gw.send(fire(3, fingerprint="fp-3", labels={**P2_LABELS, "node": "n3"}))
    assert [d.payload["event"] for d in entering.drafts] == ["storm_started"] * 3
    assert entering.collapsed == 1 and entering.storm_state.active
    page = gw.send(fire(4, fingerprint="fp-4", labels={**P0_LABELS, "node": "n4"}))
    assert channels_of(page.drafts) == ["feishu", "phone", "sheet", "console"]
    assert page.drafts[0].payload["storm"]["episode"] == entering.storm_state.episode
    second_p0 = gw.send(fire(5, fingerprint="fp-5", labels={**P0_LABELS, "node": "n5"}))
    assert second_p0.drafts == [] and second_p0.collapsed == 1
    # An alert announced on its own before the storm resolves inside it: folded too.
    assert gw.send(resolve(6, 0, fingerprint="fp-0")).collapsed == 1
    summary = gw.tick(40)
    assert [d.payload["event"] for d in summary] == ["storm_summary"] * 3
    storm = summary[0].payload["storm"]
    assert (storm["total"], storm["firing"], storm["resolved"]) == (3, 2, 1)
    assert storm["by_priority"] == {"P0": 1, "P2": 2}
    assert summary[0].priority is Priority.P0 and "phone" not in channels_of(summary)
    ended = gw.tick(200)
    assert [d.payload["event"] for d in ended] == ["storm_ended"] * 3
    # After the storm: a collapsed alert's resolve is summarised, not sent alone.
    late = gw.send(resolve(300, 3, fingerprint="fp-3"))
    assert late.drafts == [] and late.collapsed == 1
    assert [d.payload["storm"]["resolved"] for d in gw.tick(400)] == [1, 1, 1]
    # An alert announced on its own resolves on its own once the storm is over.
    alone = gw.send(resolve(500, 1, fingerprint="fp-1"))
    assert [d.payload["event"] for d in alone.drafts] == ["resolved"] * 3
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
