"""The demo's HTML preview: the summary as a table, then what the Feishu group and the phone
got, in the order it was sent. Each card is drawn as Feishu draws it (card_html.py); a card
updated in place (an incident's redraw, an ack) is drawn once, in its last state, where it
was first sent, with each of its versions (the card as sent, then every update) below it, as
the group shows one card that changes. Autoescaped; no script."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from trainsentry.demo.card_html import card_html
from trainsentry.demo.previews import PreviewLog


@dataclass
class _Version:
    id: int
    created: str
    kind: str
    file: str
    card: Markup


@dataclass
class _Message:
    id: int
    anchor: str
    created: str
    channel: str = ""
    file: str = ""
    call: Mapping[str, Any] | None = None
    versions: list[_Version] = field(default_factory=list)

    @property
    def last(self) -> Markup:
        return self.versions[-1].card if self.versions else Markup("")


def timeline(log: PreviewLog) -> list[_Message]:
    """Pure: the messages in the order they were first sent, each card with its versions
    (its updates follow the card they update: `Sent.updates`)."""
    messages: list[_Message] = []
    cards: dict[str, _Message] = {}  # a card's file -> its message
    for sent in sorted(log.items, key=lambda s: (s.notification.id, s.channel)):
        n = sent.notification
        created = n.created_at.strftime("%H:%M:%S")
        if sent.channel == "phone" and isinstance(sent.rendered, dict):
            messages.append(_Message(n.id, f"m{n.id}", created, call=sent.rendered))
            continue
        if not isinstance(sent.rendered, dict):
            continue
        version = _Version(n.id, created, n.kind, sent.file, card_html(sent.rendered))
        shown = cards.get(sent.updates) if sent.updates else None
        if shown is None:
            shown = _Message(n.id, f"card-{sent.file}", created, sent.channel, sent.file)
            messages.append(shown)
            cards[sent.file] = shown
        shown.versions.append(version)
    return messages


def summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Pure: the summary's rows; a nested mapping stays a mapping (drawn as a table)."""
    return [(key, value) for key, value in summary.items() if key != "outputs"]


def write_preview(path: Path, title: str, summary: Mapping[str, Any], log: PreviewLog) -> None:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).resolve().parent / "templates"),
        autoescape=select_autoescape(default=True),
    )
    messages = timeline(log)
    page = env.get_template("preview.html.j2").render(
        title=title,
        rows=summary_rows(summary),
        timeline=messages,
        messages=sum(1 for m in messages if m.call is None),
        updates=sum(max(0, len(m.versions) - 1) for m in messages),
        calls=sum(1 for m in messages if m.call is not None),
    )
    path.write_text(page)
