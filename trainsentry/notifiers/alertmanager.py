"""Alertmanager silences (API v2) for the ack/silence buttons.

`silence_body` is pure: exact-match matchers built from the alert's labels (all of them, or
the `match_labels` subset), a start and an end, who asked and why. `SilenceClient` posts it
to `/api/v2/silences` and can expire it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from trainsentry.config.channels import AlertmanagerSilenceSettings
from trainsentry.notifiers.base import PermanentError, RetryableError
from trainsentry.notifiers.settings import read_secret

log = logging.getLogger(__name__)


def matchers(
    labels: Mapping[str, str], match_labels: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Equality matchers for the alert's labels (empty values skipped: they match absence)."""
    names = sorted(labels) if match_labels is None else [n for n in match_labels if n in labels]
    found = [
        {"name": name, "value": labels[name], "isRegex": False, "isEqual": True}
        for name in names
        if labels[name] != ""
    ]
    if not found:
        raise PermanentError("no labels to silence on: it would silence everything")
    return found


def silence_body(
    labels: Mapping[str, str],
    *,
    starts_at: datetime,
    duration: timedelta,
    created_by: str,
    comment: str,
    match_labels: Sequence[str] | None = None,
) -> dict[str, Any]:
    if duration <= timedelta(0):
        raise PermanentError("silence duration must be positive")
    return {
        "matchers": matchers(labels, match_labels),
        "startsAt": _rfc3339(starts_at),
        "endsAt": _rfc3339(starts_at + duration),
        "createdBy": created_by,
        "comment": comment,
    }


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


class SilenceClient:
    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        bearer_token: str | None = None,
        created_by: str = "trainsentry",
        match_labels: Sequence[str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.created_by = created_by
        self.match_labels = list(match_labels) if match_labels is not None else None
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._headers = headers

    @classmethod
    def from_settings(
        cls, settings: AlertmanagerSilenceSettings, env: Mapping[str, str] | None = None
    ) -> SilenceClient:
        token = read_secret(settings.bearer_token_env, env) if settings.bearer_token_env else None
        return cls(
            settings.url,
            bearer_token=token,
            created_by=settings.created_by,
            match_labels=settings.match_labels,
        )

    def __repr__(self) -> str:
        return f"SilenceClient(base_url={self.base_url!r})"

    async def create_silence(
        self,
        labels: Mapping[str, str],
        duration: timedelta,
        *,
        who: str,
        comment: str = "",
        now: datetime | None = None,
    ) -> str:
        """Creates a silence for the alert with `labels`; returns its id."""
        body = silence_body(
            labels,
            starts_at=now or datetime.now(UTC),
            duration=duration,
            created_by=f"{self.created_by} ({who})" if who else self.created_by,
            comment=comment or f"silenced from trainsentry by {who}",
            match_labels=self.match_labels,
        )
        answer = await self._request("POST", "/api/v2/silences", body)
        silence_id = str(answer.get("silenceID", ""))
        if not silence_id:
            raise RetryableError("Alertmanager answered without a silenceID")
        log.info(
            "event=silence_created silence_id=%s who=%s duration_s=%d alertname=%s",
            silence_id, who, duration.total_seconds(), labels.get("alertname", ""),
        )  # fmt: skip
        return silence_id

    async def expire_silence(self, silence_id: str) -> None:
        await self._request("DELETE", f"/api/v2/silence/{silence_id}", None)

    async def get_silence(self, silence_id: str) -> dict[str, Any]:
        return await self._request("GET", f"/api/v2/silence/{silence_id}", None)

    async def _request(self, method: str, path: str, body: Any) -> dict[str, Any]:
        try:
            response = await self._client.request(
                method, self.base_url + path, json=body, headers=self._headers
            )
        except httpx.HTTPError as exc:
            raise RetryableError(f"Alertmanager {path}: {type(exc).__name__}") from exc
        if response.status_code >= 500:
            raise RetryableError(f"Alertmanager {path} HTTP {response.status_code}")
        if response.status_code >= 400:
            raise PermanentError(
                f"Alertmanager {path} refused: {response.text[:300]}", code=response.status_code
            )
        if not response.content:
            return {}
        try:
            value = response.json()
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {"value": value}

    async def aclose(self) -> None:
        await self._client.aclose()
