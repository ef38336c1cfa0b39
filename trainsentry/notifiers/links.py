"""Which URLs a notification or the console may turn into a link. Pure.

Annotations (`runbook_url`, `dashboard_url`), an alert's `generatorURL` and the like are
written by whoever shapes the alerts: a link is drawn only for an absolute http(s) URL with a
host and nothing unprintable in it; anything else (`javascript:`, `data:`, `lark://`,
`file:`, a scheme-relative `//host`) is dropped, never rewritten. One rule for the Feishu
cards (notifiers/feishu/card.py) and the console (gateway/ui/views.py).
"""

from __future__ import annotations

from urllib.parse import urlsplit

MAX_URL_CHARS = 4096
LINK_SCHEMES = frozenset({"http", "https"})


def safe_url(url: str | None) -> str:
    """Pure: `url` (stripped) when it is http(s) with a host, at most MAX_URL_CHARS, with no
    whitespace or control character inside; else ""."""
    if not url:
        return ""
    url = url.strip()
    if len(url) > MAX_URL_CHARS or any(ch <= " " or ch == "\x7f" for ch in url):
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: "http://["
        return ""
    return url if parts.scheme.lower() in LINK_SCHEMES and parts.netloc else ""
