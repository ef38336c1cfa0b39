"""Phone paging with escalation, wired to the store.

The policy routes a fresh P0 page to the paging channel ("phone"). Instead of calling once,
that page opens an escalation incident (pure timeline in `escalation.py`): layer 1 is called
now, and while nobody acknowledges, the next step is called after `ack_timeout`. Acks (card
button, CLI, API) and resolves stop it. The escalation state is one JSON document in
`policy_state` (scope "escalation"), locked while it changes, with `due_at` = next call, so the
ticker wakes up for it and a restart resumes the timeline without repeating a call (call
notifications carry stable idempotency keys). A resolved alert's incident is dropped, so the
state holds the escalations of firing alerts only, and a stop cancels the calls of the
incident that have not rung yet, in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from trainsentry.alerts import NotificationDraft, Priority
from trainsentry.gateway.policy import job_roster
from trainsentry.gateway.policy.escalation import (
    OPEN,
    CallDue,
    EscalationState,
    Escalator,
    IncidentPage,
    acknowledge,
    call_payload,
    call_text,
    escalate_now,
    first_on_call,
    new_state,
    next_wakeup,
    postpone,
)
from trainsentry.notifiers.phone.notifier import CANCELLED_MARK
from trainsentry.store.alert_state import acked_among
from trainsentry.store.engine import Connection
from trainsentry.store.outbox import cancel_calls
from trainsentry.store.policy_state import claim_due, load_states, save_states

ESCALATION_SCOPE = "escalation"
ESCALATION_KEY = "incidents"
PHONE_CHANNEL = "phone"
CALL_KIND = "call"
# An incident acked or exhausted while its alert fires is kept until the alert resolves (a
# page of a known alert opens nothing), or this long if the resolve never reaches us (e.g.
# paging was off meanwhile).
FORGET_STOPPED_AFTER = timedelta(days=7)


# Which escalation policy a page follows: (route id, priority) -> a name of `named` ("": the
# default escalator). gateway/policy/route.py `escalation_for`, bound to the alert policy.
EscalationChoice = Callable[[str, Priority], str]
# The named escalation policies as they stand now (schedules with their run-time overrides),
# read in the caller's transaction: stages/services/oncall.py `OncallService.escalators`.
NamedEscalators = Callable[[Connection, datetime], Any]


def _no_choice(_route: str, _priority: Priority) -> str:
    return ""


def on_call_words(found: Sequence[tuple[str, str, datetime | None]]) -> str:
    """Pure: "alice (gpu-infra, until 2026-10-26 09:00 +01:00)", one per person."""
    words = []
    for name, layer, until in found:
        when = f", until {until:%Y-%m-%d %H:%M %z}" if until is not None else ""
        words.append(f"{name} ({layer}{when})")
    return ", ".join(words)


def _roster_job(draft: NotificationDraft) -> str | None:
    """The job whose own on-call roster this page follows (route.apply_job_route), if any."""
    route = draft.payload.get("job_route") or {}
    return str(route.get("job")) if route.get("roster") and route.get("job") else None


class Paging:
    """The escalation stage. `escalator` is the default roster and policy (the inline
    `oncall.escalation` layers); `named` gives the `oncall.escalation_policies` ones, which
    pages choose by their route (`choose`). Both are parameters, so a caller may pass its own
    (a test's). A TrainingJob's own roster reference wins over both for its pages: the job
    chose who is called: inline layers (`rosters`, by job key), or named policies per
    priority (`job_policies`, by job key and priority; "": none named), which its pages then
    follow (a priority it names none for: the route's choice)."""

    def __init__(
        self,
        escalator: Escalator,
        channel: str = PHONE_CHANNEL,
        rosters: job_roster.RosterOf | None = None,
        *,
        named: NamedEscalators | None = None,
        choose: EscalationChoice = _no_choice,
        job_policies: Callable[[str, Priority], str] | None = None,
    ) -> None:
        self.escalator = escalator
        self.channel = channel
        # A TrainingJob's own roster by job key (stages/services/job_alerting.py); None: the global
        # one.
        self.rosters: job_roster.RosterOf = rosters or (lambda _job: None)
        self._named = named
        self._choose = choose
        self.job_policies: Callable[[str, Priority], str] = job_policies or (lambda _j, _p: "")

    def _job_policy(self, draft: NotificationDraft) -> str:
        """The escalation policy the page's job names for its priority, or ""."""
        job = _roster_job(draft)
        return self.job_policies(job, draft.priority) if job else ""

    def _roster_group(self, draft: NotificationDraft) -> str | None:
        """The job whose inline roster the page follows (None: a job naming policies)."""
        job = _roster_job(draft)
        return job if job and self.rosters(job) is not None else None

    def _page(self, draft: NotificationDraft) -> IncidentPage:
        assert draft.alert_id is not None
        payload = draft.payload
        text = call_text(
            draft.priority.value,
            str(payload.get("alertname", "")),
            str(payload.get("job", "")),
            str((payload.get("annotations") or {}).get("summary", "")),
        )
        # a page that follows its job's inline roster follows no escalation policy; one whose
        # job names a policy for its priority follows that; the others, their route's choice
        policy = (
            ""
            if self._roster_group(draft)
            else self._job_policy(draft)
            or self._choose(str(payload.get("route", "")), draft.priority)
        )
        return IncidentPage(draft.alert_id, draft.priority, text, policy)

    async def escalators(self, conn: Connection, now: datetime) -> Mapping[str, Escalator]:
        """The named escalation policies now (empty without an `oncall:` section)."""
        if self._named is None:
            return {}
        named: Mapping[str, Escalator] = await self._named(conn, now)
        return named

    async def _load(self, conn: Connection) -> EscalationState:
        found = await load_states(conn, ESCALATION_SCOPE, [ESCALATION_KEY])
        saved = found.get(ESCALATION_KEY)
        return new_state() if saved is None else EscalationState.from_json(saved)

    async def _save(self, conn: Connection, state: EscalationState, now: datetime) -> None:
        await save_states(
            conn, ESCALATION_SCOPE, {ESCALATION_KEY: (state.to_json(), next_wakeup(state))}, now
        )

    def _call_drafts(
        self, calls: Sequence[CallDue], state: EscalationState
    ) -> list[NotificationDraft]:
        drafts = []
        for call in calls:
            found = state.get(call.alert_id)
            text = (found.text if found else "") or f"trainsentry {call.priority.value} alert."
            drafts.append(
                NotificationDraft(
                    channel=self.channel,
                    kind=CALL_KIND,
                    priority=call.priority,
                    idempotency_key=call.idempotency_key,
                    payload=dict(call_payload(call, text)),
                    alert_id=call.alert_id,
                    group_key=f"escalation:{call.alert_id}",
                    reason=f"escalation step {call.step + 1} ({call.layer})",
                )
            )
        return drafts

    async def page(
        self,
        conn: Connection,
        pages: Sequence[NotificationDraft],
        resolved_alert_ids: Sequence[int],
        now: datetime,
    ) -> list[NotificationDraft]:
        """Opens incidents for the policy's page drafts, ends those of resolved alerts
        (also when they fired in this same batch), and returns the calls due now."""
        if not pages and not resolved_alert_ids:
            return []
        state = await self._load(conn)
        # An alert acked before its firing was planned (a backlog, a restart) is being handled.
        acked = await acked_among(conn, [d.alert_id for d in pages if d.alert_id is not None])
        opened = [
            self._page(d) for d in pages if d.alert_id is not None and d.alert_id not in acked
        ]
        paged = {page.alert_id for page in opened}
        ending = sorted({i for i in resolved_alert_ids if i in paged or i in state.incidents})
        if not opened and not ending:
            return []  # resolves of alerts that never paged: nothing to change
        state, calls = job_roster.batch(
            self.escalator,
            state,
            now,
            pages=opened,
            page_rosters={
                d.alert_id: job
                for d in pages
                if d.alert_id is not None and (job := self._roster_group(d))
            },
            resolved=ending,
            forget_before=now - FORGET_STOPPED_AFTER,
            roster_of=self.rosters,
            named=await self.escalators(conn, now),
        )
        await self._cancel_calls(conn, ending, "alert resolved")
        await self._save(conn, state, now)
        return self._call_drafts(calls, state)

    async def tick(self, conn: Connection, now: datetime) -> list[NotificationDraft]:
        """The next escalation steps whose time has come."""
        due = await claim_due(conn, ESCALATION_SCOPE, now)
        if ESCALATION_KEY not in due:
            return []
        named = await self.escalators(conn, now)
        state, calls = job_roster.plan(
            self.escalator,
            EscalationState.from_json(due[ESCALATION_KEY]),
            now,
            roster_of=self.rosters,
            named=named,
        )
        await self._save(conn, state, now)
        return self._call_drafts(calls, state)

    async def escalate_now(
        self, conn: Connection, alert_id: int, who: str, now: datetime
    ) -> list[NotificationDraft]:
        """The next step of `alert_id`'s escalation, called now (its timer restarts from here).
        Raises LookupError (it never paged, or resolved) or ValueError (acked, exhausted)."""
        state = await self._load(conn)
        try:
            state = escalate_now(state, alert_id, now, by=who)
        except KeyError:
            raise LookupError(f"alert {alert_id} has no escalation (it never paged)") from None
        named = await self.escalators(conn, now)
        state, calls = job_roster.plan(
            self.escalator, state, now, roster_of=self.rosters, named=named
        )
        await self._save(conn, state, now)
        return self._call_drafts(calls, state)  # with any other incident's step due by now

    async def annotate(
        self, conn: Connection, drafts: Sequence[NotificationDraft], now: datetime
    ) -> list[NotificationDraft]:
        """P0 alert cards (not calls) get "on call now": who the page's escalation calls
        first (`on_call` in the payload, in words): its job's own roster, else its policy's."""
        lines: dict[str, str] = {}
        out = []
        for draft in drafts:
            payload = draft.payload
            if (
                draft.priority is Priority.P0
                and draft.channel != self.channel
                and draft.kind == "alert"
                and payload.get("status") == "firing"
            ):
                job = self._roster_group(draft)
                roster = self.rosters(job) if job else None
                named = self._job_policy(draft)
                key = (
                    f"job:{job}"
                    if roster is not None
                    else f"policy:{named}"
                    if named
                    else str(payload.get("route", ""))
                )
                if key not in lines:
                    found = (
                        first_on_call(roster, now)
                        if roster is not None
                        else await self.on_call_now(
                            conn, str(payload.get("route", "")), draft.priority, now, named
                        )
                    )
                    lines[key] = on_call_words(found)
                if lines[key]:
                    draft = replace(draft, payload={**payload, "on_call": lines[key]})
            out.append(draft)
        return out

    async def on_call_now(
        self, conn: Connection, route: str, priority: Priority, now: datetime, chosen: str = ""
    ) -> list[tuple[str, str, datetime | None]]:
        """Who the first step of a page of `route` would call now: (name, layer, until);
        `chosen`: the escalation policy the page follows when not its route's."""
        chosen = chosen or self._choose(route, priority)
        escalator = (await self.escalators(conn, now)).get(chosen, self.escalator)
        return first_on_call(escalator.roster, now)

    async def acknowledge(self, conn: Connection, alert_id: int, who: str, now: datetime) -> bool:
        """Stops the escalation of `alert_id`; True if one was running."""
        state = await self._load(conn)
        found = state.get(alert_id)
        if found is None:
            return False  # never paged, or resolved (and forgotten): nothing to stop
        running = found.status == OPEN
        state = acknowledge(state, alert_id, who, now)
        # also after exhaustion: the last layer's call may still be waiting for a retry
        await self._cancel_calls(conn, [alert_id], f"acknowledged by {who}")
        await self._save(conn, state, now)
        return running

    async def postpone(
        self, conn: Connection, alert_id: int, first_call_at: datetime, now: datetime
    ) -> None:
        """The escalation of `alert_id` whose first call is held until `first_call_at` (the
        held call row itself waits in the outbox): its next step comes the first step's wait
        later (the ack timeout, or the wait of its escalation policy's first step)."""
        state = await self._load(conn)
        found = state.get(alert_id)
        if found is None:
            return
        policy = self.escalator.policy
        if found.policy:
            chosen = (await self.escalators(conn, now)).get(found.policy)
            policy = chosen.policy if chosen is not None else policy
        until = first_call_at + policy.wait_after(0)
        state = postpone(state, alert_id, until)
        await self._save(conn, state, now)

    async def _cancel_calls(self, conn: Connection, alert_ids: Sequence[int], why: str) -> None:
        """Calls of stopped escalations that have not rung yet never will.

        Done here, in the transaction that stops the escalation, rather than by the phone
        channel reading the incident before it dials: the stop and the cancellation commit
        together or not at all, so a crash leaves either a running escalation with its calls
        or neither (no page lost, none rung twice). A call being placed right now belongs to
        the outbox, which records that attempt; it gets a "cancelled" mark in its payload, so
        should the attempt fail the phone channel refuses its retry instead of ringing.
        """
        await cancel_calls(conn, self.channel, CALL_KIND, alert_ids, why, CANCELLED_MARK)

    def is_page(self, draft: NotificationDraft) -> bool:
        return draft.channel == self.channel and draft.kind != CALL_KIND

    @staticmethod
    def min_priority(escalator: Escalator) -> Priority:
        return escalator.policy.min_priority
