"""A Feishu card drawn in HTML as Feishu shows it, for the demo's preview (pure).

The cards are the channel's own JSON (card JSON 2.0, notifiers/feishu/card.py): a coloured
header; `markdown` elements (bold `**...**`, `<font color='grey'>`, `<at id=ou_...></at>`
mentions, character references such as `&lt;` shown as the character, which is how the
gateway writes text it did not write: notifiers/feishu/markup.py); `hr`; `column_set` rows of
`button`s (a link button opens its http(s) URL; a callback button is drawn, not pressable
here); a `form` with its `input`. A markdown element wholly in grey after the last `hr` is
the card's footer. Everything else in a card is left out.

Every string of the card is escaped here: the HTML holds no markup the card's text could
form (labels and annotations are attacker-controlled), and no link but http(s) ones.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

from trainsentry.notifiers.links import safe_url

# Feishu's header templates and font colours, as its card builder draws them
COLOURS = {
    "red": "#d83931",
    "orange": "#de7802",
    "yellow": "#dc9b04",
    "blue": "#1456f0",
    "green": "#2ea121",
    "grey": "#8f959e",
    "carmine": "#b71c1c",
    "wathet": "#3c8cdb",
    "turquoise": "#0fb6a7",
    "violet": "#7f3bf5",
    "purple": "#8b3fd1",
    "indigo": "#3f51f5",
}
_TOKENS = re.compile(
    r"(?P<font><font color=['\"]?(?P<colour>[a-z-]+)['\"]?>)|(?P<endfont></font>)"
    r"|(?P<at><at id=(?P<who>[A-Za-z0-9_-]{1,80})></at>)|(?P<bold>\*\*)"
)
_GREY_ONLY = re.compile(r"^<font color=['\"]?grey['\"]?>(?:(?!</font>).)*</font>$", re.S)


def _text(raw: str) -> str:
    """Card text as shown: character references read (`&lt;` is `<`), then escaped."""
    return str(escape(html.unescape(raw))).replace("\n", "<br>")


def markdown_html(content: str) -> Markup:
    """Pure: Feishu card markdown as HTML: bold, font colours, mentions (as `@id`), the rest
    text. Unclosed bold or font is closed at the end."""
    out: list[str] = []
    bold = False
    fonts = 0
    at = 0
    for found in _TOKENS.finditer(content):
        out.append(_text(content[at : found.start()]))
        at = found.end()
        if found.group("bold"):
            out.append("</b>" if bold else "<b>")
            bold = not bold
        elif found.group("font"):
            colour = COLOURS.get(found.group("colour") or "", "#1f2329")
            out.append(f'<span style="color:{colour}">')
            fonts += 1
        elif found.group("endfont"):
            if fonts:
                out.append("</span>")
                fonts -= 1
        elif found.group("at"):
            out.append(f'<span class="mention">@{escape(found.group("who"))}</span>')
    out.append(_text(content[at:]))
    out.append("</b>" if bold else "")
    out.append("</span>" * fonts)
    return Markup("".join(out))


def _button(node: Mapping[str, Any]) -> str:
    label = escape(str((node.get("text") or {}).get("content", "")))
    kind = "primary" if node.get("type") == "primary" else "default"
    for behaviour in node.get("behaviors") or ():
        if isinstance(behaviour, Mapping) and behaviour.get("type") == "open_url":
            url = safe_url(str(behaviour.get("default_url") or ""))
            if url:
                return (
                    f'<a class="fs-button {kind}" href="{escape(url)}" target="_blank" '
                    f'rel="noopener noreferrer">{label}</a>'
                )
    return f'<button class="fs-button {kind}" type="button" disabled>{label}</button>'


def _elements(nodes: Sequence[Any], footer_at: int = -1) -> Iterator[str]:
    for index, node in enumerate(nodes):
        if not isinstance(node, Mapping):
            continue
        tag = node.get("tag")
        if tag == "markdown":
            content = str(node.get("content", ""))
            footer = index > footer_at >= 0 and bool(_GREY_ONLY.match(content))
            cls = "fs-footer" if footer else "fs-md"
            yield f'<div class="{cls}">{markdown_html(content)}</div>'
        elif tag == "plain_text":
            yield f'<div class="fs-md">{_text(str(node.get("content", "")))}</div>'
        elif tag == "hr":
            yield '<hr class="fs-hr">'
        elif tag == "column_set":
            cells = [
                "".join(_elements(column.get("elements") or ()))
                for column in node.get("columns") or ()
                if isinstance(column, Mapping)
            ]
            yield '<div class="fs-row">' + "".join(cells) + "</div>"
        elif tag == "button":
            yield _button(node)
        elif tag == "form":
            yield (
                '<div class="fs-form">' + "".join(_elements(node.get("elements") or ())) + "</div>"
            )
        elif tag == "input":
            hint = escape(str((node.get("placeholder") or {}).get("content", "")))
            yield f'<input class="fs-input" placeholder="{hint}" disabled>'


def card_title(card: Mapping[str, Any]) -> str:
    return str(((card.get("header") or {}).get("title") or {}).get("content", ""))


def card_html(card: Mapping[str, Any]) -> Markup:
    """Pure: the card (its `card` object) as Feishu draws it: header, body, footer."""
    header = card.get("header") or {}
    colour = COLOURS.get(str(header.get("template", "grey")), COLOURS["grey"])
    body = card.get("body") or {}
    nodes = list(body.get("elements") or card.get("elements") or ())
    rules = [i for i, n in enumerate(nodes) if isinstance(n, Mapping) and n.get("tag") == "hr"]
    inside = "".join(_elements(nodes, rules[-1] if rules else -1))
    return Markup(
        f'<div class="fs-card"><div class="fs-head" style="background:{colour}">'
        f'{escape(card_title(card))}</div><div class="fs-body">{inside}</div></div>'
    )
