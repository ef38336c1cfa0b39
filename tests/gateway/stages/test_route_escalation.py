"""Per team: two routes of the alert policy (namespaces ml and infra) name different
escalation policies (`routing.routes[].escalation`), through the real gateway on virtual
time; each namespace's P0 page follows its own route's policy, step by step, and a page of
no such route follows `routing.escalation` for its priority."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from tests.support.clock import Clock
from tests.support.gateway_process import close_in_process
from tests.support.oncall_gateway import START, post_alerts, settle, start
from tests.support.receiver import Receiver
from tests.support.webhook_factory import bodies_by_group, make_alert

ONCALL = """
people:
  mia: {phone: "+4915100000011"}
  max: {phone: "+4915100000012"}
  ina: {phone: "+4915100000021"}
  ivo: {phone: "+4915100000022"}
  gil: {phone: "+4915100000031"}
schedules:
  infra:
    timezone: Europe/Berlin
    layers:
      - {name: primary, start: "2026-11-16T09:00", shift: 1w, members: [ina]}
escalation_policies:
  ml-p0:
    steps:
      - {people: [mia], name: ml-first, wait_minutes: 5}
      - {people: [max], name: ml-lead, wait_minutes: 5}
  infra-p0:
    steps:
      - {schedule: infra, wait_minutes: 15}
      - {people: [ivo], name: infra-lead, wait_minutes: 15}
  gpu-p0:
    steps:
      - {people: [gil], wait_minutes: 30}
"""
POLICY = """
routing:
  routes:
    - {id: ml, namespaces: [ml], priorities: [P0], channels: [phone], escalation: ml-p0}
    - {id: infra, namespaces: [infra], priorities: [P0], channels: [phone],
       escalation: infra-p0}
  escalation: {P0: gpu-p0}
"""


def calls(receiver: Receiver) -> list[tuple[int, str, str]]:
    return [
        (b["payload"]["alert_id"], b["payload"]["person"]["name"], b["payload"]["layer"])
        for b in receiver.bodies
    ]


async def test_two_teams_routes_page_through_their_own_policies(
    db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    clock = Clock(START)
    server = await start(db_url, receiver, clock, tmp_path, oncall=ONCALL, policy=POLICY)
    try:
        alerts = [
            make_alert(1, labels={"priority": "P0", "namespace": "ml"}),
            make_alert(2, labels={"priority": "P0", "namespace": "infra"}),
            make_alert(3, labels={"priority": "P0", "namespace": "other"}),
        ]
        for body in bodies_by_group(alerts):  # three namespaces: three groups, incidents
            await post_alerts(server, body)
        await settle(server)
        assert sorted(calls(receiver)) == [
            (1, "mia", "ml-first"),
            (2, "ina", "infra"),
            (3, "gil", "step1"),
        ]
        receiver.bodies.clear()
        clock.now = START + timedelta(minutes=5)  # ml-p0 waits 5 minutes, infra-p0 15
        await settle(server)
        assert calls(receiver) == [(1, "max", "ml-lead")]
        clock.now = START + timedelta(minutes=15)
        await settle(server)
        assert calls(receiver) == [(1, "max", "ml-lead"), (2, "ivo", "infra-lead")]
    finally:
        await close_in_process(server)
