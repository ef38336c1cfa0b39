"""A generic JSON webhook channel: POSTs each notification to a URL.

For chat-ops bridges and in-house paging systems. The body is
`{"id", "idempotency_key", "kind", "priority", "created_at", "payload"}`; the
`Idempotency-Key` header carries the key so the receiver can drop a resend after a crash.
2xx → sent; 429 → rate limited (Retry-After honoured); 408/5xx/network → retry; other 4xx →
permanent. The bearer token, if any, comes from the environment. The URL may carry a
credential (in its path or query), so an error never repeats it, not even where the
receiver's error page echoes the request (`scrub`).
"""

from __future__ import annotations

import httpx

from trainsentry.notifiers.base import (
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    Receipt,
    RetryableError,
)

REDACTED = "<redacted>"
_MIN_SECRET_LEN = 6  # shorter URL parts ("/", "hook", "v2") are kept: they say which page


def scrub(text: str, url: str) -> str:
    """Pure: `text` with every part of `url` that could be a credential replaced: the URL,
    its path and query, and each path segment and query value of 6 characters or more."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return text.replace(url, REDACTED) if url else text
    query = parsed.query.decode("ascii", "replace")
    parts = {url, str(parsed), parsed.raw_path.decode("ascii", "replace"), parsed.path, query}
    parts.update(parsed.path.split("/"))
    parts.update(parsed.raw_path.decode("ascii", "replace").split("?", 1)[0].split("/"))
    parts.update(value for _, value in parsed.params.multi_items())
    parts.update(item.partition("=")[2] for item in query.split("&"))
    for part in sorted(parts, key=len, reverse=True):
        if len(part) >= _MIN_SECRET_LEN:
            text = text.replace(part, REDACTED)
    return text


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


class WebhookNotifier:
    def __init__(
        self,
        url: str,
        *,
        name: str = "webhook",
        bearer_token: str | None = None,
        timeout: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.name = name
        self._url = url
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._client = client or httpx.AsyncClient(timeout=timeout, headers=headers)

    async def send(self, notification: OutboundNotification) -> Receipt:
        body = {
            "id": notification.id,
            "idempotency_key": notification.idempotency_key,
            "kind": notification.kind,
            "priority": notification.priority.value,
            "created_at": notification.created_at.isoformat(),
            "payload": notification.payload,
        }
        try:
            response = await self._client.post(
                self._url, json=body, headers={"Idempotency-Key": notification.idempotency_key}
            )
        except httpx.HTTPError as exc:
            raise RetryableError(f"{type(exc).__name__}: {exc}") from exc
        status = response.status_code
        if 200 <= status < 300:
            return Receipt(channel=self.name, provider_id=response.headers.get("X-Request-Id"))
        if status == 429:
            raise RateLimitedError("rate limited", code=status, retry_after=_retry_after(response))
        if status == 408 or status >= 500:
            raise RetryableError(f"HTTP {status}", code=status)
        raise PermanentError(f"HTTP {status}: {scrub(response.text, self._url)[:200]}", code=status)

    async def aclose(self) -> None:
        await self._client.aclose()
