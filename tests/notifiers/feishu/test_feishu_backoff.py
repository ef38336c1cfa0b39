"""Where Feishu back-off is decided (notifiers/feishu/backoff.py): one rule for the app's
APIs, its token endpoint and custom bots.

The answers are the examples of Feishu's "Rate limits" page
(server-docs/api-call-guide/frequency-control): HTTP 429, or 400 from some older APIs,
code 99991400 "request trigger frequency limit", headers `x-ogw-ratelimit-limit: 100` and
`x-ogw-ratelimit-reset: 52`, "wait the number of seconds in x-ogw-ratelimit-reset".
"""

from __future__ import annotations

import json

import httpx
import pytest

from trainsentry.notifiers.base import RateLimitedError, RetryableError
from trainsentry.notifiers.feishu.app import token_failure
from trainsentry.notifiers.feishu.backoff import (
    APP_LIMIT_CODES,
    BOT_LIMIT_CODES,
    asked_wait_s,
    rate_limit_error,
)
from trainsentry.notifiers.feishu.bot import classify_response

LIMITED = {"code": 99991400, "msg": "request trigger frequency limit"}
DOC_HEADERS = httpx.Headers({"x-ogw-ratelimit-limit": "100", "x-ogw-ratelimit-reset": "52"})


@pytest.mark.parametrize("status", [429, 400])
def test_the_documented_answer_waits_its_reset(status: int) -> None:
    limited = rate_limit_error(
        status, 99991400, DOC_HEADERS, limit_codes=APP_LIMIT_CODES, fallback_s=1.0, what="x"
    )
    assert limited is not None and (limited.code, limited.retry_after) == (99991400, 52.0)
    refused = token_failure(status, DOC_HEADERS, LIMITED)
    assert isinstance(refused, RateLimitedError) and refused.retry_after == 52.0


def test_the_wait_is_the_header_feishu_sends_else_the_fallback() -> None:
    assert asked_wait_s(DOC_HEADERS) == 52.0
    assert asked_wait_s({"X-Ogw-Ratelimit-Reset": "7"}) == 7.0  # names are case-insensitive
    assert asked_wait_s({"Retry-After": "3"}) == 3.0
    assert asked_wait_s({"x-ogw-ratelimit-reset": "2", "retry-after": "30"}) == 2.0
    for unusable in ("", "soon", "-1", "nan", "inf", "86400"):
        assert asked_wait_s({"x-ogw-ratelimit-reset": unusable}) is None
    assert asked_wait_s({"x-ogw-ratelimit-reset": "soon", "retry-after": "4"}) == 4.0
    no_header = rate_limit_error(
        200, 230020, {}, limit_codes=APP_LIMIT_CODES, fallback_s=1.0, what="x"
    )
    assert no_header is not None and no_header.retry_after == 1.0


def test_only_frequency_limits_are_rate_limited() -> None:
    for status, code in ((200, 0), (400, 230001), (500, 500), (200, 9499)):
        assert (
            rate_limit_error(
                status, code, DOC_HEADERS, limit_codes=APP_LIMIT_CODES, fallback_s=1, what="x"
            )
            is None
        )
    assert rate_limit_error(200, 9499, {}, limit_codes=BOT_LIMIT_CODES, fallback_s=1, what="x")


def test_the_bot_follows_the_same_rule() -> None:
    """A custom bot's 11232 (HTTP 200, no header Feishu documents) waits the bot's fallback;
    a wait Feishu asks for, on any limit answer, is honoured."""
    frequency = json.dumps({"code": 11232, "msg": "frequency limited"})
    with pytest.raises(RateLimitedError) as plain:
        classify_response(200, {}, frequency, "w", 0.5)
    assert (plain.value.code, plain.value.retry_after) == (11232, 0.5)
    with pytest.raises(RateLimitedError) as asked:
        classify_response(200, DOC_HEADERS, frequency, "w", 0.5)
    assert asked.value.retry_after == 52.0
    with pytest.raises(RateLimitedError) as http_429:
        classify_response(429, {"Retry-After": "3"}, "", "w", 0.5)
    assert (http_429.value.code, http_429.value.retry_after) == (429, 3.0)
    with pytest.raises(RateLimitedError) as bare_429:
        classify_response(429, {}, "<html>slow down</html>", "w", 0.5)
    assert bare_429.value.retry_after == 0.5
    with pytest.raises(RetryableError):
        classify_response(503, {}, "<html>busy</html>", "w", 0.5)
