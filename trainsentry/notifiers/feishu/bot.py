"""Feishu custom-bot webhook channel: one card per notification, signed when a secret is set.

Routing: one webhook per priority group (`FeishuBotSettings.groups`), overridable per job
(`jobs: {"ns/name": ...}`). Feishu limits each custom bot to 5 requests/s and 100/min and a
20 KB body; the limits are published as `RATE_LIMITS` and also enforced here by a
per-webhook sliding window, so a burst never earns an 11232.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from trainsentry.alerts import Priority
from trainsentry.config.channels import FeishuBotSettings, WebhookTarget
from trainsentry.notifiers.base import (
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    Receipt,
    RetryableError,
)
from trainsentry.notifiers.feishu.backoff import BOT_LIMIT_CODES, rate_limit_error
from trainsentry.notifiers.feishu.card import (
    DEFAULT_OPTIONS,
    MAX_BOT_BODY_BYTES,
    CardOptions,
    CardTooLarge,
    build_card,
    compact_json,
)
from trainsentry.notifiers.feishu.sign import bot_sign
from trainsentry.notifiers.payload_contract import PayloadError, job_of, parse_payload
from trainsentry.notifiers.ratelimit import RateGate, RateLimit
from trainsentry.notifiers.settings import read_secret

log = logging.getLogger(__name__)

CHANNEL = "feishu_bot"
RATE_LIMITS: tuple[RateLimit, ...] = (RateLimit(5, 1.0), RateLimit(100, 60.0))
# Configuration problems: retrying cannot help, a human must fix the bot's settings.
PERMANENT_CODES: Mapping[int, str] = {
    19021: "signature mismatch or timestamp more than an hour off (check the secret / clock)",
    19022: "caller IP not in the bot's allow list",
    19024: "message lacks the bot's required keyword",
}
DEFAULT_RATE_LIMIT_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True)
class BotWebhook:
    """A resolved webhook. `url` and `secret` are credentials: never logged or repr'd."""

    name: str
    url: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class WebhookRouter:
    """Chooses the webhook for a notification: job override first, then priority group."""

    by_priority: Mapping[Priority, BotWebhook]
    by_job: Mapping[str, BotWebhook] = field(default_factory=dict)

    def select(self, priority: Priority, job: str) -> BotWebhook:
        if job and job in self.by_job:
            return self.by_job[job]
        try:
            return self.by_priority[priority]
        except KeyError:
            raise PermanentError(f"no Feishu bot webhook configured for {priority}") from None

    @classmethod
    def from_settings(
        cls, settings: FeishuBotSettings, env: Mapping[str, str] | None = None
    ) -> WebhookRouter:
        def resolve(name: str, target: WebhookTarget) -> BotWebhook:
            secret = read_secret(target.secret_env, env) if target.secret_env else None
            return BotWebhook(name, read_secret(target.url_env, env), secret)

        by_priority: dict[Priority, BotWebhook] = {}
        for name, group in settings.groups.items():
            webhook = resolve(f"group:{name}", group)
            for priority in group.priorities:
                by_priority[priority] = webhook
        by_job = {job: resolve(f"job:{job}", target) for job, target in settings.jobs.items()}
        return cls(by_priority, by_job)


def signed_body(card: dict[str, Any], secret: str | None, timestamp: int) -> dict[str, Any]:
    body: dict[str, Any] = {"msg_type": "interactive", "card": card}
    if secret:
        body = {"timestamp": str(timestamp), "sign": bot_sign(timestamp, secret), **body}
    return body


def classify_response(
    status: int,
    headers: Mapping[str, str],
    text: str,
    webhook: str,
    rate_limit_backoff_s: float = DEFAULT_RATE_LIMIT_BACKOFF_S,
) -> None:
    """Raises the NotifierError a Feishu bot answer means; returns on success. A frequency
    limit waits what Feishu asks, else `rate_limit_backoff_s` (backoff.py)."""
    try:
        answer: dict[str, Any] | None = json.loads(text) if text else {}
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        answer = None
    fields = answer or {}
    code: Any = fields.get("code", fields.get("StatusCode", 0 if status < 400 else status))
    limited = rate_limit_error(
        status, code, headers, limit_codes=BOT_LIMIT_CODES, fallback_s=rate_limit_backoff_s,
        what="Feishu bot",
    )  # fmt: skip
    if limited is not None:
        raise limited
    if status >= 500:
        raise RetryableError(f"Feishu bot HTTP {status}", code=status)
    if answer is None:
        raise RetryableError(f"Feishu bot answered HTTP {status} without a JSON object")
    if code in (0, None) and status < 400:
        return
    message = str(fields.get("msg") or fields.get("StatusMessage") or "")
    if code in PERMANENT_CODES:
        # Loud on purpose: this bot drops every message until someone fixes its settings.
        log.error(
            "event=feishu_bot_misconfigured webhook=%s code=%s reason=%r feishu_msg=%r",
            webhook,
            code,
            PERMANENT_CODES[code],
            message,
        )
        raise PermanentError(f"Feishu bot {webhook}: {PERMANENT_CODES[code]}", code=code)
    if status >= 400:
        raise PermanentError(f"Feishu bot HTTP {status} code {code}: {message}", code=code)
    # Unknown non-zero code: let the outbox retry a bounded number of times, then dead-letter.
    raise RetryableError(f"Feishu bot code {code}: {message}", code=code)


class FeishuBotNotifier:
    """The `feishu_bot` channel."""

    rate_limits: tuple[RateLimit, ...] = RATE_LIMITS

    def __init__(
        self,
        router: WebhookRouter,
        *,
        client: httpx.AsyncClient | None = None,
        name: str = CHANNEL,
        rate_limits: Sequence[RateLimit] = RATE_LIMITS,
        max_wait_s: float = 2.0,
        slack_s: float = 0.05,
        card_options: CardOptions = DEFAULT_OPTIONS,
        wall_clock: Callable[[], float] = time.time,
        timeout_s: float = 10.0,
    ) -> None:
        self.name = name
        self.router = router
        self.rate_limits = tuple(rate_limits)
        self.card_options = card_options
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._owns_client = client is None
        self._gates: dict[str, RateGate] = {}
        self._max_wait_s = max_wait_s
        self._slack_s = slack_s
        self._wall_clock = wall_clock

    @classmethod
    def from_settings(
        cls, settings: FeishuBotSettings, env: Mapping[str, str] | None = None
    ) -> FeishuBotNotifier:
        return cls(
            WebhookRouter.from_settings(settings, env),
            max_wait_s=settings.max_wait_s,
            timeout_s=settings.timeout_s,
        )

    def webhook_for(self, notification: OutboundNotification) -> BotWebhook:
        job = job_of(parse_payload(notification.payload))
        return self.router.select(notification.priority, job)

    def _gate(self, webhook: BotWebhook) -> RateGate:
        gate = self._gates.get(webhook.name)
        if gate is None:
            gate = RateGate(self.rate_limits, max_wait=self._max_wait_s, slack_s=self._slack_s)
            self._gates[webhook.name] = gate
        return gate

    def render(self, notification: OutboundNotification) -> dict[str, Any]:
        try:
            payload = parse_payload(notification.payload)
            return build_card(notification.kind, payload, self.card_options)
        except (PayloadError, CardTooLarge, ValueError) as exc:
            raise PermanentError(str(exc)) from exc

    async def send(self, notification: OutboundNotification) -> Receipt:
        try:
            webhook = self.webhook_for(notification)
        except PayloadError as exc:
            raise PermanentError(str(exc)) from exc
        card = self.render(notification)
        body = compact_json(signed_body(card, webhook.secret, int(self._wall_clock())))
        if len(body.encode()) > MAX_BOT_BODY_BYTES:
            raise PermanentError(f"card body is {len(body.encode())} bytes, over Feishu's 20 KB")
        gate = self._gate(webhook)
        slot = await gate.acquire()
        if isinstance(slot, float):
            raise RateLimitedError(
                f"webhook {webhook.name} at its rate limit", code="local", retry_after=slot
            )
        try:
            response = await self._client.post(
                webhook.url,
                content=body.encode(),
                headers={"Content-Type": "application/json; charset=utf-8"},
            )
        except httpx.HTTPError as exc:
            raise RetryableError(f"Feishu bot {webhook.name}: {type(exc).__name__}") from exc
        finally:
            gate.done(slot)
        # When Feishu asks no wait: one shortest window, after which a slot is free.
        shortest = min(limit.per_seconds for limit in self.rate_limits)
        classify_response(
            response.status_code, response.headers, response.text, webhook.name, shortest
        )
        log.info(
            "event=feishu_bot_sent webhook=%s notification=%s kind=%s priority=%s",
            webhook.name,
            notification.id,
            notification.kind,
            notification.priority,
        )
        return Receipt(channel=self.name, provider_id=None, detail={"webhook": webhook.name})

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
