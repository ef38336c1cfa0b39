"""Feishu interactive cards (card JSON 2.0) for alerts, storms, handoffs, maintenance
notices and cordon recommendations. Pure: payload in, dict out.

Layout of an alert card: header (priority colour; green when resolved), `<at>` mentions, a
field block (job, rank, node, GPU, value, since, reason, count), description, diagnosis,
link buttons (runbook, Grafana, source) and, when a Feishu app receives callbacks, the
ack / silence buttons in a form container with an optional comment input (its text comes
back in the callback's `action.form_value`, callback.py). Every card is cut to fit a byte
budget (Feishu's custom bot takes at most 20 KB per request): lists are trimmed first and
always say how many entries were cut.

Text from outside (labels, annotations, names, comments) goes through `markup.escape_md`: it
forms no mention, link, image or tag; mentions are drawn only for configured open_ids
(`markup.mention_markup`); a link button only for an http(s) URL (`links.safe_url`).

One piece: every card shape here is built from the same private elements (`_card`,
`_markdown`, `_fit`) under the same byte budget; split by shape, those would become a
public API of their own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainsentry.notifiers.feishu.incident_card import (
    incident_fields,
    scope_suffix,
    shared_headline,
    spans_nodes,
)
from trainsentry.notifiers.feishu.markup import escape_md, mention_markup
from trainsentry.notifiers.links import safe_url
from trainsentry.notifiers.payload_contract import (
    NotificationPayload,
    StormItem,
    alertname,
    annotation,
    gpu_of,
    hca_of,
    job_of,
    label,
    node_of,
    rank_of,
)

MAX_BOT_BODY_BYTES = 20 * 1024
# Room left for the webhook envelope ({"msg_type":..,"timestamp":..,"sign":..,"card":..}).
ENVELOPE_BYTES = 256

HEADER_TEMPLATE = {"P0": "red", "P1": "orange", "P2": "yellow", "P3": "blue"}
RESOLVED_TEMPLATE = "green"
CARD_TEMPLATES = frozenset({*HEADER_TEMPLATE.values(), RESOLVED_TEMPLATE, "grey", "wathet"})

# Labels shown in their own field; the rest go to the "other labels" line.
_FIELD_LABELS = frozenset(
    {
        "alertname",
        "priority",
        "trainingjob",
        "job_name",
        "namespace",
        "node",
        "instance",
        "Hostname",
        "hostname",
        "gpu",
        "GPU_I_ID",
        "UUID",
        "device",
        "rank",
        "global_rank",
        "mountpoint",
    }
)
_DESCRIPTION_CHARS = 1500
# The ack form's comment input: its name in the callback's `form_value`, and its length
# (Feishu's input takes max_length 1..1000; callback.py refuses a longer one).
COMMENT_FIELD = "comment"
MAX_COMMENT = 1000
_LABEL_LINE_ITEMS = 12


@dataclass(frozen=True, slots=True)
class CardOptions:
    """How to render. `actions` adds ack/silence buttons (needs a Feishu app callback)."""

    actions: bool = False
    silence_durations_s: tuple[int, ...] = (3600, 4 * 3600, 24 * 3600)
    max_bytes: int = MAX_BOT_BODY_BYTES - ENVELOPE_BYTES
    product: str = "trainsentry"


DEFAULT_OPTIONS = CardOptions()


def card_bytes(card: Mapping[str, Any]) -> int:
    """Size of the card as it goes on the wire (compact UTF-8 JSON)."""
    return len(compact_json(card).encode())


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + "…"


def header_template(payload: NotificationPayload) -> str:
    if payload["status"] == "resolved":
        return RESOLVED_TEMPLATE
    return HEADER_TEMPLATE[payload["priority"]]


def duration_words(seconds: float) -> str:
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m" if minutes else f"{seconds}s"


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time from a payload (Z or offset; naive means UTC), or None."""
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _since(payload: NotificationPayload, now: datetime | None) -> str:
    started = parse_time(payload.get("starts_at"))
    if started is None:
        return ""
    stamp = started.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    ended = parse_time(payload.get("ends_at"))
    if payload["status"] == "resolved" and ended is not None and ended.year > 1:
        return f"{stamp} (lasted {duration_words((ended - started).total_seconds())})"
    if now is not None:
        return f"{stamp} ({duration_words((now - started).total_seconds())} ago)"
    return stamp


def _plain(text: str) -> dict[str, str]:
    return {"tag": "plain_text", "content": text}


def _markdown(text: str) -> dict[str, Any]:
    return {"tag": "markdown", "content": text}


def _link_button(text: str, url: str) -> dict[str, Any]:
    return {
        "tag": "button",
        "text": _plain(text),
        "type": "default",
        "behaviors": [{"type": "open_url", "default_url": url}],
    }


def _callback_button(text: str, value: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "tag": "button",
        "text": _plain(text),
        "type": kind,
        "behaviors": [{"type": "callback", "value": value}],
    }


def _button_row(buttons: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tag": "column_set",
        "flex_mode": "flow",
        "horizontal_spacing": "8px",
        "columns": [{"tag": "column", "width": "auto", "elements": [button]} for button in buttons],
    }


def _state_words(payload: NotificationPayload) -> str:
    """FIRING / RESOLVED, or what the policy made of it: a recurrence, flapping, an ack."""
    event = payload.get("event", "")
    count = payload.get("count")
    if event == "recurrence":
        return f"FIRING AGAIN (×{count})" if count else "FIRING AGAIN"
    if event == "flapping":
        return f"FLAPPING ({count} changes)" if count else "FLAPPING"
    if event == "expired":
        return "RESOLVED (no longer reported)"
    return "RESOLVED" if payload["status"] == "resolved" else "FIRING"


def _title(payload: NotificationPayload, product: str) -> str:
    """The alert and where: its TrainingJob, else (a cluster-wide alert) its node unless the
    incident spans several, then the incident's scope (" · 20 nodes")."""
    name = alertname(payload) or "alert"
    place = job_of(payload) or ("" if spans_nodes(payload) else node_of(payload))
    where = (f" — {place}" if place else "") + scope_suffix(payload)
    return clip(f"[{payload['priority']}] {_state_words(payload)}: {name}{where}", 200)


def _fields(payload: NotificationPayload, now: datetime | None) -> list[str]:
    one = not spans_nodes(payload)  # else the node, GPU, mountpoint are one alert's of many
    pairs = [
        ("Job", job_of(payload)),
        ("Rank", rank_of(payload)),
        ("Node", node_of(payload) if one else ""),
        ("Place", ", ".join(f"{k}={v}" for k, v in (payload.get("topology") or {}).items())),
        ("GPU", gpu_of(payload) if one else ""),
        ("HCA", hca_of(payload) if one else ""),
        ("Mountpoint", label(payload, "mountpoint") if one else ""),
        ("Value", annotation(payload, "value")),
        ("Since", _since(payload, now)),
        ("Reason", payload.get("reason", "")),
    ]
    count = payload.get("count")
    if count and count > 1:
        pairs.append(("Count", str(count)))
    pairs += incident_fields(payload)  # the incident's alerts, nodes and GPUs
    return [f"**{name}:** {escape_md(clip(value, 300))}" for name, value in pairs if value]


def _other_labels(payload: NotificationPayload, limit: int) -> str:
    items = sorted(
        (key, value)
        for key, value in (payload.get("labels") or {}).items()
        if key not in _FIELD_LABELS
    )
    shown = [f"{escape_md(key)}={escape_md(clip(value, 80))}" for key, value in items[:limit]]
    if not shown:
        return ""
    cut = len(items) - len(shown)
    suffix = f" … ({cut} more labels not shown)" if cut > 0 else ""
    return "Labels: " + ", ".join(shown) + suffix


def _ack_elements(payload: NotificationPayload) -> list[dict[str, Any]]:
    lines = []
    who = payload.get("acked_by")
    if who:
        # the name as plain text; a mention only of a configured open_id (`acked_by_open_id`,
        # gateway/stages/services/ackers.py), never formed from the name
        mention = mention_markup([payload.get("acked_by_open_id", "")])
        name = (
            "" if mention and who == payload.get("acked_by_open_id") else escape_md(clip(who, 200))
        )
        lines.append(f"✅ Acknowledged by {' '.join(p for p in (name, mention) if p)}")
        comment = payload.get("ack_comment")
        if comment:
            lines.append(f"💬 {escape_md(clip(comment, 500))}")
    until = parse_time(payload.get("silenced_until"))
    if until is not None:
        lines.append(f"🔕 Silenced until {until.astimezone(UTC):%Y-%m-%d %H:%M UTC}")
    return [_markdown("\n".join(lines))] if lines else []


def _action_buttons(payload: NotificationPayload, options: CardOptions) -> list[dict[str, Any]]:
    alert_id = payload.get("alert_id")
    if not options.actions or alert_id is None or payload["status"] != "firing":
        return []
    if payload.get("acked_by"):
        return []
    buttons = [_callback_button("Acknowledge", {"action": "ack", "alert_id": alert_id}, "primary")]
    for seconds in options.silence_durations_s:
        value = {"action": "silence", "alert_id": alert_id, "duration_s": seconds}
        buttons.append(_callback_button(f"Silence {duration_words(seconds)}", value, "default"))
    return [_comment_form(buttons)]


def _comment_form(buttons: list[dict[str, Any]]) -> dict[str, Any]:
    """Feishu's form container: the comment input and the buttons that submit it (each
    keeps its callback value; the input's text comes back as `form_value.comment`)."""
    for button in buttons:
        button["form_action_type"] = "submit"
        # unique in the card, as Feishu requires; also names the action (callback.py)
        button["name"] = "_".join(str(v) for v in button["behaviors"][0]["value"].values())
    comment = {
        "tag": "input",
        "name": COMMENT_FIELD,
        "max_length": MAX_COMMENT,
        "placeholder": _plain("Comment (optional)"),
    }
    return {"tag": "form", "name": "ack_form", "elements": [comment, _button_row(buttons)]}


def _links(payload: NotificationPayload) -> list[dict[str, Any]]:
    """Runbook, Grafana, Source and Incident buttons, each only for an http(s) URL
    (links.safe_url)."""
    found = (
        ("Runbook", annotation(payload, "runbook_url")),
        ("Grafana", payload.get("grafana_url") or annotation(payload, "dashboard_url")),
        ("Source", payload.get("generator_url")),
        ("Incident", (payload.get("incident") or {}).get("url")),  # the incident's page
    )
    buttons = [_link_button(text, url) for text, raw in found if (url := safe_url(raw))]
    return [_button_row(buttons)] if buttons else []


def _card(
    title: str, template: str, elements: list[dict[str, Any]], summary: str
) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "config": {"update_multi": True, "summary": {"content": clip(summary, 100)}},
        "header": {"title": _plain(title), "template": template},
        "body": {"elements": elements},
    }


def _subject(payload: NotificationPayload) -> str:
    """Pure: what a card's footer names: the alert by its id, else the infrastructure
    incident by its element ("leaf_switch=leaf-a": its notices and updates page no alert),
    else nothing (never "alert ?")."""
    if (alert_id := payload.get("alert_id")) is not None:
        return f"alert {alert_id}"
    if key := (payload.get("infrastructure") or {}).get("key"):
        return f"infrastructure incident {key}"
    return ""


def alert_card(
    payload: NotificationPayload,
    options: CardOptions = DEFAULT_OPTIONS,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The card for one alert occurrence (firing, resolved, or acknowledged)."""

    def build(description_chars: int, label_items: int) -> dict[str, Any]:
        elements: list[dict[str, Any]] = []
        mentions = payload.get("mentions") or []
        if mentions and payload["status"] == "firing":
            elements.append(_markdown(mention_markup(mentions)))
        shared = shared_headline(payload)  # an incident on several nodes: what they share
        summary = shared or annotation(payload, "summary")
        if summary:
            elements.append(_markdown(f"**{escape_md(clip(summary, 300))}**"))
        first = annotation(payload, "first_step")  # the rule's next step (rules/, docs/alerts.md)
        if first and payload["status"] == "firing":
            elements.append(_markdown(f"👉 **First:** {escape_md(clip(first, 300))}"))
        fields = _fields(payload, now)
        if fields:
            elements.append(_markdown("\n".join(fields)))
        description = "" if shared else annotation(payload, "description")
        if description and description_chars > 0:
            elements.append(_markdown(escape_md(clip(description, description_chars))))
        diagnosis = payload.get("diagnosis")
        if diagnosis:
            elements.append(_markdown(f"**Diagnosis:** {escape_md(clip(diagnosis, 600))}"))
        other = _other_labels(payload, label_items)
        if other:
            elements.append(_markdown(other))
        on_call = payload.get("on_call")
        if on_call and payload["status"] == "firing" and not payload.get("acked_by"):
            elements.append(_markdown(f"📟 **On call now:** {escape_md(clip(on_call, 300))}"))
        elements.extend(_ack_elements(payload))
        elements.extend(_links(payload))
        elements.extend(_action_buttons(payload, options))
        footer = " · ".join(part for part in (options.product, _subject(payload)) if part)
        if payload.get("fingerprint"):
            footer += f" · {payload.get('fingerprint')}"
        elements.append({"tag": "hr"})
        elements.append(_markdown(f"<font color='grey'>{escape_md(footer)}</font>"))
        title = _title(payload, options.product)
        return _card(title, header_template(payload), elements, title)

    for description_chars, label_items in (
        (_DESCRIPTION_CHARS, _LABEL_LINE_ITEMS),
        (400, 4),
        (0, 0),
    ):
        card = build(description_chars, label_items)
        if card_bytes(card) <= options.max_bytes:
            return card
    raise CardTooLarge(f"alert card is {card_bytes(card)} bytes even trimmed")


def maintenance_card(
    payload: NotificationPayload, options: CardOptions = DEFAULT_OPTIONS
) -> dict[str, Any]:
    """A maintenance window's "ends soon" notice (event `maintenance_ending`): a notice, not
    an alert: which window, when it ends, the muted alerts still firing that will be sent
    then, and where (the window's matchers). Never FIRING, never an alert's footer."""
    notice: dict[str, Any] = dict(payload.get("maintenance") or {})
    window, ends = str(notice.get("window_id") or ""), parse_time(notice.get("ends_at"))
    when = ends.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if ends else "soon"
    alerts, more = [str(a) for a in notice.get("alerts") or []], int(notice.get("more") or 0)
    why = f" ({clip(str(notice['window_reason']), 200)})" if notice.get("window_reason") else ""
    where = ", ".join(
        f"{k}={v}" for k, v in (payload.get("labels") or {}).items() if k != "alertname"
    )
    lines = [
        f"**Window:** {escape_md(clip(window, 64) + why)}",
        f"**Ends:** {when}",
        "**Still firing, sent when it ends:** "
        + escape_md(clip(", ".join(alerts) + (f" and {more} more" if more else ""), 600)),
    ] + ([f"**Matching:** {escape_md(clip(where, 200))}"] if where else [])
    footer = f"{options.product} · maintenance window {window}"
    elements = [
        _markdown("\n".join(lines)),
        {"tag": "hr"},
        _markdown(f"<font color='grey'>{escape_md(footer)}</font>"),
    ]
    title = clip(
        f"Maintenance window ends {when}: {len(alerts) + more} muted alert(s) still firing", 200
    )
    return _card(title, "wathet", elements, title)


def handoff_card(
    payload: NotificationPayload, options: CardOptions = DEFAULT_OPTIONS
) -> dict[str, Any]:
    """A schedule's shift change: who is paged first from now, until when, and who follows."""
    notice = payload.get("handoff") or {}
    schedule = notice.get("schedule") or "?"
    lines = [f"**Now on call:** {escape_md(clip(notice.get('to') or 'nobody', 64))}"]
    if notice.get("layer"):
        lines[0] += f" ({escape_md(clip(notice.get('layer') or '', 64))})"
    if notice.get("until"):
        lines.append(f"**Until:** {escape_md(notice.get('until') or '')}")
    lines.append(f"**Before:** {escape_md(clip(notice.get('previous') or 'nobody', 64))}")
    behind = [
        f"{item.get('name', '?')} ({item.get('layer', '?')})" for item in notice.get("next", [])[:5]
    ]
    if behind:
        lines.append(f"**Then:** {escape_md(clip(', '.join(behind), 300))}")
    elements = [_markdown("\n".join(lines))]
    footer = f"{options.product} · schedule {schedule} · {notice.get('at', '')}"
    elements += [{"tag": "hr"}, _markdown(f"<font color='grey'>{escape_md(footer)}</font>")]
    title = clip(f"On-call handoff: {schedule}", 200)
    return _card(title, "blue", elements, title)


class CardTooLarge(ValueError):
    """The card cannot be made to fit the byte budget."""


def _storm_item_line(item: StormItem) -> str:
    parts = [item.get("priority", ""), item.get("alertname", "")]
    where = [
        f"node {item['node']}" if item.get("node") else "",
        f"GPU {item['gpu']}" if item.get("gpu") else "",
        f"rank {item['rank']}" if item.get("rank") else "",
        item.get("job", ""),
    ]
    text = " ".join(p for p in parts if p) + " " + ", ".join(w for w in where if w)
    if item.get("summary"):
        text += f" — {clip(item['summary'], 100)}"
    return "- " + escape_md(text.strip())


def _counts_block(title: str, counts: Mapping[str, int], limit: int) -> str:
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"- {escape_md(clip(name, 80))}: {n}" for name, n in ordered[:limit]]
    cut = len(ordered) - len(lines)
    if cut > 0:
        lines.append(f"- … {cut} more not shown")
    return f"**{title}**\n" + "\n".join(lines)


def storm_card(
    payload: NotificationPayload,
    options: CardOptions = DEFAULT_OPTIONS,
    now: datetime | None = None,
) -> dict[str, Any]:
    """One card summarising an alert storm; lists are trimmed to fit and say what was cut."""
    storm = payload.get("storm")
    if storm is None:
        raise ValueError("storm card needs payload['storm']")
    items = storm.get("items") or []
    by_name = storm.get("by_alertname") or {}
    by_node = storm.get("by_node") or {}
    total = storm["total"]
    status = "resolved" if payload["status"] == "resolved" else "storm"
    title = clip(
        f"[{payload['priority']}] Alert {status}: {total} alerts"
        + (f" — {job_of(payload)}" if job_of(payload) else ""),
        200,
    )

    def build(limit: int) -> dict[str, Any]:
        elements: list[dict[str, Any]] = []
        mentions = payload.get("mentions") or []
        if mentions and payload["status"] == "firing":
            elements.append(_markdown(mention_markup(mentions)))
        head = f"**{total} alerts** folded into this card"
        if storm.get("window_s"):
            head += f" over {duration_words(storm.get('window_s', 0))}"
        if "firing" in storm or "resolved" in storm:
            head += f" ({storm.get('firing', 0)} firing, {storm.get('resolved', 0)} resolved)"
        if payload.get("reason"):
            head += f"\n**Reason:** {escape_md(clip(payload.get('reason', ''), 300))}"
        elements.append(_markdown(head))
        for heading, counts in (
            ("By incident", storm.get("by_incident") or {}),  # the incidents it speaks for
            ("By alert", by_name),
            ("By node", by_node),
            ("By GPU", storm.get("by_gpu") or {}),
        ):
            if counts:
                elements.append(_markdown(_counts_block(heading, counts, limit)))
        if items:
            lines = [_storm_item_line(item) for item in items[:limit]]
            cut = total - min(limit, len(items))
            if cut > 0:
                lines.append(f"- … {cut} more alerts not shown")
            elements.append(_markdown("**Alerts**\n" + "\n".join(lines)))
        elements.extend(_links(payload))
        if list_url := safe_url(storm.get("list_url")):
            elements.append(_button_row([_link_button("All alerts", list_url)]))
        elements.append({"tag": "hr"})
        elements.append(
            _markdown(f"<font color='grey'>{escape_md(options.product)} · storm</font>")
        )
        return _card(title, header_template(payload), elements, title)

    lists = (items, by_name, by_node, storm.get("by_gpu") or {}, storm.get("by_incident") or {})
    largest = max(len(found) for found in lists)
    return _fit(build, largest, options.max_bytes)


def _fit(build: Callable[[int], dict[str, Any]], largest: int, max_bytes: int) -> dict[str, Any]:
    """The card with the most list entries (same cap for every list) that fits `max_bytes`."""
    card = build(largest)
    if card_bytes(card) <= max_bytes:
        return card
    low, high = 0, largest  # build(low) must fit; build(high) does not
    if card_bytes(build(0)) > max_bytes:
        raise CardTooLarge("storm card does not fit even without lists")
    while high - low > 1:
        mid = (low + high) // 2
        if card_bytes(build(mid)) <= max_bytes:
            low = mid
        else:
            high = mid
    return build(low)


# The cordon card (gateway/stages/services/cordon.py): the nodes of one check (one, or several
# folded under one incident), each with its faults and score, the jobs on it, and Approve / Dismiss
# buttons while it is recommended (with a Feishu app callback and approvers; without them
# the card says how to cordon from the CLI instead).
CORDON_VERBS = {
    "recommended": "Cordon recommended",
    "cordoned": "Cordoned",
    "dismissed": "Cordon dismissed",
}
CORDON_MAX_NODES = 10  # nodes drawn on one card (gateway/policy/cordon_cards.py folds at most 10)


def _cordon_node_rows(
    data: dict[str, Any], options: CardOptions, approvable: bool
) -> list[dict[str, Any]]:
    """The elements of one node: its summary, jobs, note or who decided, and its buttons."""
    node = str(data.get("node") or "?")[:253]
    status = str(data.get("status") or "recommended")
    lines = [f"**{escape_md(clip(str(data.get('summary') or node), 200))}**"]
    jobs = [str(job) for job in data.get("jobs") or []][:20]
    lines.append(f"**Jobs on it:** {escape_md(clip(', '.join(jobs), 400)) or 'none known'}")
    if status != "recommended" and data.get("by"):
        verb = CORDON_VERBS.get(status, status)
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
    nodes = [dict(n) for n in data.get("nodes") or [] if isinstance(n, dict)][:CORDON_MAX_NODES]
    approvable = bool(data.get("approvable", True))
    elements: list[dict[str, Any]] = []
    if data.get("incident"):
        incident = escape_md(clip(str(data["incident"]), 200))
        elements.append(_markdown(f"**Under the open infrastructure incident** {incident}"))
    for index, node in enumerate(nodes):
        if index:
            elements.append({"tag": "hr"})
        elements += _cordon_node_rows(node, options, approvable)
    statuses = {str(n.get("status") or "recommended") for n in nodes}
    if options.actions and not approvable and "recommended" in statuses:
        elements.append(_markdown("Nobody may approve here: remediation.approvers is empty."))
    status = statuses.pop() if len(statuses) == 1 else "mixed"
    footer = f"{options.product} · node health · {status}"
    elements += [{"tag": "hr"}, _markdown(f"<font color='grey'>{escape_md(footer)}</font>")]
    verb = CORDON_VERBS.get(status, "Cordon")
    what = str(nodes[0].get("node") or "?")[:253] if len(nodes) == 1 else f"{len(nodes)} nodes"
    title = clip(f"{verb}: {what}", 200)
    return _card(title, "orange" if status == "recommended" else "red", elements, title)


def build_card(
    kind: str,
    payload: NotificationPayload,
    options: CardOptions = DEFAULT_OPTIONS,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The card for a notification of `kind` ("storm", "handoff" or an alert kind)."""
    if kind == "handoff":
        return handoff_card(payload, options)
    # the node health's cordon recommendation (gateway/stages/services/cordon.py)
    if kind == "cordon":
        return cordon_card(payload, options)
    if payload.get("event") == "maintenance_ending":  # gateway/policy/maintenance_mutes.py
        return maintenance_card(payload, options)
    if kind == "storm" or "storm" in payload:
        return storm_card(payload, options, now)
    return alert_card(payload, options, now)
