"""The demo's HTML preview: a timeline of everything the gateway would have sent."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jinja2 import Environment, select_autoescape

from trainsentry.demo.previews import PreviewLog

COLOURS = {
    "red": "#d83931",
    "orange": "#de7802",
    "yellow": "#dc9b04",
    "blue": "#1456f0",
    "green": "#2ea121",
    "grey": "#8f959e",
    "carmine": "#b71c1c",
    "wathet": "#3c8cdb",
}

TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8"><title>trainsentry demo</title>
<style>
body{font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1f2329}
h1{font-size:20px} .summary td{padding:2px 12px 2px 0}
.item{border:1px solid #dee0e3;border-radius:8px;margin:10px 0;max-width:760px;overflow:hidden}
.head{color:#fff;padding:8px 12px;font-weight:600}
.body{padding:8px 12px;white-space:pre-wrap}
.meta{color:#646a73;font-size:12px;padding:0 12px 8px}
.row{font-family:monospace;font-size:12px}
</style></head><body>
<h1>{{ title }}</h1>
<table class="summary">
{% for key, value in summary.items() %}<tr><td>{{ key }}</td><td><b>{{ value }}</b></td></tr>
{% endfor %}</table>
<h2>Timeline ({{ items|length }} notifications)</h2>
{% for item in items %}
<div class="item">
  <div class="head" style="background:{{ item.colour }}">{{ item.channel }} · {{ item.title }}</div>
  <div class="body{% if item.channel == 'sheet' %} row{% endif %}">{{ item.text }}</div>
  <div class="meta">#{{ item.id }} {{ item.kind }} {{ item.priority }} · created {{ item.created }}
  {% if item.file %}· {{ item.file }}{% endif %}</div>
</div>
{% endfor %}
</body></html>
"""


def _walk_text(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        if node.get("tag") in ("markdown", "plain_text", "lark_md") and "content" in node:
            yield str(node["content"])
        for key, value in node.items():
            if key not in ("header", "content"):
                yield from _walk_text(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk_text(value)


def card_title_and_text(card: Mapping[str, Any]) -> tuple[str, str, str]:
    header = card.get("header", {})
    title = str(header.get("title", {}).get("content", ""))
    colour = COLOURS.get(str(header.get("template", "grey")), "#8f959e")
    text = "\n".join(t for t in _walk_text(card.get("body", card)) if t.strip())
    return title, text, colour


def write_preview(path: Path, title: str, summary: Mapping[str, Any], log: PreviewLog) -> None:
    items = []
    for sent in sorted(log.items, key=lambda s: (s.notification.id, s.channel)):
        n = sent.notification
        if isinstance(sent.rendered, list):
            heading, text, colour = "archive row", " | ".join(sent.rendered), "#646a73"
        elif sent.channel == "phone":
            heading, text, colour = (
                f"call {sent.rendered['to']}",
                str(sent.rendered["say"]),
                "#b71c1c",
            )
        else:
            heading, text, colour = card_title_and_text(sent.rendered)
        items.append(
            {
                "channel": sent.channel,
                "title": heading,
                "text": text,
                "colour": colour,
                "id": n.id,
                "kind": n.kind,
                "priority": n.priority.value,
                "created": n.created_at.strftime("%H:%M:%S"),
                "file": sent.file,
            }
        )
    env = Environment(autoescape=select_autoescape(default=True))
    path.write_text(env.from_string(TEMPLATE).render(title=title, summary=summary, items=items))
