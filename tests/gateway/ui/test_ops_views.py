"""The pure views of the On call, Silences and windows, Nodes and History pages
(gateway/ui/ops_views.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from tests.support.oncall_gateway import ONCALL
from trainsentry.gateway.policy.cordon import NodeDecision, Status
from trainsentry.gateway.policy.health import NodeHealth
from trainsentry.gateway.policy.infra import InfraState
from trainsentry.gateway.ui.ops_views import (
    history,
    nodes_page,
    schedule_view,
    silences,
    window_request,
)
from trainsentry.gateway.ui.views import BadQuery
from trainsentry.oncall.config import parse_oncall
from trainsentry.store.console_incidents import IncidentSummary
from trainsentry.store.oncall_overrides import StoredChange

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)  # a Friday, 04:00 in Berlin


def test_a_window_form_becomes_the_apis_request() -> None:
    form = {"matchers": " node=gpu-7 \n\nalertname~GPU.*\n", "minutes": "90", "reason": " x "}
    body = window_request(form, "kim", NOW)
    assert body == {
        "matchers": {"node": "gpu-7", "alertname": {"regex": "GPU.*"}},
        "starts_at": "2026-11-20T03:00:00",  # now, local to the time zone (UTC)
        "ends_at": "2026-11-20T04:30:00",
        "timezone": "UTC",
        "reason": "x",
        "created_by": "kim",
    }
    berlin = window_request({**form, "timezone": "Europe/Berlin"}, "kim", NOW)
    assert berlin["starts_at"] == "2026-11-20T04:00:00"
    given = window_request(
        {"matchers": "rack=r7", "starts_at": "2026-11-21T01:00", "ends_at": "2026-11-21T02:00"},
        "kim",
        NOW,
    )
    assert (given["starts_at"], given["ends_at"]) == ("2026-11-21T01:00", "2026-11-21T02:00")


@pytest.mark.parametrize(
    ("form", "reason"),
    [
        ({"matchers": "", "minutes": "5"}, "matchers: one a line"),
        ({"matchers": "node=a\nnonsense", "minutes": "5"}, "line 2"),
        ({"matchers": "node=a"}, "an end or a length"),
        ({"matchers": "node=a", "minutes": "5", "ends_at": "2026-11-21T01:00"}, "one of them"),
        ({"matchers": "node=a", "minutes": "0"}, "minutes must be"),
        ({"matchers": "node=a", "minutes": "5", "timezone": "Mars/Olympus"}, "timezone"),
        ({"matchers": "node=a", "minutes": "5", "starts_at": "soon"}, "starts_at"),
        ({"matchers": "\n".join(f"l{i}=v" for i in range(33)), "minutes": "5"}, "at most 32"),
    ],
)
def test_a_window_form_that_makes_no_request_names_its_field(
    form: dict[str, str], reason: str
) -> None:
    with pytest.raises(BadQuery, match=reason):
        window_request(form, "kim", NOW)


def test_silences_that_ran_out_are_not_listed() -> None:
    def made(minutes_ago: int, seconds: object, silence_id: str = "s") -> dict[str, object]:
        return {
            "alert_id": 7, "at": NOW - timedelta(minutes=minutes_ago),
            "detail": {"by": "lee", "silence_id": silence_id, "seconds": seconds},
            "alertname": "GPUXidError", "node": "gpu-1", "job_namespace": "ml", "job_name": "j",
        }  # fmt: skip

    rows = silences(
        [made(10, 3600, "live"), made(120, 3600, "over"), made(1, "junk"), made(1, 60, "")], NOW
    )
    assert [(r.silence_id, r.until, r.job) for r in rows] == [
        ("live", NOW + timedelta(minutes=50), "ml/j")
    ]


def summary(incident_id: int, acked: datetime | None, by: str | None) -> IncidentSummary:
    return IncidentSummary(
        id=incident_id, status="resolved", priority="P1", job="ml/llama", cause="GPUXidError/gpu",
        cause_alert_id=None, alerts_total=192, alerts_firing=0, opened_at=NOW,
        updated_at=NOW, resolved_at=NOW + timedelta(hours=3, minutes=10), acked_at=acked,
        acked_by=by, nodes=0, gpus=0, page_alert_id=None, note="", alertname="GPUXidError",
    )  # fmt: skip


def test_history_says_how_long_and_after_how_long_who_acknowledged() -> None:
    acked, silent = history(
        [summary(2, NOW + timedelta(minutes=4, seconds=30), "ann"), summary(1, None, "x")],
        {},
        NOW + timedelta(days=1),
    )
    assert (acked.duration, acked.to_ack, acked.acked_by) == ("3 h 10 min", "4 min", "ann")
    assert (silent.to_ack, silent.acked_by, silent.more) == ("", None, 192)


def test_nodes_waiting_for_a_decision_come_first_with_their_incidents() -> None:
    sick = NodeHealth("gpu-1", 30.0, {"fell_off_bus": 3}, {"5": 30.0}, NOW)
    mild = NodeHealth("gpu-2", 4.0, {"xid": 1})
    decisions = {"gpu-9": NodeDecision(Status.CORDONED, NOW, by="alice")}
    rack = InfraState("rack=r7", "rack", "r7", open=True, nodes=("gpu-2", "gpu-9"))
    closed = InfraState("rack=r8", "rack", "r8", open=False, nodes=("gpu-1",))
    view = nodes_page(
        [sick, mild], {"gpu-2": {"rack": "r7"}}, decisions, {"gpu-2": [4]},
        {4: summary(4, None, None)}, [rack, closed],
        half_life_s=3600, cordon="approve", threshold=20.0,
    )  # fmt: skip
    assert [row.node for row in view.nodes] == ["gpu-9", "gpu-1", "gpu-2"]
    cordoned, first, second = view.nodes
    assert (cordoned.cordon, cordoned.cordon_by, cordoned.score) == ("cordoned", "alice", 0.0)
    assert (first.faults, first.gpus) == ("fell_off_bus 3", "5 (30.0)")
    assert second.incidents == [(4, "P1", "GPUXidError/gpu")] and second.place == "rack=r7"
    assert second.infra == ["rack=r7"] and first.infra == []
    assert [row.key for row in view.infra] == ["rack=r7"]


def test_a_schedule_says_who_is_on_call_now_and_next_and_its_overrides() -> None:
    config = parse_oncall(yaml.safe_load(ONCALL))
    configured = config.schedules["gpu-infra"]
    stored = [
        StoredChange(
            1, "gpu-infra", "override", "bob", None, NOW + timedelta(days=1),
            NOW + timedelta(days=2), "offsite", "ivy", NOW,
        ),
        StoredChange(
            2, "gpu-infra", "override", "bob", None, NOW - timedelta(days=2),
            NOW - timedelta(days=1), "over", "ivy", NOW,
        ),
    ]  # fmt: skip
    view = schedule_view(configured, configured, stored, NOW)
    assert [(p.name, p.layer) for p in view.now] == [("alice", "primary"), ("bob", "backup")]
    assert view.next_at == datetime(2026, 11, 23, 8, 0, tzinfo=UTC)  # Monday 09:00 Berlin
    assert [p.name for p in view.next] == ["carol", "bob"]
    assert [(row.name, row.now, row.shift) for row in view.layers] == [
        ("backup", "bob", "1 w"),
        ("primary", "alice", "1 w"),
    ]
    [override] = view.overrides  # the one over already is not listed
    assert (override.id, override.who, override.active) == (1, "bob", False)
