"""The policy's steps that are not pure decisions, handed to `PolicyPlan` when it is built:
maintenance windows mute, pages become escalations, hang alerts' notices wait for their
diagnosis, and the outbox write. `plan_steps` is the one place their order is fixed.

Each step has three moments, a no-op unless the step has a part in it:
- `prepare`, before a batch is decided: what the decisions must know (the windows muting
  now; the hang alerts held and the held pages cancelled unsent);
- `due`, at a tick: the drafts the step's own timers owe now (escalation calls; notices of
  windows that ended);
- `deliver`, after a batch (or a tick) is decided: the drafts go on, changed or fewer.

Invariants: a batch's drafts and a tick's decided drafts pass every step, in order; the
drafts a step's timers owe pass only the steps after it (a window's released notice is
escalated and written, never muted again; a call is written, never escalated again); a
tick asks the steps' timers from the last step to the first (calls due before the notices
that may open new escalations). The last step is the write: what it returns was written.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from trainsentry.alerts import AlertChange, JobRef, NotificationDraft
from trainsentry.gateway.policy.route import JobRoute
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.stages.services.paging import Paging
from trainsentry.maintenance.types import MaintenanceWindow
from trainsentry.store.engine import Connection
from trainsentry.store.writes import insert_new_notifications


@dataclass(frozen=True)
class BatchContext:
    """What one batch (or one tick) is decided against, made once at its start and never
    changed by it: the policy, the channels (chat and phone; archives apart), the channels
    that redraw a card in place, the TrainingJobs' own routes as last read, and now."""

    policy: Policy
    channels: frozenset[str]
    archive_channels: frozenset[str]
    updatable: frozenset[str]
    job_routes: Mapping[JobRef, JobRoute] | None
    now: datetime


@dataclass(frozen=True)
class Prepared:
    """What the steps found before a batch is decided: the maintenance windows live now, the
    batch's newly firing hang alerts (their drafts are held for their diagnosis) and its
    ended hang alerts whose held page was cancelled unsent."""

    windows: tuple[MaintenanceWindow, ...] = ()
    held: frozenset[int] = frozenset()
    unsent: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Delivery:
    """What the steps deliver against: the batch's context, what they prepared, and the
    alerts whose page ended (their escalations stop)."""

    context: BatchContext
    prepared: Prepared = Prepared()
    ended_pages: tuple[int, ...] = ()


class PlanStep:
    """One step of the policy around its pure decisions (the module docstring has the
    moments and their order); every moment is a no-op here."""

    async def prepare(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        context: BatchContext,
        found: Prepared,
    ) -> Prepared:
        return found

    async def due(self, conn: Connection, context: BatchContext) -> list[NotificationDraft]:
        return []

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        return drafts


class MaintenanceHook(Protocol):
    """Maintenance windows inside the planning transaction (stages/services/maintenance.py)."""

    async def mute(
        self,
        conn: Connection,
        drafts: list[NotificationDraft],
        now: datetime,
        spare_channels: Collection[str] = (),
    ) -> list[NotificationDraft]: ...

    async def tick(self, conn: Connection, now: datetime) -> list[NotificationDraft]: ...

    async def windows_now(self, conn: Connection, now: datetime) -> list[MaintenanceWindow]: ...


class HoldHook(Protocol):
    """The hang diagnosis inside the planning transaction (stages/hang/diagnosis.py,
    HangDiagnoser): before the batch is decided, which of its alerts are held for their
    diagnosis and which ended with their held page cancelled unsent (`prepare`); after,
    the drafts of the first held, those of the second cancelled (`hold`)."""

    async def prepare(
        self, conn: Connection, changes: Sequence[AlertChange]
    ) -> tuple[frozenset[int], frozenset[int]]: ...

    def hold(
        self,
        drafts: Sequence[NotificationDraft],
        now: datetime,
        held: Collection[int],
        unsent: Collection[int],
    ) -> None: ...


class Mute(PlanStep):
    """Maintenance windows: the windows live now (a muted node is no evidence of a broken
    switch), the notices they mute kept with their mute (archives spared), and at a tick
    the notices of stretches that ended while their alert still fires."""

    def __init__(self, maintenance: MaintenanceHook) -> None:
        self.maintenance = maintenance

    async def prepare(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        context: BatchContext,
        found: Prepared,
    ) -> Prepared:
        windows = await self.maintenance.windows_now(conn, context.now)
        return replace(found, windows=tuple(windows))

    async def due(self, conn: Connection, context: BatchContext) -> list[NotificationDraft]:
        return await self.maintenance.tick(conn, context.now)

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        context = delivery.context
        return await self.maintenance.mute(conn, drafts, context.now, context.archive_channels)


class Page(PlanStep):
    """Pages open escalations instead of calling once (the calls due now go on in their
    place), P0 cards say who is on call, resolved pages end their escalations; at a tick,
    the escalation steps whose time has come."""

    def __init__(self, paging: Paging) -> None:
        self.paging = paging

    async def due(self, conn: Connection, context: BatchContext) -> list[NotificationDraft]:
        return await self.paging.tick(conn, context.now)

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        paging, now = self.paging, delivery.context.now
        pages = [d for d in drafts if paging.is_page(d)]
        others = await paging.annotate(conn, [d for d in drafts if not paging.is_page(d)], now)
        return others + await paging.page(conn, pages, delivery.ended_pages, now)


class Hold(PlanStep):
    """Hang alerts' notices wait for their diagnosis; the resolution of a page nobody was
    sent is written cancelled (a tick's released resolutions included)."""

    def __init__(self, hold: HoldHook) -> None:
        self.hook = hold

    async def prepare(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        context: BatchContext,
        found: Prepared,
    ) -> Prepared:
        held, unsent = await self.hook.prepare(conn, changes)
        return replace(found, held=held, unsent=unsent)

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        found = delivery.prepared
        self.hook.hold(drafts, delivery.context.now, found.held, found.unsent)
        return drafts


class Write(PlanStep):
    """The outbox write, in the caller's transaction: returns the drafts written (a draft
    whose idempotency key is already there, a replayed batch's, is not)."""

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        written = set(await insert_new_notifications(conn, drafts, delivery.context.now))
        kept = []
        for draft in drafts:  # the first of a key written; a second of it was not
            if draft.idempotency_key in written:
                written.discard(draft.idempotency_key)
                kept.append(draft)
        return kept


def plan_steps(
    *,
    maintenance: MaintenanceHook | None = None,
    paging: Paging | None = None,
    hold: HoldHook | None = None,
) -> tuple[PlanStep, ...]:
    """Pure: the steps of a policy with these parts, in their one order: mute, page, hold,
    write (a muted page never escalates; the calls a held page opens wait with its card
    for the diagnosis; every batch ends written)."""
    steps: list[PlanStep] = []
    if maintenance is not None:
        steps.append(Mute(maintenance))
    if paging is not None:
        steps.append(Page(paging))
    if hold is not None:
        steps.append(Hold(hold))
    steps.append(Write())
    return tuple(steps)


async def deliver(
    conn: Connection,
    steps: Sequence[PlanStep],
    drafts: list[NotificationDraft],
    delivery: Delivery,
) -> list[NotificationDraft]:
    """`drafts` through `steps` in order; what the last (the write) returns."""
    for step in steps:
        drafts = await step.deliver(conn, drafts, delivery)
    return drafts


async def prepare(
    conn: Connection,
    steps: Sequence[PlanStep],
    changes: Sequence[AlertChange],
    context: BatchContext,
) -> Prepared:
    """What every step finds before the batch is decided."""
    found = Prepared()
    for step in steps:
        found = await step.prepare(conn, changes, context, found)
    return found


async def deliver_due(
    conn: Connection, steps: Sequence[PlanStep], context: BatchContext
) -> list[NotificationDraft]:
    """A tick's timers, from the last step to the first: each step's due drafts through the
    steps after it; the drafts written."""
    written: list[NotificationDraft] = []
    delivery = Delivery(context)
    for index in range(len(steps) - 1, -1, -1):
        if owed := await steps[index].due(conn, context):
            written += await deliver(conn, steps[index + 1 :], owed, delivery)
    return written
