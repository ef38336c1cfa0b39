"""`webhook.scrub`: a receiver's error body that echoes the request never carries the
webhook URL's credential into an error (and so into the log or the store)."""

from __future__ import annotations

import pytest

from trainsentry.notifiers.webhook import REDACTED, scrub

URL = "https://pager.example.com/hooks/T0KEN-abcdef123?key=Q-s3cret-99&team=ml"


@pytest.mark.parametrize(
    "body",
    [
        "Cannot POST /hooks/T0KEN-abcdef123?key=Q-s3cret-99&team=ml",  # Express
        f"upstream {URL} failed",
        "no hook named T0KEN-abcdef123",
        '{"error": "bad key Q-s3cret-99"}',
        "Cannot POST /hooks/T0KEN-abcdef123",
    ],
)
def test_scrub_removes_every_secret_part(body: str) -> None:
    cleaned = scrub(body, URL)
    assert "T0KEN-abcdef123" not in cleaned
    assert "Q-s3cret-99" not in cleaned
    assert REDACTED in cleaned


def test_scrub_keeps_text_that_holds_no_url_part() -> None:
    assert scrub("Service Unavailable", URL) == "Service Unavailable"
    assert scrub("Not Found", "http://127.0.0.1:8080/") == "Not Found"
