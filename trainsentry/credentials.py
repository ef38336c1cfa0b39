"""Presented secrets (tokens, signatures, CSRF nonces) compared with the expected ones: on
the bytes they came in, in constant time. The one home of the comparison the gateway's
authentication (API tokens, the console's sign-in and CSRF, calendar keys, hang triggers)
and the Feishu channel (callback tokens and signatures) share. Pure: no I/O."""

from __future__ import annotations

import hmac


def wire_bytes(value: str) -> bytes:
    """Pure: `value` as the bytes it came in, for comparing and signing; never raises.

    aiohttp decodes header values as UTF-8 with `surrogateescape`, so a header's bytes come
    back exactly; a lone surrogate from a JSON escape (which no real secret holds) is kept
    with `surrogatepass`, so it compares unequal instead of raising."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def secrets_equal(given: str, expected: str) -> bool:
    """Pure: constant-time comparison of a presented secret with the configured one, on
    bytes (`hmac.compare_digest` raises TypeError for non-ASCII `str`)."""
    return hmac.compare_digest(wire_bytes(given), wire_bytes(expected))
