"""Infrastructure incidents, planned for real: alerts stored by the intake (SQLite and the
real PostgreSQL), the policy worker with the shipped policy and a topology, the outbox rows
it writes read back.

Six nodes of three jobs under one leaf switch lose their IB link (the chart's cluster-wide
rule's alerts: trusted evidence): one incident card to the infrastructure route naming the
switch, one page; each job whose own alert of a node joins says so gets one notice. The
same six nodes under six switches: each alert handled on its own, as without a topology.
A team's own copies of the alerts (its namespace) count no node (issue 43).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.config import MaintenanceSettings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.metrics import PolicyMetrics
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.policy.topology import Topology, from_settings
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.steps import plan_steps
from trainsentry.gateway.stages.planning.ticker import Ticker
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.gateway.stages.services.maintenance import MaintenanceService
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload
from trainsentry.store.queries import get_alert
from trainsentry.store.schema import alerts, notifications
from trainsentry.store.writes import record_receipts

CHANNELS = ("feishu", "phone", "sheet")
# The infrastructure route: incident cards go to their own chat (and the phone for a P0).
INFRA_ROUTE = {
    "routing": {
        "routes": [
            {
                "id": "infra",
                "labels": {"scope": "infrastructure"},
                "channels": ["feishu", "phone"],
            }
        ]
    }
}
NODES = [f"gpu-node-{i}" for i in range(6)]
JOBS = ["llama", "mixtral", "bert"]  # two nodes each


def topology(switches: int) -> Topology:
    """The six nodes under `switches` leaf switches (1: all under leaf-7), racks by three."""
    nodes = {
        node: {"leaf_switch": f"leaf-{7 if switches == 1 else i}", "rack": f"r{i // 3}"}
        for i, node in enumerate(NODES)
    }
    return from_settings(
        TopologySettings.model_validate({"levels": ["leaf_switch", "rack"], "nodes": nodes})
    )


def link_down(i: int, status: str = "firing", *, job: bool = False) -> dict[str, Any]:
    """Node i's port down as the chart's cluster-wide rule raises it (no namespace: trusted
    evidence), or (`job`) as its job's own rule in namespace `ml` does."""
    alert = make_alert(
        i + (100 if job else 0),
        status=status,
        name="IBPhysicalLinkDown",
        labels={
            "node": NODES[i],
            "trainingjob": JOBS[i // 2],
            "priority": "P0",
            "component": "fabric",
            "device": "mlx5_0",
        },
        starts_at=BASE_TIME + timedelta(seconds=i),
    )
    if not job:
        del alert["labels"]["namespace"], alert["labels"]["trainingjob"]
    return alert


def stalled(i: int) -> dict[str, Any]:
    """The job on node i says its rank there stalled: a consequence of the node's failure
    (its own alert, in its namespace), which joins the node's cluster incident."""
    return make_alert(
        200 + i,
        name="TrainingRankStalledBehindPeers",
        labels={"node": NODES[i], "trainingjob": JOBS[i // 2], "priority": "P1",
                "component": "training"},
        starts_at=BASE_TIME + timedelta(seconds=20),
    )  # fmt: skip


async def intake(engine: AsyncEngine, alert_dicts: list[dict[str, Any]], at_s: float) -> None:
    receipt = parse_webhook(
        encode(make_body(alert_dicts)), received_at=BASE_TIME + timedelta(seconds=at_s)
    )
    async with engine.begin() as conn:
        await record_receipts(conn, [receipt])


async def plan(
    engine: AsyncEngine,
    topo: Topology | None,
    at_s: float,
    maintenance: MaintenanceService | None = None,
) -> CollectorRegistry:
    """Plans what waits in the inbox; the policy's metrics come back."""
    registry = CollectorRegistry()
    policy = load_policy(overrides=INFRA_ROUTE)
    planner = PolicyPlan(
        policy,
        CHANNELS,
        steps=plan_steps(maintenance=maintenance),
        topology=(lambda: topo) if topo else None,
        metrics=PolicyMetrics(registry),
    )
    worker = PolicyWorker(engine, planner, clock=lambda: BASE_TIME + timedelta(seconds=at_s))
    await worker.drain()
    return registry


async def tick(engine: AsyncEngine, topo: Topology | None, at_s: float) -> None:
    """The planner's ticker at `at_s` (its timers: holds that ended, follow-ups)."""
    planner = PolicyPlan(
        load_policy(overrides=INFRA_ROUTE),
        CHANNELS,
        topology=(lambda: topo) if topo else None,
    )
    await Ticker(engine, planner).run_once(BASE_TIME + timedelta(seconds=at_s))


async def rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        query = select(notifications).order_by(notifications.c.id)
        return list((await conn.execute(query)).all())


def by(rows_: list[Any], kind: str, channel: str) -> list[Any]:
    return [r for r in rows_ if r.kind == kind and r.channel == channel]


async def test_six_nodes_under_one_switch_are_one_incident_three_notices_one_page(
    engine: AsyncEngine,
) -> None:
    await intake(engine, [link_down(i) for i in range(6)], at_s=10)
    metrics = await plan(engine, topology(switches=1), at_s=11)
    # each job's rank on a dead node stalls: the job is named on the incident
    await intake(engine, [stalled(i) for i in (0, 2, 4)], at_s=20)
    await plan(engine, topology(switches=1), at_s=21)
    sent = await rows(engine)

    assert by(sent, "alert", "feishu") == [], "no per-node cards"
    folded = metrics.get_sample_value(
        "trainsentry_notifications_suppressed_total", {"reason": "infrastructure"}
    )
    assert folded == 6
    pages = [r for r in sent if r.channel == "phone"]
    assert len(pages) == 1, "one page, to the infrastructure route"
    assert pages[0].kind == "infra" and pages[0].alert_id is not None
    infra = by(sent, "infra", "feishu")
    cards = [r for r in infra if r.payload["event"] == "infra_opened"]
    notices = [r for r in infra if r.payload["event"] == "infra_job_notice"]
    assert len(cards) == 1
    card = cards[0].payload
    assert card["infrastructure"]["element"] == "leaf-7"
    assert card["infrastructure"]["level"] == "leaf_switch"
    assert card["infrastructure"]["nodes"] == sorted(NODES)
    assert card["infrastructure"]["jobs"] == [], "the cluster's alerts name no job"
    assert "switch or its cabling" in card["infrastructure"]["likely_cause"]
    assert card["route"] == "route:infra" and card["labels"]["scope"] == "infrastructure"
    assert "leaf-7" in card["alertname"]
    # the payload contract holds, and the Feishu card names the switch, its nodes and jobs
    rendered = str(build_card("infra", parse_payload(dict(card))))
    assert "leaf-7" in rendered and "gpu-node-5" in rendered
    assert "switch or its cabling" in rendered
    assert sorted(n.payload["job"] for n in notices) == sorted(f"ml/{job}" for job in JOBS)
    assert all(n.payload["route"] != "route:infra" for n in notices), "notices go the job's way"
    updates = [r.payload for r in infra if r.payload["event"] == "infra_update"]
    assert updates[-1]["infrastructure"]["jobs"] == sorted(f"ml/{j}" for j in JOBS)
    assert "ml/bert" in str(build_card("infra", parse_payload(dict(updates[-1]))))
    # the archive still gets every occurrence
    assert len(by(sent, "alert", "sheet")) == 9

    # every alert is stored with its place, shown by the read API
    async with engine.connect() as conn:
        ids = (await conn.execute(select(alerts.c.id))).scalars().all()
        detail = await get_alert(conn, ids[0])
    assert detail is not None
    assert detail["topology"] == {"leaf_switch": "leaf-7", "rack": "r0"}

    # a late arrival folds in (no card of its own), resolves fold in; the last one closes it
    await intake(engine, [link_down(i, "resolved") for i in range(6)], at_s=200)
    await plan(engine, topology(switches=1), at_s=201)
    after = (await rows(engine))[len(sent) :]
    assert by(after, "alert", "feishu") == [] and [r for r in after if r.channel == "phone"] == []
    closing = [r for r in by(after, "infra", "feishu") if r.payload["event"] == "infra_resolved"]
    assert len(closing) == 1 and closing[0].payload["status"] == "resolved"
    assert closing[0].payload["infrastructure"]["firing"] == 0


async def test_late_arrival_folds_into_the_open_incident(engine: AsyncEngine) -> None:
    await intake(engine, [link_down(i) for i in range(3)], at_s=10)
    await plan(engine, topology(switches=1), at_s=11)
    first = await rows(engine)
    await intake(engine, [link_down(5)], at_s=300)  # past the window: folds, as it is open
    await plan(engine, topology(switches=1), at_s=301)
    later = (await rows(engine))[len(first) :]
    assert [r for r in later if r.channel != "sheet"] == [], "no card of its own"
    await intake(engine, [link_down(i, "resolved") for i in (0, 1, 2, 5)], at_s=400)
    await plan(engine, topology(switches=1), at_s=401)
    [closing] = [
        r.payload for r in by(await rows(engine), "infra", "feishu")
        if r.payload["event"] == "infra_resolved"
    ]  # fmt: skip
    assert closing["infrastructure"]["nodes"] == [NODES[i] for i in (0, 1, 2, 5)]


async def test_a_teams_own_copies_open_no_infrastructure_incident(engine: AsyncEngine) -> None:
    """Issue 43: a team's rules can raise `IBPhysicalLinkDown{node=...}` for any node; its
    alerts (its namespace) count no node towards the switch's threshold: they stay in the
    job's own incident, paged through the job's route. Failed before: one incident of
    leaf-7 and its page, on the team's word."""
    for j in range(3):  # Alertmanager groups by job: one webhook per job
        await intake(engine, [link_down(i, job=True) for i in (2 * j, 2 * j + 1)], at_s=10)
    await plan(engine, topology(switches=1), at_s=11)
    sent = await rows(engine)
    assert [r for r in sent if r.kind == "infra"] == []
    cards = by(sent, "alert", "feishu")
    assert sorted(c.payload["job"] for c in cards) == sorted(f"ml/{job}" for job in JOBS)


async def test_six_nodes_under_six_switches_are_handled_per_job(engine: AsyncEngine) -> None:
    await intake(engine, [link_down(i) for i in range(6)], at_s=10)
    # racks hold three nodes each: make them not reach the threshold either
    topo = topology(switches=6)
    topo = Topology(
        topo.levels, {n: {"leaf_switch": p["leaf_switch"]} for n, p in topo.places.items()}
    )
    await plan(engine, topo, at_s=11)
    # each node's switch may be failing: the card waits `infrastructure.hold` (90 s from
    # the alerts' arrival) for their other nodes, which never come (issue 44)
    await tick(engine, topo, at_s=99)
    assert [r for r in await rows(engine) if r.channel != "sheet"] == []  # the archive has all
    await tick(engine, topo, at_s=100)
    sent = await rows(engine)
    assert [r for r in sent if r.kind == "infra"] == []
    # the job's own incident: one card for its six nodes, one page (issue 34)
    [card] = by(sent, "alert", "feishu")
    assert card.payload["incident"]["nodes"] == 6
    assert Counter(r.kind for r in sent if r.channel == "phone") == {"alert": 1}
    assert card.payload["topology"]["leaf_switch"].startswith("leaf-")


async def test_without_a_topology_nothing_changes(engine: AsyncEngine) -> None:
    await intake(engine, [link_down(i) for i in range(6)], at_s=10)
    await plan(engine, None, at_s=11)
    sent = await rows(engine)
    assert [r for r in sent if r.kind == "infra"] == []
    [card] = by(sent, "alert", "feishu")  # one incident: the group's six nodes on one card
    assert card.payload["incident"]["nodes"] == 6
    assert "topology" not in card.payload


async def test_nodes_under_maintenance_are_muted_not_counted(engine: AsyncEngine) -> None:
    """Two of the six nodes are in a maintenance window: their alerts are muted as usual and
    the incident is the other four's (a node being serviced is no evidence against the
    switch)."""
    now = BASE_TIME + timedelta(seconds=11)
    service = MaintenanceService(
        engine,
        MaintenanceSettings(),
        policy=load_policy(overrides=INFRA_ROUTE),
        channels=CHANNELS,
        clock=lambda: now,
    )
    await service.create(
        {
            "matchers": {"node": {"regex": "gpu-node-[01]"}},
            "starts_at": BASE_TIME.isoformat(),
            "ends_at": (BASE_TIME + timedelta(hours=2)).isoformat(),
            "reason": "cable swap",
            "created_by": "alice",
        }
    )
    await intake(engine, [link_down(i) for i in range(6)], at_s=10)
    await plan(engine, topology(switches=1), at_s=11, maintenance=service)
    sent = await rows(engine)
    cards = [r for r in by(sent, "infra", "feishu") if r.payload["event"] == "infra_opened"]
    assert len(cards) == 1
    assert cards[0].payload["infrastructure"]["nodes"] == NODES[2:]
    assert by(sent, "alert", "feishu") == [], "the two in maintenance are muted, not carded"
    assert service.muted > 0
