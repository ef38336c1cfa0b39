"""Phone paging with escalation, wired to the store.

The policy routes a fresh P0 page to the paging channel ("phone"). Instead of calling once,
that page opens an escalation incident (pure timeline in `escalation.py`): layer 1 is called
now, and while nobody acknowledges, the next step is called after `ack_timeout`. Acks (card
button, CLI, API) and resolves stop it. The escalation state is one JSON document in
`policy_state` (scope "escalation"), locked while it changes, with `due_at` = next call, so the
ticker wakes up for it and a restart resumes the timeline without repeating a call (call
notifications carry stable idempotency keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.gateway.escalation import (
    CallDue,
    Escalator,
    acknowledge,
    new_state,
    next_wakeup,
    resolve,
)
from trainsentry.notifiers.phone.notifier import call_payload, call_text
from trainsentry.store.policy_state import claim_due, load_states, save_states

ESCALATION_SCOPE = "escalation"
ESCALATION_KEY = "incidents"
PHONE_CHANNEL = "phone"
CALL_KIND = "call"


class Paging:
    def __init__(self, escalator: Escalator, channel: str = PHONE_CHANNEL) -> None:
        self.escalator = escalator
        self.channel = channel
        self._texts: dict[int, str] = {}

    async def _load(self, conn: AsyncConnection) -> dict[str, Any]:
        found = await load_states(conn, ESCALATION_SCOPE, [ESCALATION_KEY])
        return found.get(ESCALATION_KEY) or new_state()

    async def _save(self, conn: AsyncConnection, state: dict[str, Any], now: datetime) -> None:
        await save_states(
            conn, ESCALATION_SCOPE, {ESCALATION_KEY: (state, next_wakeup(state))}, now
        )

    def _call_drafts(
        self, calls: Sequence[CallDue], state: dict[str, Any]
    ) -> list[NotificationDraft]:
        drafts = []
        for call in calls:
            incident = state["incidents"].get(str(call.alert_id), {})
            text = incident.get("text") or f"trainsentry {call.priority.value} alert."
            drafts.append(
                NotificationDraft(
                    channel=self.channel,
                    kind=CALL_KIND,
                    priority=call.priority,
                    idempotency_key=call.idempotency_key,
                    payload=call_payload(call, text),
                    alert_id=call.alert_id,
                    group_key=f"escalation:{call.alert_id}",
                    reason=f"escalation step {call.step + 1} ({call.layer})",
                )
            )
        return drafts

    async def page(
        self,
        conn: AsyncConnection,
        pages: Sequence[NotificationDraft],
        resolved_alert_ids: Sequence[int],
        now: datetime,
    ) -> list[NotificationDraft]:
        """Opens incidents for the policy's page drafts, stops resolved ones, and returns the
        calls due now."""
        if not pages and not resolved_alert_ids:
            return []
        state = await self._load(conn)
        for alert_id in resolved_alert_ids:
            state = resolve(state, alert_id, now)
        for draft in pages:
            if draft.alert_id is None:
                continue
            before = str(draft.alert_id) in state["incidents"]
            state = self.escalator.open(state, draft.alert_id, draft.priority, now)
            incident = state["incidents"].get(str(draft.alert_id))
            if incident is not None and not before:
                payload = draft.payload
                incident["text"] = call_text(
                    draft.priority.value,
                    str(payload.get("alertname", "")),
                    str(payload.get("job", "")),
                    str((payload.get("annotations") or {}).get("summary", "")),
                )
        state, calls = self.escalator.plan(state, now)
        await self._save(conn, state, now)
        return self._call_drafts(calls, state)

    async def tick(self, conn: AsyncConnection, now: datetime) -> list[NotificationDraft]:
        """The next escalation steps whose time has come."""
        due = await claim_due(conn, ESCALATION_SCOPE, now)
        if ESCALATION_KEY not in due:
            return []
        state, calls = self.escalator.plan(due[ESCALATION_KEY], now)
        await self._save(conn, state, now)
        return self._call_drafts(calls, state)

    async def acknowledge(
        self, conn: AsyncConnection, alert_id: int, who: str, now: datetime
    ) -> bool:
        """Stops the escalation of `alert_id`; True if one was running."""
        state = await self._load(conn)
        incident = state["incidents"].get(str(alert_id))
        running = incident is not None and incident.get("status") == "open"
        state = acknowledge(state, alert_id, who, now)
        await self._save(conn, state, now)
        return running

    def is_page(self, draft: NotificationDraft) -> bool:
        return draft.channel == self.channel and draft.kind != CALL_KIND

    @staticmethod
    def min_priority(escalator: Escalator) -> Priority:
        return escalator.policy.min_priority
