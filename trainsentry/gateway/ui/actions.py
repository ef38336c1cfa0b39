"""What a signed-in viewer can do to an incident from the console, each through the same
service as the API: acknowledge (with a comment) and silence go to `AckService.acknowledge`
(stages/ack.py: the same audit event, the same stop of the escalation and cancelled calls,
the same `ack` notifications that redraw the chat cards, the same Alertmanager silence);
escalate now goes to `AckService.escalate_now` (the same `escalated` event and calls as
`POST /api/v1/alerts/{id}/escalate`).

An action is a name, a label, whether its form has a comment and a coroutine; `ACTIONS` is
the table the templates draw buttons from and the POST handler dispatches through. A new
action is one more entry, shown only where its service exists on the assembled gateway
(`available`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from trainsentry.gateway.pipeline import Gateway
from trainsentry.gateway.stages.ack import EscalationRefused

MAX_COMMENT = 1000
SILENCE_CHOICES = (15, 60, 240, 1440)  # minutes offered by the form (any 1..43200 accepted)


class ActionRefused(ValueError):
    """The form is wrong (a 400 with this reason), or the action cannot be done now
    (`status` 409: nothing to escalate)."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class Outcome:
    message: str
    ok: bool = True


Run = Callable[[Gateway, int, str, Mapping[str, str]], Awaitable[Outcome | None]]


@dataclass(frozen=True, slots=True)
class Action:
    name: str
    label: str
    run: Run
    available: Callable[[Gateway], bool]
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
    gateway: Gateway, alert_id: int, who: str, form: Mapping[str, str]
) -> Outcome | None:
    assert gateway.ack is not None
    result = await gateway.ack.acknowledge(alert_id, who, None, comment=_comment(form))
    if result is None:
        return None
    if result.already_acked:
        return Outcome(f"already acknowledged by {result.acked_by}")
    stopped = "; escalation stopped" if result.escalation_stopped else ""
    return Outcome(f"acknowledged by {result.acked_by}{stopped}")


async def _silence(
    gateway: Gateway, alert_id: int, who: str, form: Mapping[str, str]
) -> Outcome | None:
    assert gateway.ack is not None
    minutes = _minutes(form)
    result = await gateway.ack.acknowledge(
        alert_id, who, timedelta(minutes=minutes), comment=_comment(form)
    )
    if result is None:
        return None
    if result.silence_error:
        return Outcome(f"acknowledged; the silence failed: {result.silence_error}", ok=False)
    return Outcome(f"silenced for {minutes} min (silence {result.silence_id})")


async def _escalate(
    gateway: Gateway, alert_id: int, who: str, _form: Mapping[str, str]
) -> Outcome | None:
    """The next step of the running escalation is called now (409: none is running)."""
    assert gateway.ack is not None
    try:
        result = await gateway.ack.escalate_now(alert_id, who)
    except EscalationRefused as exc:
        if exc.status == 404:
            return None
        raise ActionRefused(exc.reason, status=exc.status) from None
    gateway.outbox.wake()
    calls = ", ".join(f"{c['person']} ({c['layer']})" for c in result.calls) or "nobody"
    return Outcome(f"escalated by {who}: calling {calls} now")


ACTIONS: dict[str, Action] = {
    action.name: action
    for action in (
        Action("ack", "Acknowledge", _ack, lambda g: g.ack is not None),
        Action("silence", "Silence", _silence, lambda g: g.ack is not None),
        Action(
            "escalate",
            "Escalate now",
            _escalate,
            lambda g: g.ack is not None and g.escalator is not None,
            comment=False,
        ),
    )
}
