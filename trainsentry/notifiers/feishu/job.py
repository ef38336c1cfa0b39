"""The `feishu_job` channel: a TrainingJob's Feishu cards, sent where its `spec.alerting` says.

The policy routes a job's card here instead of the gateway's Feishu channels when the job has
its own destination or owners to mention (gateway/policy/route.py, `apply_job_route`); the
payload's `job_route` names the job, its owners and the gateway's channels it replaced
(`fallback`). At send time the channel asks for the job's destination as the gateway last
read it from the cluster (`JobDestinations.destination`), so a changed chat is used for the
next card, queued ones included:

- `chat_id`: the card goes through the Feishu app (`im/v1/messages`,
  `receive_id_type=chat_id`), with the app's rate limits and the card's uuid as today;
- a custom bot (`webhook`, read from the job's Secret): signed when the Secret holds a
  signing secret, rate-limited per webhook like `feishu_bot`;
- neither (only owners): the fallback channels carry the card with the mentions.

Owners are `<at>` mentioned on the card: an open_id (`ou_...`) as given, an e-mail address
through the app's contact API (cached). When the job's own route fails for a reason only
its settings can fix (the app is not in the chat, an unknown chat, a webhook that refuses or
cannot be reached), the card goes to the fallback channels instead and the failure is
reported (`JobDestinations.report`: condition, event, metric); a success reports the route
healthy again. Failures that are Feishu's, not the job's (rate limits, the app API down, a
card it refuses in any chat) are raised to the outbox as usual. The webhook URL and secret
are never logged. The receipt's provider id is the Feishu app's message_id of the card (in
the job's chat, or in a fallback chat through the app), so the alert's ack can redraw it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from trainsentry.notifiers.base import (
    Notifier,
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    Receipt,
    RetryableError,
)
from trainsentry.notifiers.feishu.app import (
    RATE_LIMITS,
    CardFinder,
    FeishuAppClient,
    FeishuAppNotifier,
    find_card,
)
from trainsentry.notifiers.feishu.bot import BotWebhook, FeishuBotNotifier, WebhookRouter
from trainsentry.notifiers.feishu.card import CardOptions
from trainsentry.notifiers.ratelimit import RateLimit

log = logging.getLogger(__name__)

CHANNEL = "feishu_job"
# Feishu's answers to a message for a chat the app cannot post to (im/v1/messages):
# 230002 the bot is not in the chat; 230001 an invalid receive_id (no such chat).
CHAT_PROBLEMS: Mapping[int, tuple[str, str]] = {
    230002: ("ChatNotJoined", "the Feishu app is not a member of chat {chat}: add its bot"),
    230001: ("ChatNotFound", "Feishu does not know chat {chat} (code 230001)"),
}
EMAIL_CACHE_S = 3600.0

Problem = tuple[str, str]  # (reason, message): condition reason and human words, no secrets


@dataclass(frozen=True, slots=True)
class JobDestination:
    """Where one job's cards go, as the gateway last read it. `webhook` carries credentials
    (never logged, never repr'd)."""

    chat_id: str | None = None
    webhook: BotWebhook | None = field(default=None, repr=False)


class JobDestinations(Protocol):
    """The gateway's view of the TrainingJobs' alerting settings
    (stages/services/job_alerting.py)."""

    def destination(self, job: str) -> JobDestination | None: ...

    def report(self, job: str, problem: Problem | None, *, fallback: bool) -> None: ...


class _JobWebhooks(Mapping[str, BotWebhook]):
    """The jobs' webhooks, live: what `WebhookRouter.by_job` reads at each send."""

    def __init__(self, destinations: JobDestinations) -> None:
        self._destinations = destinations

    def __getitem__(self, job: str) -> BotWebhook:
        found = self._destinations.destination(job)
        if found is None or found.webhook is None:
            raise KeyError(job)
        return found.webhook

    def __contains__(self, job: object) -> bool:
        if not isinstance(job, str):
            return False
        found = self._destinations.destination(job)
        return found is not None and found.webhook is not None

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


class FeishuJobNotifier:
    """The `feishu_job` channel (see the module docstring)."""

    rate_limits: tuple[RateLimit, ...] = RATE_LIMITS

    def __init__(
        self,
        destinations: JobDestinations,
        *,
        app: FeishuAppClient | None,
        fallbacks: Mapping[str, Notifier],
        card_options: CardOptions | None = None,
        name: str = CHANNEL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.destinations = destinations
        self.app = app
        self.fallbacks = dict(fallbacks)
        self._chat = (
            FeishuAppNotifier(app, {}, name=name, card_options=card_options)
            if app is not None
            else None
        )
        self._bot = FeishuBotNotifier(WebhookRouter({}, _JobWebhooks(destinations)), name=name)
        self._emails: dict[str, tuple[str | None, float]] = {}  # email -> (open_id, at)
        # an ack's card, looked up at send time when its payload has none (FeishuAppNotifier)
        self.find_card: CardFinder | None = None
        self._clock = clock
        self._lock = asyncio.Lock()

    async def send(self, notification: OutboundNotification) -> Receipt:
        route = notification.payload.get("job_route") or {}
        job = str(route.get("job") or "")
        if not job:
            raise PermanentError("a feishu_job notification without payload.job_route.job")
        mentions, missing = await self._mentions(route.get("owners") or [])
        payload = dict(notification.payload)
        payload.setdefault("job", job)  # the bot's router finds the job's webhook by it
        redraw = notification.kind == "ack" and not payload.get("message_id")
        if redraw and (found := await find_card(self.find_card, notification)):
            payload["message_id"] = found
        if mentions:
            payload["mentions"] = list(dict.fromkeys([*payload.get("mentions", []), *mentions]))
        card = replace(notification, payload=payload)
        destination = self.destinations.destination(job)
        problem: Problem | None = None
        if destination is not None and (destination.chat_id or destination.webhook):
            try:
                receipt = await self._own(card, destination)
            except RateLimitedError:
                raise
            except (PermanentError, RetryableError) as exc:
                if destination.chat_id and exc.code not in CHAT_PROBLEMS:
                    raise  # Feishu's trouble (or a card it refuses anywhere), not the job's
                problem = _problem(exc, destination)
            else:
                self.destinations.report(job, missing, fallback=False)
                return receipt
        elif missing is not None:
            self.destinations.report(job, missing, fallback=False)
        fallback = [name for name in route.get("fallback") or [] if name in self.fallbacks]
        if problem is not None:
            self.destinations.report(job, problem, fallback=True)
            log.warning(
                "event=job_route_failed job=%s reason=%s fallback=%s notification=%s",
                job, problem[0], ",".join(fallback) or "-", notification.id,
            )  # fmt: skip
        sent_as: str | None = None  # the app's message_id of the card, for its redraw
        for name in fallback:
            receipt = await self.fallbacks[name].send(replace(card, channel=name))
            if sent_as is None and isinstance(self.fallbacks[name], FeishuAppNotifier):
                sent_as = receipt.provider_id
        detail: dict[str, Any] = {"job": job, "fallback": fallback}
        if problem is not None:
            detail["reason"] = problem[0]
        return Receipt(channel=self.name, provider_id=sent_as, detail=detail)

    async def _own(self, card: OutboundNotification, destination: JobDestination) -> Receipt:
        if destination.chat_id:
            if self._chat is None:
                raise PermanentError("no Feishu app is configured for a job's chatId")
            return await self._chat.send(card, chat=destination.chat_id)
        return await self._bot.send(card)

    async def _mentions(self, owners: list[str]) -> tuple[list[str], Problem | None]:
        """The open_ids to mention, and a problem when an owner could not be found."""
        ids = [owner for owner in owners if owner.startswith("ou_")]
        emails = [owner for owner in owners if "@" in owner]
        if not emails:
            return ids, None
        now = self._clock()
        async with self._lock:
            stale = [
                e for e in emails if now - self._emails.get(e, (None, -1e18))[1] > EMAIL_CACHE_S
            ]
            if stale and self.app is not None:
                try:
                    found = await self.app.open_ids_by_email(stale)
                except (PermanentError, RetryableError) as exc:
                    log.warning("event=owner_lookup_failed error=%s", type(exc).__name__)
                    found = None
                if found is not None:
                    if len(self._emails) > 10_000:  # bounded: forgetting costs one lookup
                        self._emails = {e: v for e, v in self._emails.items() if e in emails}
                    for email in stale:
                        self._emails[email] = (found.get(email), now)
            resolved = {e: self._emails[e][0] for e in emails if e in self._emails}
        ids += [open_id for open_id in resolved.values() if open_id]
        unknown = [e for e in emails if not resolved.get(e)]
        if not unknown:
            return ids, None
        why = "no Feishu app to look them up" if self.app is None else "unknown to Feishu"
        return ids, ("OwnerNotFound", f"owners not mentioned ({why}): {', '.join(unknown)}")

    async def aclose(self) -> None:
        await self._bot.aclose()  # the app client belongs to the channels that built it


def _problem(exc: Exception, destination: JobDestination) -> Problem:
    code = getattr(exc, "code", None)
    if destination.chat_id and isinstance(code, int) and code in CHAT_PROBLEMS:
        reason, words = CHAT_PROBLEMS[code]
        return reason, words.format(chat=destination.chat_id)
    if isinstance(exc, RetryableError):
        return "WebhookUnreachable", f"the job's Feishu bot webhook failed: {exc}"
    return "WebhookRefused", f"the job's Feishu bot webhook refused the card: {exc}"
