"""The assembled gateway the HTTP handlers share: one `Gateway` per app, under GATEWAY_KEY.

assemble.py builds it (settings → store → channels → stages) when the app starts; api/app.py's
handlers only read it. Hand-offs between the stages (docs/architecture.md):
the intake writer's queue → the store's inbox table (same transaction as the alerts; under
load the intake journal first, then the expander's transaction) → the planning worker → the
outbox table (same transaction as the policy's states) → the outbox sender → the channels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from trainsentry.alerts import AlertChange
from trainsentry.config import GatewaySettings
from trainsentry.gateway.absent import (
    CordonOff,
    EscalationOff,
    HandoffsOff,
    HangsOff,
    JobAlertingOff,
    JobStatusOff,
    MaintenanceOff,
    OncallOff,
    TickerOff,
    TopologyOff,
)
from trainsentry.gateway.metrics import GatewayMetrics
from trainsentry.gateway.policy.escalation import Escalator
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.stages.expansion import Expander
from trainsentry.gateway.stages.hang.diagnosis import HangDiagnoser
from trainsentry.gateway.stages.hang.trigger import JobHangs, TriggerSources
from trainsentry.gateway.stages.intake import IntakeWriter
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.gateway.stages.planning.ticker import Ticker
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.gateway.stages.services.ack import AckService
from trainsentry.gateway.stages.services.cordon import Cordoner
from trainsentry.gateway.stages.services.handoff import HandoffNotices
from trainsentry.gateway.stages.services.job_alerting import JobAlerting
from trainsentry.gateway.stages.services.job_status import JobStatusFeeder
from trainsentry.gateway.stages.services.maintenance import MaintenanceService
from trainsentry.gateway.stages.services.oncall import OncallService
from trainsentry.gateway.stages.services.retention import Retention
from trainsentry.gateway.stages.services.topology import TopologySource
from trainsentry.store.engine import Engine


@dataclass(frozen=True)
class HangTriggers:
    """Hang diagnosis, on: the diagnoser (the policy's hold step holds hang pages for it),
    each job's open hang (the probes' triggers) and who may trigger one."""

    diagnoser: HangDiagnoser
    hangs: JobHangs
    sources: TriggerSources

    def diagnose(self, changes: Collection[AlertChange]) -> None:
        """The decided changes' hang alerts are diagnosed (in the background)."""
        self.diagnoser.start(changes)

    async def stop(self) -> None:
        await self.diagnoser.stop()


@dataclass(frozen=True)
class Gateway:
    """Everything the handlers share; stored in the app under GATEWAY_KEY. assemble.py
    constructs it once, every part given."""

    settings: GatewaySettings
    engine: Engine
    metrics: GatewayMetrics
    writer: IntakeWriter
    outbox: Outbox
    expander: Expander  # records what the intake journaled under load
    policy_worker: PolicyWorker
    ack: AckService
    retention: Retention  # off the pipeline: deletes finished rows, measures the store
    ticker: Ticker | TickerOff  # the real policy's timers
    hang: HangTriggers | HangsOff
    job_status: JobStatusFeeder | JobStatusOff
    escalator: Escalator | EscalationOff  # the phone escalation's roster (who is on call)
    maintenance: MaintenanceService | MaintenanceOff  # windows (the real policy only)
    job_alerting: JobAlerting | JobAlertingOff
    topology: TopologySource | TopologyOff  # where each node stands (stages/services/topology.py)
    policy: Policy  # the alert policy's rules (node health reads its weights)
    oncall: OncallService | OncallOff  # with an `oncall:` section: schedules, overrides
    handoffs: HandoffNotices | HandoffsOff
    cordon: Cordoner | CordonOff  # `remediation.cordon` (stages/services/cordon.py)
    # Feishu open_id -> the oncall.people name: who a card's button press is (acting.py)
    feishu_people: Mapping[str, str]
    classified: Callable[[], Mapping[int, str]]  # the real policy's priorities, by alert id
    clock: Callable[[], datetime]
    background: list[asyncio.Task[Any]] = field(default_factory=list)  # the handlers' tasks

    async def settle(self) -> None:
        """Plans every stored change, fires due timers and sends everything pending, now
        (the demo and tests drive a gateway on virtual time with this)."""
        await self.writer.flush()  # the counts of resends answered from the store
        await self.expander.drain()
        await self.policy_worker.drain()
        await self.ticker.run_once()
        await self.handoffs.run_once()
        await self.cordon.run_once()
        await self.outbox.drain()


GATEWAY_KEY = web.AppKey("gateway", Gateway)
