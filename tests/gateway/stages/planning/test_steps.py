"""The policy's steps (stages/planning/steps.py): one order, a step's own timers' drafts
through the steps after it only, the write returning what it wrote, and a policy that
cannot be built without its write."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.webhook_factory import BASE_TIME, encode, make_alert, make_body
from trainsentry.alerts import AlertChange, NotificationDraft, Priority
from trainsentry.gateway.policy.rules import load_policy
from trainsentry.gateway.stages.intake import parse_webhook
from trainsentry.gateway.stages.planning.plan import PolicyPlan
from trainsentry.gateway.stages.planning.steps import (
    BatchContext,
    Delivery,
    Hold,
    Mute,
    Page,
    PlanStep,
    Prepared,
    Write,
    deliver,
    deliver_due,
    plan_steps,
    prepare,
)
from trainsentry.gateway.stages.planning.worker import PolicyWorker
from trainsentry.store.engine import Connection
from trainsentry.store.writes import record_receipts

CONTEXT = BatchContext(
    policy=load_policy(),
    channels=frozenset({"console"}),
    archive_channels=frozenset(),
    updatable=frozenset(),
    job_routes=None,
    now=BASE_TIME,
)


def draft(key: str, alert_id: int | None = None) -> NotificationDraft:
    return NotificationDraft(
        channel="console",
        kind="alert",
        priority=Priority.P1,
        idempotency_key=key,
        payload={"alertname": "X"},
        alert_id=alert_id,
        group_key=f"g{key}",
        reason="test",
    )


class Recording(PlanStep):
    """A step that owes `owed` at a tick and stamps what passes it with its name."""

    def __init__(self, name: str, owed: Sequence[str] = ()) -> None:
        self.name, self.owed = name, list(owed)

    async def prepare(
        self,
        conn: Connection,
        changes: Sequence[AlertChange],
        context: BatchContext,
        found: Prepared,
    ) -> Prepared:
        return Prepared(windows=found.windows, held=found.held | {len(found.held) + 1})

    async def due(self, conn: Connection, context: BatchContext) -> list[NotificationDraft]:
        return [draft(f"{self.name}:{key}") for key in self.owed]

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        for d in drafts:
            d.payload.setdefault("passed", []).append(self.name)
        return drafts


class Collect(Recording):
    """The last step: keeps what reached it."""

    def __init__(self) -> None:
        super().__init__("write")
        self.got: list[NotificationDraft] = []

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        self.got += await super().deliver(conn, drafts, delivery)
        return drafts


class Fakes:
    """Stand-ins the step adapters only hold (never called here)."""

    async def mute(self, *args: object, **kwargs: object) -> list[NotificationDraft]:
        raise AssertionError("not called")

    async def tick(self, *args: object) -> list[NotificationDraft]:
        raise AssertionError("not called")

    async def windows_now(self, *args: object) -> list[object]:
        raise AssertionError("not called")

    async def prepare(self, *args: object) -> tuple[frozenset[int], frozenset[int]]:
        raise AssertionError("not called")

    def hold(self, *args: object) -> None:
        raise AssertionError("not called")


def test_the_steps_come_in_one_order_and_end_with_the_write() -> None:
    fake = Fakes()
    steps = plan_steps(maintenance=fake, paging=fake, hold=fake)  # type: ignore[arg-type]
    assert [type(s) for s in steps] == [Mute, Page, Hold, Write]
    assert [type(s) for s in plan_steps(hold=fake)] == [Hold, Write]  # type: ignore[arg-type]
    assert [type(s) for s in plan_steps()] == [Write]


def test_a_policy_without_its_write_is_refused() -> None:
    with pytest.raises(ValueError, match="write"):
        PolicyPlan(load_policy(), ("console",), steps=(Recording("mute"),))
    with pytest.raises(ValueError, match="write"):
        PolicyPlan(load_policy(), ("console",), steps=())


async def test_a_steps_own_due_drafts_pass_only_the_steps_after_it() -> None:
    """A tick asks from the last step to the first; each step's owed drafts go through the
    steps after it, never through itself or those before (a released notice is not muted
    again; a call is not escalated again)."""
    last = Collect()
    steps = [Recording("mute", ["released"]), Recording("page", ["call"]), last]
    await deliver_due(None, steps, CONTEXT)  # type: ignore[arg-type]
    assert [(d.idempotency_key, d.payload["passed"]) for d in last.got] == [
        ("page:call", ["write"]),
        ("mute:released", ["page", "write"]),
    ]


async def test_a_batch_passes_every_step_and_each_prepares_in_order() -> None:
    last = Collect()
    steps = [Recording("mute"), Recording("page"), last]
    found = await prepare(None, steps, [], CONTEXT)  # type: ignore[arg-type]
    assert found.held == {1, 2, 3}
    await deliver(None, steps, [draft("a")], Delivery(CONTEXT, found))  # type: ignore[arg-type]
    assert last.got[0].payload["passed"] == ["mute", "page", "write"]


async def test_the_write_returns_only_what_it_wrote(engine: AsyncEngine) -> None:
    """A replayed batch's drafts (their idempotency keys already there) are not written
    again, and a key twice in one batch is written once."""
    delivery = Delivery(CONTEXT)
    write = Write()
    async with engine.begin() as conn:
        first = await write.deliver(conn, [draft("k1"), draft("k2"), draft("k1")], delivery)
    assert [d.idempotency_key for d in first] == ["k1", "k2"]
    later = Delivery(BatchContext(**{**CONTEXT.__dict__, "now": BASE_TIME + timedelta(1)}))
    async with engine.begin() as conn:
        again = await write.deliver(conn, [draft("k2"), draft("k3")], later)
    assert [d.idempotency_key for d in again] == ["k3"]


class Seen(PlanStep):
    """A step between the policy and its write that keeps the keys of what passed it."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    async def deliver(
        self, conn: Connection, drafts: list[NotificationDraft], delivery: Delivery
    ) -> list[NotificationDraft]:
        self.keys += [d.idempotency_key for d in drafts]
        return drafts


async def test_a_tick_runs_the_steps_a_batch_runs(engine: AsyncEngine) -> None:
    """A flapping alert's resolution is held (policy `flap_hold`); the tick that releases it
    sends its drafts through the same steps as a batch's (before, a tick skipped the hang
    hold: a released resolution of a page nobody was sent went out)."""
    seen = Seen()
    plan = PolicyPlan(load_policy(), ("console",), steps=(seen, Write()))
    start = BASE_TIME - timedelta(hours=1)
    for i, status in enumerate(["firing", "resolved"] * 3):
        at = start + timedelta(seconds=30 * i)
        began = start + timedelta(seconds=30 * (i - i % 2))  # a re-fire starts anew
        alert = make_alert(status=status, starts_at=began, ends_at=at if i % 2 else None)
        receipt = parse_webhook(encode(make_body([alert])), received_at=at)
        async with engine.begin() as conn:
            await record_receipts(conn, [receipt])
        await PolicyWorker(engine, plan, clock=lambda at=at: at).drain()
    batches = list(seen.keys)
    async with engine.begin() as conn:
        written = await plan.tick(conn, BASE_TIME)
    released = seen.keys[len(batches) :]
    assert written and released, "the tick released nothing (is the resolution held?)"
