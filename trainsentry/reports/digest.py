"""Optional Feishu digest of the weekly report: one small card with the headline numbers and a
link, posted to a custom bot. `digest_card` is pure; `post_digest` does the HTTP.

The alert cards' helpers (`notifiers/feishu/card.py`) are built around an alert payload, so
the digest builds its own card (same card JSON 2.0 schema) and reuses only the bot's
signing and answer handling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from trainsentry.notifiers.feishu.bot import classify_response, signed_body
from trainsentry.notifiers.feishu.card import compact_json
from trainsentry.notifiers.feishu.markup import escape_md
from trainsentry.notifiers.links import safe_url
from trainsentry.reports.figures import WeeklyStats


def digest_card(
    stats: WeeklyStats, headline: Sequence[tuple[str, str, str]], link: str = ""
) -> dict[str, Any]:
    team = "" if stats.scope.name == "cluster" else f" · {stats.scope.name}"
    lines = [
        f"**{escape_md(label)}**: {escape_md(value)}" + (f" ({escape_md(note)})" if note else "")
        for label, value, note in headline
    ]
    worst = [f"{h.key} (score {h.score:.1f})" for h in stats.hot_nodes[:3]]
    if worst:
        lines.append(f"**Sickest nodes**: {escape_md(', '.join(worst))}")
    noisy = [r.alertname for r in stats.top_rules if r.tuning_candidate][:3]
    if noisy:
        lines.append(f"**Rules to tune**: {escape_md(', '.join(noisy))}")
    elements: list[dict[str, Any]] = [{"tag": "markdown", "content": "\n".join(lines)}]
    if link := safe_url(link):
        elements.append(
            {
                "tag": "button",
                "text": {"tag": "plain_text", "content": "Open the report"},
                "type": "primary",
                "behaviors": [{"type": "open_url", "default_url": link}],
            }
        )
    p0 = stats.by_priority["P0"]
    title = f"trainsentry weekly report{team}: {stats.period.title}"
    return {
        "schema": "2.0",
        "config": {"summary": {"content": f"{stats.total} alerts, {p0} P0"}},
        "header": {
            "title": {"tag": "plain_text", "content": title},
            "template": "red" if p0 else "blue",
        },
        "body": {"elements": elements},
    }


async def post_digest(
    url: str,
    card: Mapping[str, Any],
    secret: str | None = None,
    *,
    timeout_s: float = 10.0,
    client: httpx.AsyncClient | None = None,
) -> None:
    """Posts the card to a Feishu custom bot; raises a NotifierError when it is refused."""
    body = compact_json(signed_body(dict(card), secret, int(time.time())))
    own = client is None
    http = client or httpx.AsyncClient(timeout=timeout_s)
    try:
        response = await http.post(
            url, content=body.encode(), headers={"Content-Type": "application/json; charset=utf-8"}
        )
        classify_response(response.status_code, response.headers, response.text, "report-digest")
    finally:
        if own:
            await http.aclose()
