"""Where Feishu back-off is decided: which answers mean "slow down", and how long to wait.

One rule for every Feishu endpoint trainsentry calls (the app's open APIs and its token
endpoint in `app.py`, custom bot webhooks in `bot.py`): an answer is a frequency limit when
its HTTP status is 429 or its code is one of that API's limit codes (whatever the status:
Feishu's "Rate limits" page, server-docs/api-call-guide/frequency-control, answers older
APIs' limits with HTTP 400). The wait is the one Feishu asks for: the same page documents
`x-ogw-ratelimit-reset` ("recovery period for limit, unit: second") on the open APIs'
limit answers; a standard `Retry-After` (seconds) is honoured where an answer carries one
instead; an answer with neither (the custom bots' 11232, the IM API's 230020, which carry
no header Feishu documents) waits the caller's `fallback_s`. The outbox then retries the
notification after that wait without counting a failure (gateway/policy/outbox_retry.py,
`after_rate_limit`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainsentry.notifiers.base import RateLimitedError

# The app's open APIs: 99991400 "request trigger frequency limit" ("Rate limits" page);
# 11232, the message service's frequency limit; 230020, the IM API's "this operation
# triggers the frequency limit" (e.g. more than 5 updates a second of one message).
APP_LIMIT_CODES = frozenset({99991400, 11232, 230020})
# Custom bots: 11232 past 5/s or 100/min per bot; 9499 is treated as a limit, as asked.
BOT_LIMIT_CODES = frozenset({11232, 9499})
# The app's wait when its answer asks none (one second: the shortest of its windows).
APP_FALLBACK_S = 1.0
# The longest wait an answer may ask for; a larger or unreadable value is ignored.
MAX_WAIT_S = 3600.0
# What Feishu names its wait, first the one its "Rate limits" page documents.
WAIT_HEADERS = ("x-ogw-ratelimit-reset", "retry-after")


def is_rate_limited(status: int, code: object, limit_codes: frozenset[int]) -> bool:
    """Pure: whether an answer (HTTP `status`, the body's `code`) is a frequency limit."""
    return status == 429 or (isinstance(code, int) and code in limit_codes)


def asked_wait_s(headers: Mapping[str, str]) -> float | None:
    """Pure: the seconds a Feishu answer asks to wait (`WAIT_HEADERS`, the first one that
    holds a number within 0..MAX_WAIT_S), or None when it asks for none."""
    lowered = {name.lower(): value for name, value in headers.items()}
    for name in WAIT_HEADERS:
        try:
            value = float(lowered.get(name, ""))
        except ValueError:
            continue
        if math.isfinite(value) and 0 <= value <= MAX_WAIT_S:
            return value
    return None


def rate_limit_error(
    status: int,
    code: object,
    headers: Mapping[str, str],
    *,
    limit_codes: frozenset[int],
    fallback_s: float,
    what: str,
) -> RateLimitedError | None:
    """Pure: the RateLimitedError a Feishu answer means (None when it is no frequency limit),
    waiting what the answer asks (`asked_wait_s`), else `fallback_s`. Its `code` is Feishu's
    code when the body has one, else the HTTP status."""
    if not is_rate_limited(status, code, limit_codes):
        return None
    asked = asked_wait_s(headers)
    return RateLimitedError(
        f"{what} rate limited (HTTP {status}, code {code})",
        code=code if isinstance(code, int | str) else status,
        retry_after=fallback_s if asked is None else asked,
    )
