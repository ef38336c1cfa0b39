"""What a signed-in viewer can do to an incident from the console, each through the same
service as the API: acknowledge (with a comment) and silence go to `AckService.acknowledge`
(stages/services/ack.py: the same audit event, the same stop of the escalation and cancelled calls,
the same `ack` notifications that redraw the chat cards, the same Alertmanager silence);
escalate now goes to `AckService.escalate_now` (the same `escalated` event and calls as
`POST /api/v1/alerts/{id}/escalate`).

An action is a name, a label, whether its form has a comment and a coroutine; `ACTIONS` is
the table the templates draw buttons from and the POST handler dispatches through. A new
action is one more entry, shown only where its service exists on the assembled gateway
(`available`).

What an action did is said on the page it redirects to by a key in `?done=` whose message
is fixed here (`NOTICES`): a link can only choose among these, never put its own text on the
page. The details (who, which silence, whom it calls) are on the incident page itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from trainsentry.gateway.absent import Off
from trainsentry.gateway.access import Actor
from trainsentry.gateway.pipeline import Gateway
from trainsentry.gateway.stages.services.ack import EscalationRefused

MAX_COMMENT = 1000
SILENCE_CHOICES = (15, 60, 240, 1440)  # minutes offered by the form (any 1..43200 accepted)


class ActionRefused(ValueError):
    """The form is wrong (a 400 with this reason), or the action cannot be done now
    (`status` 409: nothing to escalate)."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


NOTICES: dict[str, str] = {
    "acked": "Acknowledged.",
    "acked-escalation-stopped": "Acknowledged: the phone escalation is stopped.",
    "already-acked": "It was acknowledged already (by whom: below); a comment is kept.",
    "silenced": "Acknowledged and silenced in Alertmanager (the silence is in the timeline).",
    "silence-failed": "Acknowledged, but not silenced: this gateway has no Alertmanager for"
    " silences, or Alertmanager refused it (the gateway's log says why).",
    "escalated": "Escalated: the next step is being called now (see the notifications below).",
    "window-ended": "The maintenance window is ended.",
    "job-acked": "Acknowledged: the job's open incidents (and its alerts in none yet).",
    "window-created": "The maintenance window is made (below).",
    "override-added": "The override is added: who is on call is redrawn above.",
    "override-removed": "The override is removed.",
    "uncordoned": "The node is uncordoned: schedulable again.",
    "cordon-approved": "Approved: the node is cordoned.",
    "cordon-dismissed": "Dismissed: the node is not cordoned.",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    notice: str  # a key of NOTICES
    ok: bool = True


# (gateway, alert id, who acts, the form): who acts was let through by ui/acting.py
Run = Callable[[Gateway, int, Actor, Mapping[str, str]], Awaitable[Outcome | None]]


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    label: str
    run: Run
    available: Callable[[Gateway], bool] = lambda _gateway: True
    comment: bool = True  # the form has a comment field


def _comment(form: Mapping[str, str]) -> str | None:
    text = (form.get("comment") or "").strip()
    if len(text) > MAX_COMMENT:
        raise ActionRefused(f"comment is longer than {MAX_COMMENT} characters")
    if text and not all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        raise ActionRefused("comment holds characters that are not printable")
    return text or None


def _minutes(form: Mapping[str, str]) -> int:
    raw = (form.get("minutes") or "").strip()
    if not raw.isdigit() or len(raw) > 6 or not 0 < int(raw) <= 43200:
        raise ActionRefused("minutes must be a whole number from 1 to 43200 (30 days)")
    return int(raw)


async def _ack(
    gateway: Gateway, alert_id: int, who: Actor, form: Mapping[str, str]
) -> Outcome | None:
    result = await gateway.ack.acknowledge(
        alert_id, who.acting_name, None, comment=_comment(form), via=who.via
    )
    if result is None:
        return None
    if result.already_acked:
        return Outcome("already-acked")
    return Outcome("acked-escalation-stopped" if result.escalation_stopped else "acked")


async def _silence(
    gateway: Gateway, alert_id: int, who: Actor, form: Mapping[str, str]
) -> Outcome | None:
    minutes = _minutes(form)
    result = await gateway.ack.acknowledge(
        alert_id, who.acting_name, timedelta(minutes=minutes), comment=_comment(form), via=who.via
    )
    if result is None:
        return None
    if result.silence_error:
        return Outcome("silence-failed", ok=False)
    return Outcome("silenced")


async def _escalate(
    gateway: Gateway, alert_id: int, who: Actor, _form: Mapping[str, str]
) -> Outcome | None:
    """The next step of the running escalation is called now (409: none is running)."""
    try:
        await gateway.ack.escalate_now(alert_id, who.acting_name, via=who.via)
    except EscalationRefused as exc:
        if exc.status == 404:
            return None
        raise ActionRefused(exc.reason, status=exc.status) from None
    gateway.outbox.wake()
    return Outcome("escalated")


ACTIONS: dict[str, Action] = {
    action.name: action
    for action in (
        Action("ack", "Acknowledge", _ack),
        Action("silence", "Silence", _silence),
        Action(
            "escalate",
            "Escalate now",
            _escalate,
            lambda g: not isinstance(g.escalator, Off),
            comment=False,
        ),
    )
}
