"""Handoff notices: at each shift change of a schedule (the person paged first changes), one
notice to the chat channels, saying who takes over from whom and until when.

Once, across replicas and restarts: each schedule has a row in `policy_state` (scope
"handoff") holding the instant it was checked up to, with `due_at` = its next handoff. A run
claims the due rows (locked, `SKIP LOCKED` on PostgreSQL: one replica per row), announces the
handoffs between the checked instant and now, and moves both on, in one transaction; the
notices' idempotency keys (schedule + instant + channel) make a second writer a no-op as
well. A handoff found more than `MAX_LATE` after it happened (the gateway was down) is not
announced: the shift it names may be over. A new or removed override re-plans the schedule
(`reschedule`). The schedule math is pure (oncall/handoffs.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.gateway.policy.route import CHANNEL_KINDS
from trainsentry.gateway.stages.services.oncall import OncallService, ScheduleChanged
from trainsentry.oncall.handoffs import Handoff, handoffs, next_handoff
from trainsentry.oncall.schedule import on_call
from trainsentry.oncall.types import Schedule
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.policy_state import claim_due, load_states, save_states
from trainsentry.store.writes import insert_notifications
from trainsentry.tasks import OwnedTask, every

log = logging.getLogger("trainsentry.handoff")

SCOPE = "handoff"
KIND = "handoff"
PRIORITY = Priority.P1  # the Feishu app posts it to the chat configured for P1
MAX_LATE = timedelta(hours=1)
# Where handoff notices go: the chat channels (route.py's `feishu` kind) and the console.
NOTICE_CHANNELS = frozenset({*CHANNEL_KINDS["feishu"], "console"})


def _who(entry: tuple[str, str] | None) -> str:
    return "nobody" if entry is None else f"{entry[0]} ({entry[1]})"


def notice_payload(schedule: Schedule, handoff: Handoff) -> dict[str, Any]:
    """Pure: what a handoff notice says (the card: notifiers/feishu/card.py `handoff_card`)."""
    local = handoff.at.astimezone(schedule.tz)
    answer = on_call(schedule, handoff.at)
    until = answer[0].until if answer else None
    until_text = until.astimezone(schedule.tz).isoformat() if until else None
    summary = f"{schedule.name}: {_who(handoff.after)} takes over from {_who(handoff.before)}"
    if until_text:
        summary += f" until {until_text}"
    return {
        "priority": PRIORITY.value,
        "status": "firing",
        "event": "handoff",
        "alertname": "On-call handoff",
        "annotations": {"summary": summary},
        "at": local.isoformat(),
        "handoff": {
            "schedule": schedule.name,
            "at": local.isoformat(),
            "previous": handoff.before[0] if handoff.before else None,
            "to": handoff.after[0] if handoff.after else None,
            "layer": handoff.after[1] if handoff.after else None,
            "until": until_text,
            "next": [{"name": p.name, "layer": p.layer} for p in answer[1:]],
        },
    }


class HandoffNotices:
    def __init__(
        self,
        engine: Engine,
        oncall: OncallService,
        channels: Collection[str],
        *,
        clock: Callable[[], datetime],
        interval: float = 30.0,
        on_drafts: Callable[[], None] | None = None,
    ) -> None:
        self._engine = engine
        self._oncall = oncall
        self._channels = sorted(NOTICE_CHANNELS & set(channels))
        self._clock = clock
        self._on_drafts = on_drafts
        self._task = OwnedTask(
            "handoff-notices",
            lambda: every(
                interval, self.run_once, log, "handoff notices: this round failed, trying again"
            ),
        )

    def start(self) -> None:
        self._task.start()

    async def stop(self) -> None:
        await self._task.stop()

    async def run_once(self) -> int:
        """Announces the handoffs due by now; returns the notices written."""
        now = self._clock()
        names = self._oncall.schedule_names()
        async with self._engine.begin() as conn:
            known = await load_states(conn, SCOPE, names)
            if fresh := [name for name in names if name not in known]:
                # first sight: announce from now on, not the schedule's past
                schedules = await self._oncall.schedules(conn, now, fresh)
                await save_states(
                    conn,
                    SCOPE,
                    {
                        n: ({"checked": now.isoformat()}, next_handoff(s, now))
                        for n, s in schedules.items()
                    },
                    now,
                )
            due = await claim_due(conn, SCOPE, now)
            configured = [name for name in due if name in names]
            schedules = await self._oncall.schedules(conn, now, configured)
            drafts: list[NotificationDraft] = []
            rows: dict[str, tuple[dict[str, Any], datetime | None]] = {}
            for name, state in due.items():
                schedule = schedules.get(name)
                if schedule is None:  # no longer configured
                    rows[name] = (state, None)
                    continue
                checked = datetime.fromisoformat(state["checked"])
                for handoff in handoffs(schedule, checked, now):
                    if now - handoff.at <= MAX_LATE:
                        drafts.extend(self._drafts(schedule, handoff))
                rows[name] = ({"checked": now.isoformat()}, next_handoff(schedule, now))
            await save_states(conn, SCOPE, rows, now)
            written = await insert_notifications(conn, drafts, now)
        if written:
            log.info("handoff notices written=%d", written)
            if self._on_drafts is not None:
                self._on_drafts()
        return written

    def _drafts(self, schedule: Schedule, handoff: Handoff) -> list[NotificationDraft]:
        payload = notice_payload(schedule, handoff)
        at = handoff.at.isoformat()
        return [
            NotificationDraft(
                channel=channel,
                kind=KIND,
                priority=PRIORITY,
                idempotency_key=f"handoff:{channel}:{schedule.name}:{at}",
                payload=payload,
                group_key=f"handoff:{schedule.name}",
                reason=f"on-call handoff of {schedule.name}",
            )
            for channel in self._channels
        ]


async def reschedule(conn: Connection, change: ScheduleChanged) -> None:
    """An override or swap changed `change.schedule`: check it again at once (its next
    handoff may have moved); it stays checked up to where it was."""
    known = await load_states(conn, SCOPE, [change.schedule])
    if change.schedule in known:
        await save_states(
            conn, SCOPE, {change.schedule: (known[change.schedule], change.at)}, change.at
        )
