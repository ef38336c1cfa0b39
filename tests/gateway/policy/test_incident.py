"""Incidents (gateway/policy/incident.py, incident_cards.py), pure: what `policy.grouping`
groups, a new cause apart, the priority of the most urgent alert, and what each kind of
channel is told: the card, redraws in place, a new card on a change of state or priority,
follow-ups at most once per interval, one page."""

from __future__ import annotations

import pytest

from tests.gateway.policy.factory import at, fire, make_alert, resolve
from tests.gateway.policy.planned import DecideResult, decide
from trainsentry.alerts import AlertChange, NotificationDraft, Priority
from trainsentry.gateway.policy.incident import IncidentBook, cause_of
from trainsentry.gateway.policy.incident_cards import incident_block
from trainsentry.gateway.policy.rules import Policy, PolicyError, load_policy, merge_policy

POLICY = load_policy()
DISK = {"alertname": "DiskFull", "priority": "P1", "component": "node"}
GROUP = '{}/{priority="P1"}:{alertname="DiskFull", namespace="team-a", trainingjob="llm"}'


def grouped(change: AlertChange, group_key: str = GROUP) -> AlertChange:
    return AlertChange(change.alert_id, change.kind, change.alert, change.at, group_key)


class Gateway:
    """decide() with the fingerprints' states and one book of incidents kept across calls."""

    def __init__(self, policy: Policy = POLICY, updatable: tuple[str, ...] = ()) -> None:
        self.policy = policy
        self.book = IncidentBook(policy)
        self.fps: dict[str, object] = {}
        self.updatable = updatable

    def send(self, change: AlertChange, nodes: int = 1) -> DecideResult:
        result = decide(
            change,
            fingerprint_state=self.fps.get(change.alert.fingerprint),  # type: ignore[arg-type]
            storm_state=None,
            distinct_nodes_in_window=nodes,
            policy=self.policy,
            now=change.at,
            channels={"feishu_bot", "feishu_app", "phone", "console"},
            incidents=self.book,
            updatable=self.updatable,
        )
        self.fps[change.alert.fingerprint] = result.fingerprint_state
        return result


def on(drafts: list[NotificationDraft], channel: str) -> list[NotificationDraft]:
    return [d for d in drafts if d.channel == channel]


def disk(i: int, when: float, **labels: str) -> AlertChange:
    return grouped(fire(when, fingerprint=f"d{i}", labels={**DISK, "node": f"n{i:02d}", **labels}))


@pytest.mark.parametrize(
    ("by", "incidents"),
    [("group_key", 1), ("alertname", 2), ("alert", 3)],
)
def test_grouping_says_what_an_incident_holds(by: str, incidents: int) -> None:
    gw = Gateway(merge_policy(POLICY, {"grouping": {"by": by}}))
    gw.send(disk(1, 0))
    gw.send(disk(2, 1))
    gw.send(disk(3, 2, alertname="DiskSlow"))  # same group, another alertname (not P0)
    assert len(gw.book.by_id) == incidents
    assert len(gw.book.members) == 3, "every alert in one"


def test_a_p0_of_another_cause_in_the_group_opens_its_own_incident_and_pages() -> None:
    gw = Gateway()
    gw.send(disk(1, 0))
    paged = gw.send(disk(2, 1, alertname="GPUFellOffBus", priority="P0", component="gpu"))
    assert len(gw.book.by_id) == 2
    assert [d.payload["alertname"] for d in on(paged.drafts, "phone")] == ["GPUFellOffBus"]
    # the same cause again (P0): it joins the first incident of that cause, no second page
    again = gw.send(disk(3, 2, alertname="GPUFellOffBus", priority="P0", component="gpu"))
    assert len(gw.book.by_id) == 2 and on(again.drafts, "phone") == []
    assert cause_of(make_alert({"alertname": "X", "component": "gpu"})) == "X/gpu"


def test_the_most_urgent_alert_sets_the_priority_and_the_blast_raise_counts_once() -> None:
    gw = Gateway()
    first = gw.send(disk(1, 0))
    assert on(first.drafts, "feishu_bot")[0].priority is Priority.P1 and not on(
        first.drafts, "phone"
    )
    # the eighth node: blast radius raises DiskFull to P0, so the incident, once: one page
    raised = gw.send(disk(2, 1), nodes=8)
    assert [d.priority for d in on(raised.drafts, "feishu_bot")] == [Priority.P0]
    assert len(on(raised.drafts, "phone")) == 1
    for i in range(3, 12):
        assert on(gw.send(disk(i, i), nodes=8 + i).drafts, "phone") == []
    [state] = gw.book.by_id.values()
    assert state.priority is Priority.P0 and state.total == 11


def test_a_bot_gets_a_card_on_a_change_of_state_and_one_follow_up_per_interval() -> None:
    gw = Gateway(merge_policy(POLICY, {"grouping": {"follow_up_interval": 60}}))
    assert len(on(gw.send(disk(1, 0)).drafts, "feishu_bot")) == 1
    for i in range(2, 6):  # four more nodes within the interval: no card per alert
        assert on(gw.send(disk(i, i)).drafts, "feishu_bot") == []
    [state] = gw.book.by_id.values()
    assert state.due_at == at(60), "a follow-up is due an interval after the card"
    follow = on(gw.send(disk(6, 61)).drafts, "feishu_bot")
    assert [d.payload["incident"]["nodes"] for d in follow] == [6]
    # resolving: counts change quietly until the last, whose resolution is a card at once
    for i in range(1, 6):  # each resolve names the occurrence that fired (d1's started at 0)
        fired = 0 if i == 1 else i
        change = grouped(resolve(70 + i, fired, fingerprint=f"d{i}"))
        assert on(gw.send(change).drafts, "feishu_bot") == []
    last = on(gw.send(grouped(resolve(80, 61, fingerprint="d6"))).drafts, "feishu_bot")
    assert [d.payload["status"] for d in last] == ["resolved"]
    assert last[0].payload["incident"] == {**last[0].payload["incident"], "firing": 0}


def test_the_app_redraws_its_card_at_each_change_and_resolution_is_an_update() -> None:
    gw = Gateway(updatable=("feishu_app",))
    first = on(gw.send(disk(1, 0)).drafts, "feishu_app")
    assert len(first) == 1 and "redraw" not in first[0].payload
    more = on(gw.send(disk(2, 1)).drafts, "feishu_app")
    assert [d.payload.get("redraw") for d in more] == [True]
    assert more[0].group_key == first[0].group_key  # found by the group, in order
    gw.send(grouped(resolve(5, 0, fingerprint="d1")))
    done = on(gw.send(grouped(resolve(6, 1, fingerprint="d2"))).drafts, "feishu_app")
    assert [(d.payload["status"], d.payload.get("redraw")) for d in done] == [("resolved", True)]


def test_a_card_names_the_first_nodes_and_says_how_many_more() -> None:
    policy = merge_policy(
        POLICY, {"grouping": {"names_shown": 3, "url": "https://ts/i/{incident}"}}
    )
    gw = Gateway(policy)
    for i in range(1, 7):
        gw.send(disk(i, i))
    [state] = gw.book.by_id.values()
    block = incident_block(state, policy)
    assert (block["alerts"], block["firing"], block["nodes"]) == (6, 6, 6)
    assert block["node_names"] == ["n01", "n02", "n03"]
    assert block["url"] == f"https://ts/i/{state.id}"


def test_an_incident_counts_hca_ports_as_ports_not_gpus() -> None:
    """Issue 44: IB alerts carry `device` (an HCA) and `port`; "GPUs: 24" counted HCAs."""
    gw = Gateway()
    link = {"alertname": "IBPhysicalLinkDown", "priority": "P1", "component": "fabric"}
    for i in range(3):
        for hca in ("mlx5_0", "mlx5_1"):
            labels = {**link, "node": f"n{i}", "device": hca, "port": "1"}
            gw.send(grouped(fire(i, fingerprint=f"ib{i}{hca}", labels=labels)))
    [state] = gw.book.by_id.values()
    block = incident_block(state, POLICY)
    assert (block["nodes"], block["gpus"], block["ports"]) == (3, 0, 6)
    assert block["port_names"][0] == "n0 mlx5_0 port 1"


def test_the_url_may_use_only_its_placeholders() -> None:
    with pytest.raises(PolicyError, match="incident"):
        load_policy(overrides={"grouping": {"url": "https://ts/{job}"}})


def test_an_incident_of_several_kinds_and_mountpoints_counts_them_on_its_card() -> None:
    """Issue 47: a card of several alertnames/mountpoints/nodes leads with what they share and
    counts the rest, never with one alert's kind or mountpoint."""
    from trainsentry.gateway.policy.incident_cards import incident_payload
    from trainsentry.notifiers.feishu.incident_card import shared_headline

    gw = Gateway()
    for i, (name, mount) in enumerate(
        [("DiskFull", "/data"), ("DiskFull", "/scratch"), ("InodesLow", "/data")]
    ):
        labels = {**DISK, "alertname": name, "node": f"n{i:02d}", "mountpoint": mount}
        gw.send(grouped(fire(i, fingerprint=f"k{i}", labels=labels)))
    [state] = gw.book.by_id.values()
    block = incident_block(state, POLICY)
    assert (block["alertnames"], block["mountpoints"], block["nodes"]) == (2, 2, 3)
    assert block["alertname_names"] == ["DiskFull", "InodesLow"]
    headline = shared_headline(incident_payload(state, POLICY, "default"))  # type: ignore[arg-type]
    assert headline == (
        "DiskFull and 1 other kind of alert on 2 mountpoints of 3 nodes: 3 of 3 alerts firing"
    ), headline
