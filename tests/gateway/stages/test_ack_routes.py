"""Where an ack is shown (`ack_routes`, pure): the way the alert's cards went."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from trainsentry.gateway.stages.services.ack import AckRoute, ack_routes
from trainsentry.gateway.stages.services.ackers import Acker, known_acker
from trainsentry.gateway.stages.services.silences import incident_silences
from trainsentry.store.cards import CardRow

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
ALL = ("console", "feishu_app", "feishu_bot", "feishu_job", "phone")
JOB = {"job": "team-a/a", "fallback": ["feishu_app"], "owners": ["ou_bob"]}


def card(
    nid: int,
    channel: str,
    status: str = "sent",
    *,
    provider_id: str | None = None,
    age: timedelta = timedelta(minutes=5),
    job_route: dict[str, object] | None = None,
) -> CardRow:
    sent = NOW - age if status == "sent" else None
    return CardRow(nid, channel, status, sent, provider_id, job_route)


def test_the_newest_sent_card_is_redrawn_within_feishus_14_days() -> None:
    cards = [  # newest first, as the store reads them
        card(5, "feishu_app", "pending"),
        card(4, "feishu_app", provider_id="om_new"),
        card(3, "feishu_app", provider_id="om_old"),
        card(2, "console", provider_id="2"),
    ]
    assert ack_routes(cards, ALL, NOW) == [
        AckRoute("console"),  # the console redraws nothing in Feishu
        AckRoute("feishu_app", "om_new"),
    ]
    stale = [card(4, "feishu_app", provider_id="om_old", age=timedelta(days=14))]
    assert ack_routes(stale, ALL, NOW) == [AckRoute("console"), AckRoute("feishu_app")]


def test_a_job_routed_alert_is_acked_on_its_route_only_without_mentions() -> None:
    cards = [card(2, "feishu_job", provider_id="om_job", job_route=JOB), card(1, "console")]
    assert ack_routes(cards, ALL, NOW) == [
        AckRoute("console"),
        AckRoute("feishu_job", "om_job", {**JOB, "owners": []}),
    ]


def test_channels_whose_cards_were_withdrawn_or_that_are_gone_hear_nothing() -> None:
    cards = [card(3, "feishu_bot", "cancelled"), card(2, "feishu_app", "dead")]
    assert ack_routes(cards, ALL, NOW) == [AckRoute("console"), AckRoute("feishu_app")]
    assert ack_routes(cards, ("console", "feishu_bot"), NOW) == [AckRoute("console")]


def test_an_alert_without_card_rows_is_acked_on_every_chat_channel_but_a_jobs() -> None:
    assert ack_routes([], ALL, NOW) == [
        AckRoute("console"),
        AckRoute("feishu_app"),
        AckRoute("feishu_bot"),
    ]


def test_an_incidents_silences_match_what_its_alerts_share_per_alertname() -> None:
    """`incident_silences` (pure): one label set per alertname, the labels all its alerts of
    that alertname share; empty values left out; at most `cap` silences."""
    disk = [
        {"alertname": "Disk", "job": "a", "node": f"n{i}", "mount": "/ckpt", "team": ""}
        for i in range(3)
    ]
    oom = [{"alertname": "OOM", "job": "a", "node": "n9"}]
    hang = [{"alertname": "Hang", "job": "a", "rank": str(i)} for i in range(3)]
    assert incident_silences([*disk, *oom, *hang]) == [
        # alerts naming a node: per node (issue 43: the next node still pages)
        *({"alertname": "Disk", "job": "a", "node": f"n{i}", "mount": "/ckpt"} for i in range(3)),
        {"alertname": "Hang", "job": "a"},  # no node: what they share
        {"alertname": "OOM", "job": "a", "node": "n9"},  # a lone alert: all its labels
    ]
    gpus = [{"alertname": "Xid", "node": "n1", "gpu": g} for g in ("3", "5")]
    assert incident_silences(gpus) == [{"alertname": "Xid", "node": "n1"}]
    many = [{"alertname": f"A{i:02d}"} for i in range(30)]
    assert [s["alertname"] for s in incident_silences(many, cap=2)] == ["A00", "A01"]
    assert incident_silences([{"node": "n1"}]) == []  # no alertname: nothing to match safely


def test_an_incidents_silences_stay_per_node_under_the_configured_node_label() -> None:
    """With `policy.node_labels` naming another label (here `kubernetes_node`), the silences
    are still one per node: grouped by alertname alone, two nodes' alerts would share no node
    label and the silence would match every node's alert of that name (the next node's
    fault muted; issue 45's one node, issue 43's failure domain)."""
    xids = [{"alertname": "Xid", "kubernetes_node": n, "gpu": "0"} for n in ("n1", "n2")]
    assert incident_silences(xids, node_labels=("kubernetes_node",)) == [
        {"alertname": "Xid", "kubernetes_node": "n1", "gpu": "0"},
        {"alertname": "Xid", "kubernetes_node": "n2", "gpu": "0"},
    ]


def test_who_acknowledged_as_the_configuration_names_them() -> None:
    """`known_acker` (pure): an open_id or a name of a configured person is that person's
    name and configured open_id; a job owner's open_id is mentioned as itself; anyone else
    is what they gave, nothing to mention (a malformed configured id is never mentioned)."""
    people = [("Ana Li", "ou_ana"), ("ben", ""), ("eve", "<at id=all></at>")]
    assert known_acker("ou_ana", people) == Acker("Ana Li", "ou_ana")
    assert known_acker("Ana Li", people) == Acker("Ana Li", "ou_ana")
    assert known_acker("ben", people) == Acker("ben")  # no open_id configured
    assert known_acker("eve", people) == Acker("eve")
    assert known_acker("ou_owner", people, owners=["ou_owner"]) == Acker("ou_owner", "ou_owner")
    assert known_acker("ou_stranger", people, owners=["ou_owner"]) == Acker("ou_stranger")
    assert known_acker("all", people) == Acker("all")
