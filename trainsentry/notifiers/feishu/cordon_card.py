"""The cordon card (gateway/stages/cordon.py): the nodes of one check (one, or several
folded under one incident), each with its faults and score, the jobs on it, and Approve /
Dismiss buttons while it is recommended (with a Feishu app callback and approvers; without
them the card says how to cordon from the CLI instead)."""

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

VERBS = {
    "recommended": "Cordon recommended",
    "cordoned": "Cordoned",
    "dismissed": "Cordon dismissed",
}
MAX_NODES = 10  # nodes drawn on one card (gateway/policy/cordon_cards.py folds at most 10)


def _node_rows(
    data: dict[str, Any], options: CardOptions, approvable: bool
) -> list[dict[str, Any]]:
    """The elements of one node: its summary, jobs, note or who decided, and its buttons."""
    node = str(data.get("node") or "?")[:253]
    status = str(data.get("status") or "recommended")
    lines = [f"**{escape_md(clip(str(data.get('summary') or node), 200))}**"]
    jobs = [str(job) for job in data.get("jobs") or []][:20]
    lines.append(f"**Jobs on it:** {escape_md(clip(', '.join(jobs), 400)) or 'none known'}")
    if status != "recommended" and data.get("by"):
        verb = VERBS.get(status, status)
        lines.append(f"**{escape_md(verb)}** by {escape_md(clip(str(data['by']), 100))}")
    if data.get("reason"):
        lines.append(f"**Note:** {escape_md(clip(str(data['reason']), 200))}")
    elements: list[dict[str, Any]] = [_markdown("\n".join(lines))]
    if status == "recommended":
        if options.actions and approvable:
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
    return elements


def cordon_card(payload: NotificationPayload, options: CardOptions) -> dict[str, Any]:
    """`payload["cordon"]`: `nodes` (node, summary, score, faults, jobs, status, reason, by:
    recommended, or cordoned / dismissed), `incident` and `approvable`."""
    data: dict[str, Any] = dict(payload.get("cordon") or {})
    nodes = [dict(n) for n in data.get("nodes") or [] if isinstance(n, dict)][:MAX_NODES]
    approvable = bool(data.get("approvable", True))
    elements: list[dict[str, Any]] = []
    if data.get("incident"):
        incident = escape_md(clip(str(data["incident"]), 200))
        elements.append(_markdown(f"**Under the open infrastructure incident** {incident}"))
    for index, node in enumerate(nodes):
        if index:
            elements.append({"tag": "hr"})
        elements += _node_rows(node, options, approvable)
    statuses = {str(n.get("status") or "recommended") for n in nodes}
    if options.actions and not approvable and "recommended" in statuses:
        elements.append(_markdown("Nobody may approve here: remediation.approvers is empty."))
    status = statuses.pop() if len(statuses) == 1 else "mixed"
    footer = f"{options.product} · node health · {status}"
    elements += [{"tag": "hr"}, _markdown(f"<font color='grey'>{escape_md(footer)}</font>")]
    verb = VERBS.get(status, "Cordon")
    what = str(nodes[0].get("node") or "?")[:253] if len(nodes) == 1 else f"{len(nodes)} nodes"
    title = clip(f"{verb}: {what}", 200)
    return _card(title, "orange" if status == "recommended" else "red", elements, title)
