"""The cordon recommendation card (gateway/stages/cordon.py): which node, its faults and
score, the jobs whose alerts named it, and Approve / Dismiss buttons (with a Feishu app
callback; without one the card says how to cordon from the CLI instead)."""

from __future__ import annotations

from typing import Any

from trainsentry.notifiers.feishu.card import (
    CardOptions,
    _button_row,
    _callback_button,
    _card,
    _markdown,
    clip,
)
from trainsentry.notifiers.feishu.markup import escape_md
from trainsentry.notifiers.payload import NotificationPayload


def cordon_card(payload: NotificationPayload, options: CardOptions) -> dict[str, Any]:
    """`payload["cordon"]`: node, summary, score, faults, jobs, status (recommended, or
    cordoned / blocked for an automatic cordon)."""
    data: dict[str, Any] = dict(payload.get("cordon") or {})
    node = str(data.get("node") or "?")[:253]
    status = str(data.get("status") or "recommended")
    lines = [f"**{escape_md(clip(str(data.get('summary') or node), 500))}**"]
    jobs = [str(job) for job in data.get("jobs") or []][:20]
    lines.append(f"**Jobs on it:** {escape_md(clip(', '.join(jobs), 1000)) or 'none known'}")
    if data.get("reason"):
        lines.append(f"**Note:** {escape_md(clip(str(data['reason']), 500))}")
    elements: list[dict[str, Any]] = [_markdown("\n".join(lines))]
    if status == "recommended":
        if options.actions:
            approve = {"action": "cordon_approve", "node": node}
            dismiss = {"action": "cordon_dismiss", "node": node}
            elements.append(
                _button_row(
                    [
                        _callback_button("Approve cordon", approve, "danger"),
                        _callback_button("Dismiss", dismiss, "default"),
                    ]
                )
            )
        else:
            elements.append(_markdown(f"Cordon with `kubectl cordon {escape_md(node)}`"))
    footer = f"{options.product} · node health · {status}"
    elements += [{"tag": "hr"}, _markdown(f"<font color='grey'>{escape_md(footer)}</font>")]
    verb = {
        "recommended": "Cordon recommended",
        "cordoned": "Cordoned",
        "dismissed": "Cordon dismissed",
    }.get(status, status)
    title = clip(f"{verb}: {node}", 200)
    return _card(title, "orange" if status == "recommended" else "red", elements, title)
