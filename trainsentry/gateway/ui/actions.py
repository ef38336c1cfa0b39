"""What a signed-in viewer can do to an incident from the console, each through the same
service as the API: acknowledge (with a comment) and silence go to `AckService.acknowledge`
(stages/ack.py: the same audit event, the same stop of the escalation and cancelled calls,
the same `ack` notifications that redraw the chat cards, the same Alertmanager silence).

An action is a name, a label, the form fields it reads and a coroutine; `ACTIONS` is the
table the templates draw buttons from and the POST handler dispatches through. A new action
(escalate now, end a maintenance window) is one more entry, shown only where its service
exists on the assembled gateway (`available`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from trainsentry.gateway.pipeline import Gateway

MAX_COMMENT = 1000
SILENCE_CHOICES = (15, 60, 240, 1440)  # minutes offered by the form (any 1..43200 accepted)


class ActionRefused(ValueError):
    """The form is wrong (a 400 with this reason)."""


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


ACTIONS: dict[str, Action] = {
    action.name: action
    for action in (
        Action("ack", "Acknowledge", _ack, lambda g: g.ack is not None),
        Action("silence", "Silence", _silence, lambda g: g.ack is not None),
    )
}
