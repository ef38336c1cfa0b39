"""The demo preview's Feishu card drawing (trainsentry/demo/card_html.py, pure), on cards
the real card builder makes from hostile alert text."""

from __future__ import annotations

from trainsentry.demo.card_html import card_html, markdown_html
from trainsentry.notifiers.feishu.card import build_card
from trainsentry.notifiers.payload_contract import parse_payload

EVIL = "</font><script>alert(1)</script>**<at id=all></at>[x](javascript:alert(2))"


def test_markdown_is_drawn_as_feishu_shows_it() -> None:
    html = markdown_html(
        "**Job:** a&lt;b &#91;c&#93;\n<font color='grey'>quiet</font> <at id=ou_ana></at>"
    )
    assert "<b>Job:</b> a&lt;b [c]<br>" in html
    assert '<span style="color:#8f959e">quiet</span>' in html
    assert '<span class="mention">@ou_ana</span>' in html
    assert markdown_html("**open") == "<b>open</b>"  # unclosed bold is closed


def test_hostile_alert_text_stays_text_and_only_http_links_are_links() -> None:
    payload = parse_payload(
        {
            "priority": "P1",
            "status": "firing",
            "alert_id": 7,
            "alertname": "GPUHot",
            "labels": {"alertname": "GPUHot", "team": EVIL, "node": "gpu-1"},
            "annotations": {"summary": EVIL, "runbook_url": "javascript:alert(3)"},
            "generator_url": "https://prometheus.example/graph",
        }
    )
    html = str(card_html(build_card("alert", payload)))
    assert "<script" not in html and "<at" not in html
    assert "javascript:alert(3)" not in html  # no Runbook button for a javascript: URL
    assert "[x](javascript:alert(2))" in html and 'href="javascript' not in html  # text
    assert "&lt;/font&gt;&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as written
    assert 'href="https://prometheus.example/graph"' in html  # the Source button
    assert 'class="fs-footer"' in html  # the grey footer after the rule
