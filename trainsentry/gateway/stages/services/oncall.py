"""On call at run time: the configured schedules with the overrides and swaps stored in the
store (added and removed through the API or CLI), who is on call, the iCalendar feed, and the
escalation policies built on them.

One service, plain methods: the HTTP handlers (gateway/api/oncall.py), the escalation
(stages/services/paging.py, through `escalators`) and the handoff notices
(stages/services/handoff.py) all see the same schedules. The math is pure
(trainsentry/oncall/, gateway/policy/roster.py); this module reads and writes the store
around it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainsentry.gateway.policy.escalation import Escalator
from trainsentry.gateway.policy.roster import escalators_of
from trainsentry.oncall.changes import parse_change, with_changes
from trainsentry.oncall.config import OncallConfigError
from trainsentry.oncall.ical import render_ics
from trainsentry.oncall.schedule import on_call
from trainsentry.oncall.types import OncallConfig, Override, Schedule, Swap
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.oncall_overrides import (
    StoredChange,
    add_change,
    change_schedule,
    changes_in_force,
    list_changes,
    remove_change,
)

log = logging.getLogger("trainsentry.oncall")

# What the .ics feed covers by default, around now.
FEED_PAST = timedelta(days=7)
FEED_AHEAD = timedelta(days=60)


class UnknownSchedule(LookupError):
    """No schedule of that name is configured."""


@dataclass(frozen=True)
class ScheduleChanged:
    """Told after an override or swap is added or removed (the handoff notices re-plan)."""

    schedule: str
    at: datetime


def _as_change(stored: StoredChange) -> Override | Swap:
    if stored.kind == "swap" and stored.replaces:
        return Swap(stored.who, stored.replaces, stored.starts_at, stored.ends_at)
    return Override(stored.who, stored.starts_at, stored.ends_at)


def answer_json(schedule: Schedule, at: datetime) -> dict[str, Any]:
    """Pure: who is on call, in the shape `trainsentry oncall now --json` prints."""

    def local(moment: datetime | None) -> str | None:
        return None if moment is None else moment.astimezone(schedule.tz).isoformat()

    return {
        "schedule": schedule.name,
        "at": local(at),
        "on_call": [
            {"name": p.name, "layer": p.layer, "until": local(p.until)}
            for p in on_call(schedule, at)
        ],
    }


async def schedules_now(
    conn: Connection, config: OncallConfig, now: datetime, names: list[str] | None = None
) -> dict[str, Schedule]:
    """The schedules (all, or `names`, all configured) with the overrides and swaps stored
    in force merged in."""
    wanted = sorted(config.schedules) if names is None else names
    stored = await changes_in_force(conn, wanted, now - FEED_PAST)
    return {
        name: with_changes(
            config.schedules[name], [_as_change(s) for s in stored if s.schedule == name]
        )
        for name in wanted
    }


async def current_escalators(
    conn: Connection, config: OncallConfig, now: datetime
) -> Mapping[str, Escalator]:
    """The escalation policies of `config`, on the schedules as they stand now."""
    if not config.escalation_policies:
        return {}
    return escalators_of(config, await schedules_now(conn, config, now))


class OncallService:
    def __init__(
        self,
        engine: Engine,
        config: OncallConfig,
        *,
        clock: Callable[[], datetime],
        on_change: Callable[[Connection, ScheduleChanged], Any] | None = None,
    ) -> None:
        self.engine = engine
        self.config = config
        self._clock = clock
        self.on_change = on_change

    def schedule_names(self) -> list[str]:
        return sorted(self.config.schedules)

    def _configured(self, name: str) -> Schedule:
        try:
            return self.config.schedules[name]
        except KeyError:
            known = ", ".join(self.schedule_names()) or "none"
            raise UnknownSchedule(f"no schedule {name[:64]!r} (configured: {known})") from None

    async def schedules(
        self, conn: Connection, now: datetime, names: list[str] | None = None
    ) -> dict[str, Schedule]:
        """The schedules (all, or `names`) with their stored overrides and swaps merged in."""
        for name in names or ():
            self._configured(name)
        return await schedules_now(conn, self.config, now, names)

    async def escalators(self, conn: Connection, now: datetime) -> Mapping[str, Escalator]:
        """The escalation policies as they stand now (stages/services/paging.py calls this)."""
        return await current_escalators(conn, self.config, now)

    async def who(self, name: str | None, at: datetime | None) -> list[dict[str, Any]]:
        """Who is on call at `at` (default now) on one schedule or all, CLI-shaped."""
        names = [name] if name is not None else None
        at = at or self._clock()
        async with self.engine.connect() as conn:
            schedules = await self.schedules(conn, at, names)
        return [answer_json(schedule, at) for schedule in schedules.values()]

    async def feed(self, name: str, past: timedelta, ahead: timedelta) -> bytes:
        """The iCalendar feed of a schedule from `past` ago to `ahead` from now."""
        now = self._clock()
        async with self.engine.connect() as conn:
            schedule = (await self.schedules(conn, now - past, [name]))[name]
        return render_ics(schedule, now - past, now + ahead, now)

    async def add(
        self, name: str, request: Mapping[str, Any], by: str, reason: str
    ) -> StoredChange:
        """Stores an override or swap; raises UnknownSchedule or OncallConfigError (the
        message names the field). Checked against every change in force, in the transaction
        that stores it."""
        self._configured(name)
        now = self._clock()
        async with self.engine.begin() as conn:
            schedule = (await self.schedules(conn, now, [name]))[name]
            change = parse_change(request, schedule=schedule, people=self.config.people, now=now)
            stored = await add_change(
                conn,
                schedule=name,
                kind="swap" if isinstance(change, Swap) else "override",
                who=change.who,
                replaces=change.replaces if isinstance(change, Swap) else None,
                starts_at=change.start,
                ends_at=change.end,
                reason=reason,
                created_by=by,
                now=now,
            )
            if self.on_change is not None:
                await self.on_change(conn, ScheduleChanged(name, now))
        log.info(
            "oncall change added id=%d schedule=%s kind=%s who=%s by=%s",
            stored.id,
            name,
            stored.kind,
            stored.who,
            by,
        )
        return stored

    async def schedule_of(self, change_id: int) -> str | None:
        """The schedule of a change in force (what the access check reads); None: none."""
        async with self.engine.connect() as conn:
            return await change_schedule(conn, change_id)

    async def remove(self, change_id: int, by: str) -> StoredChange | None:
        """Marks a stored change removed; None when there is no such change in force."""
        now = self._clock()
        async with self.engine.begin() as conn:
            removed = await remove_change(conn, change_id, by, now)
            if removed is not None and self.on_change is not None:
                await self.on_change(conn, ScheduleChanged(removed.schedule, now))
        if removed is not None:
            log.info("oncall change removed id=%d by=%s", change_id, by)
        return removed

    async def listed(self, name: str | None, removed: bool) -> list[StoredChange]:
        if name is not None:
            self._configured(name)
        async with self.engine.connect() as conn:
            return await list_changes(conn, name, removed=removed)


__all__ = ["OncallConfigError", "OncallService", "ScheduleChanged", "UnknownSchedule"]
