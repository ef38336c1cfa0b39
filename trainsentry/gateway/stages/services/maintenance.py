"""Maintenance windows: the service behind `/api/v1/maintenance` and `trainsentry maintenance`
(create, list, end), and the planning's hooks (mute a batch's drafts, release mutes whose
window ended, announce a window ending soon).

The windows live in the store (store/maintenance_windows.py), so they outlive restarts and every
replica sees them; a replica parses a stored request once (maintenance/windows.py) and keeps it.
The decisions are pure (gateway/policy/maintenance_mutes.py); here they get their inputs from the
store, inside the planning's transaction, and their results are written there.

Invariants: a muted alert's notices are written at most once, when its mute is released
(claimed with SKIP LOCKED on PostgreSQL: one replica); a stretch's "ends soon" notice is
written once (`claim_announcement`); ending a window makes its mutes due at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import NotificationDraft, utcnow
from trainsentry.config import MaintenanceSettings
from trainsentry.gateway.policy.maintenance_mutes import (
    draft_to_json,
    ending_notice,
    ending_soon,
    mute,
    release,
)
from trainsentry.gateway.policy.payload_build import ALERT_KIND
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.stages.intake import text_problem
from trainsentry.maintenance.match import active_span
from trainsentry.maintenance.types import MaintenanceWindow
from trainsentry.maintenance.windows import OncallConfigError, parse_window
from trainsentry.store.engine import Connection, Engine
from trainsentry.store.maintenance_windows import (
    NOTIFIED,
    RESOLVED,
    WindowRow,
    claim_announcement,
    claim_due_mutes,
    close_mutes,
    end_window,
    firing_muted,
    get_window,
    insert_mutes,
    insert_window,
    list_windows,
    mute_states,
    remute,
)

log = logging.getLogger("trainsentry.maintenance")

MAX_REQUEST_BYTES = 64 * 1024
MAX_MATCHERS = 32
MAX_TEXT = 1000  # reason, created_by, a value or a regular expression
# A stored window is parsed again without the caps of the day (they apply when it is made).
_NO_CAP = timedelta(days=3660)


class WindowRejected(ValueError):
    """The request is invalid; the message names the field."""


def _check_text(value: Any, where: str) -> None:
    """Pure: every string in a request can be stored (no NUL, no lone surrogate, bounded)."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise WindowRejected(f"{where}: longer than {MAX_TEXT} characters")
        if (problem := text_problem(value)) is not None:
            raise WindowRejected(f"{where}: {problem}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{where}.{str(key)[:64]}")
    elif isinstance(value, list):
        for index, item in enumerate(value[:100]):
            _check_text(item, f"{where}[{index}]")


def validate_request(
    body: Any, *, window_id: str, now: datetime, max_window: timedelta, max_total: timedelta
) -> MaintenanceWindow:
    """Pure: a window request checked for storing and parsed; WindowRejected names the field."""
    if not isinstance(body, dict):
        raise WindowRejected("window: the body must be a JSON object")
    _check_text(body, "window")
    matchers = body.get("matchers")
    if isinstance(matchers, dict) and len(matchers) > MAX_MATCHERS:
        raise WindowRejected(f"window.matchers: at most {MAX_MATCHERS}")
    created_by = body.get("created_by")
    if not isinstance(created_by, str) or not created_by.strip():
        raise WindowRejected("window.created_by: is required (who makes the window)")
    try:
        return parse_window(
            body, window_id=window_id, created_at=now, max_window=max_window, max_total=max_total
        )
    except OncallConfigError as exc:
        raise WindowRejected(str(exc)) from None


def window_json(row: WindowRow, window: MaintenanceWindow | None, now: datetime) -> dict[str, Any]:
    """Pure: a window as the API shows it: the request's fields, who and when, and whether it
    is active now (`current`: the stretch covering now)."""
    span = active_span(window, now) if window is not None and row.ended_at is None else None
    data = {k: v for k, v in row.request.items() if k not in ("reason", "created_by")}
    return {
        "id": row.id,
        **data,
        "reason": row.reason,
        "created_by": row.created_by,
        "created_at": row.created_at.isoformat(),
        "ended_at": row.ended_at.isoformat() if row.ended_at else None,
        "ended_by": row.ended_by,
        "active": span is not None,
        "current": {"start": span[0].isoformat(), "end": span[1].isoformat()} if span else None,
    }


@dataclass(frozen=True)
class _Live:
    row: WindowRow
    window: MaintenanceWindow


class MaintenanceService:
    """Windows in the store, and the planning's hooks (`mute`, `tick`): `PolicyPlan` calls
    them inside its transaction when `PolicyPlan.maintenance` is set."""

    def __init__(
        self,
        engine: Engine,
        settings: MaintenanceSettings,
        *,
        policy: Policy,
        channels: Collection[str] | None,
        clock: Callable[[], datetime] = utcnow,
        lock: asyncio.Lock | None = None,
    ) -> None:
        self._engine = engine
        self.settings = settings
        self._policy = policy
        self._channels = channels
        self._clock = clock
        # The policy's lock (SQLite: one policy transaction of this process at a time).
        self._lock = lock or asyncio.Lock()
        self._parsed: dict[str, MaintenanceWindow | None] = {}
        self.muted = 0  # drafts held back by this process (tests, metrics)

    @property
    def max_window(self) -> timedelta:
        return timedelta(hours=self.settings.max_window_hours)

    @property
    def max_total(self) -> timedelta:
        return timedelta(hours=self.settings.total_hours)

    def _parse(self, row: WindowRow) -> MaintenanceWindow | None:
        if row.id not in self._parsed:
            try:
                self._parsed[row.id] = parse_window(
                    row.request,
                    window_id=row.id,
                    created_at=row.created_at,
                    max_window=_NO_CAP,
                    max_total=None,
                )
            except OncallConfigError as exc:  # stored by a version that accepted more
                log.error("maintenance window %s cannot be read, ignored: %s", row.id, exc)
                self._parsed[row.id] = None
        return self._parsed[row.id]

    async def _live(self, conn: Connection, now: datetime) -> list[_Live]:
        found = []
        for row in await list_windows(conn, now=now):
            window = self._parse(row)
            if window is not None:
                found.append(_Live(row, window))
        return found

    async def windows_now(self, conn: Connection, now: datetime) -> list[MaintenanceWindow]:
        """The windows stored and not ended (the planning matches them, e.g. to keep a node
        under maintenance out of infrastructure incidents)."""
        return [live.window for live in await self._live(conn, now)]

    # The service: what the API and the CLI call.

    async def create(self, body: Any) -> dict[str, Any]:
        """Validates and stores a window; raises WindowRejected naming the field."""
        now = self._clock()
        window_id = f"mw-{secrets.token_hex(6)}"
        window = validate_request(
            body, window_id=window_id, now=now, max_window=self.max_window, max_total=self.max_total
        )
        row = WindowRow(
            id=window_id,
            created_at=now,
            created_by=window.created_by.strip(),
            reason=window.reason,
            request=dict(body),
            starts_at=window.starts_at,
            ends_at=window.ends_at,
            ended_at=None,
            ended_by=None,
            announced_end=None,
        )
        async with self._lock, self._engine.begin() as conn:
            await insert_window(conn, row)
        self._parsed[window_id] = window
        log.info(
            "maintenance window created id=%s by=%r reason=%r matchers=%r",
            window_id,
            row.created_by,
            row.reason,
            body.get("matchers"),
        )
        return window_json(row, window, now)

    def parse_request(self, body: Any) -> MaintenanceWindow:
        """The window a request asks for, checked as `create` checks it (WindowRejected
        names the field): what the access check reads before the window is made."""
        return validate_request(
            body, window_id="mw-0", now=self._clock(), max_window=self.max_window,
            max_total=self.max_total,
        )  # fmt: skip

    async def window(self, window_id: str) -> MaintenanceWindow | None:
        """A stored window, parsed (None: no such window, or not readable any more)."""
        async with self._engine.connect() as conn:
            row = await get_window(conn, window_id)
        return None if row is None else self._parse(row)

    async def windows(self, *, include_past: bool = False) -> list[dict[str, Any]]:
        now = self._clock()
        async with self._engine.connect() as conn:
            rows = await list_windows(conn, now=now, include_past=include_past)
        return [window_json(row, self._parse(row), now) for row in rows]

    async def end(self, window_id: str, by: str) -> dict[str, Any] | None:
        """Ends a window now (who and when are kept); alerts it muted that still fire are
        notified by the next tick. None: no such window."""
        now = self._clock()
        async with self._lock, self._engine.begin() as conn:
            row = await end_window(conn, window_id, by=by, now=now)
        if row is None:
            return None
        log.info("maintenance window ended id=%s by=%r at=%s", window_id, by, row.ended_at)
        return window_json(row, self._parse(row), now)

    # The planning's hooks, in its transaction.

    async def mute(
        self,
        conn: Connection,
        drafts: list[NotificationDraft],
        now: datetime,
        spare_channels: Collection[str] = (),
    ) -> list[NotificationDraft]:
        """The drafts to write now; those a window mutes are kept with their mute."""
        candidates = {
            d.alert_id
            for d in drafts
            if d.alert_id is not None and d.kind == ALERT_KIND and d.channel not in spare_channels
        }
        if not candidates:
            return drafts
        live = await self._live(conn, now)
        states = await mute_states(conn, candidates)
        if not live and not states:
            return drafts
        result = mute(
            drafts,
            windows=[item.window for item in live],
            mutes=states,
            now=now,
            spare_channels=spare_channels,
        )
        await close_mutes(conn, result.resolved, RESOLVED, now)
        await insert_mutes(
            conn,
            [
                (alert_id, new.window_id, new.until, [draft_to_json(d) for d in new.drafts])
                for alert_id, new in result.new.items()
            ],
            now,
        )
        self.muted += result.muted
        for alert_id, new in result.new.items():
            log.info(
                "alert muted alert_id=%d window=%s until=%s", alert_id, new.window_id, new.until
            )
        return result.kept

    async def tick(self, conn: Connection, now: datetime) -> list[NotificationDraft]:
        """Mutes whose stretch ended are released (notices of alerts still firing), and
        windows ending soon with muted alerts still firing are announced, once."""
        live = await self._live(conn, now)
        windows = [item.window for item in live]
        due = await claim_due_mutes(conn, now)
        drafts: list[NotificationDraft] = []
        if due:
            result = release(
                [(m.alert_id, m.window_id, m.firing, m.labels, m.drafts) for m in due],
                windows=windows,
                now=now,
            )
            await close_mutes(conn, result.notified, NOTIFIED, now)
            await close_mutes(conn, result.resolved, RESOLVED, now)
            await remute(conn, result.moved)
            drafts.extend(result.notify)
            if result.notified:
                log.info(
                    "maintenance over, still firing, notified alert_ids=%s",
                    sorted(result.notified),
                )
        drafts.extend(await self._announce(conn, live, now))
        return drafts

    async def _announce(
        self, conn: Connection, live: Sequence[_Live], now: datetime
    ) -> list[NotificationDraft]:
        within = self.settings.announce_before_minutes * 60
        if within <= 0:
            return []
        by_id = {item.window.id: item.row for item in live}
        drafts: list[NotificationDraft] = []
        for window, end in ending_soon([item.window for item in live], now, within):
            if by_id[window.id].announced_end == end:
                continue
            firing = await firing_muted(conn, window.id)
            if not firing or not await claim_announcement(conn, window.id, end):
                continue
            drafts.extend(
                ending_notice(
                    window,
                    end,
                    [(a.alert_id, a.alertname, a.priority, a.labels) for a in firing],
                    policy=self._policy,
                    channels=self._channels,
                    now=now,
                )
            )
            log.info(
                "maintenance window %s ends at %s: %d alert(s) still fire",
                window.id,
                end,
                len(firing),
            )
        return drafts
