"""Feishu app API client (httpx) and the `feishu_app` channel.

`FeishuAppClient` holds the tenant_access_token (cached, refreshed before it expires, and
refreshed once more if Feishu says it is invalid) and wraps the calls trainsentry uses:
send a message to a chat or user, update a card, and the urgent_phone buzz. The Sheets
archive and the Feishu phone provider share one client.

Feishu counts its message limits (RATE_LIMITS) per app, whichever channel sends. Clients of
one app given one `message_gate` (`app_message_gate`; gateway/channels.py gives every client
of the app the same one) keep their sends and card updates together under those limits; a
send that would wait more than the gate's `max_wait` is a RateLimitedError the outbox
retries later without counting it as a failure.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from trainsentry.alerts import Priority
from trainsentry.config.channels import FeishuAppSettings
from trainsentry.notifiers.base import (
    NotifierError,
    OutboundNotification,
    PermanentError,
    RateLimitedError,
    Receipt,
    RetryableError,
)
from trainsentry.notifiers.feishu.backoff import APP_FALLBACK_S, APP_LIMIT_CODES, rate_limit_error
from trainsentry.notifiers.feishu.card import CardOptions, CardTooLarge, build_card, compact_json
from trainsentry.notifiers.payload_contract import PayloadError, parse_payload
from trainsentry.notifiers.ratelimit import RateGate, RateLimit, Slot
from trainsentry.notifiers.settings import read_secret

log = logging.getLogger(__name__)

CHANNEL = "feishu_app"
TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
# Feishu documents im/v1/messages at 1000/min and 50/s per app.
RATE_LIMITS: tuple[RateLimit, ...] = (RateLimit(50, 1.0), RateLimit(1000, 60.0))
TOKEN_INVALID_CODES = frozenset({99991661, 99991663, 99991668, 99991677})
# What the tenant_access_token endpoint answers to credentials it will never accept: an
# unknown app_id (10003 "invalid param") or a wrong app_secret (10014 "app secret invalid").
CREDENTIAL_CODES = frozenset({10003, 10014})
DEFAULT_TOKEN_LIFETIME_S = 7200.0  # Feishu's documented maximum
UUID_MAX = 50
# Finds the message_id of the card an `ack` redraws when its payload has none (the gateway
# reads the alert's sent card from the store: gateway/stages/services/ack.py
# `AckService.card_message`).
CardFinder = Callable[[OutboundNotification], Awaitable[str | None]]
# How long a send waits for the app's shared message gate before it is put back as rate
# limited (well within the outbox's 30 s send deadline).
MESSAGE_GATE_MAX_WAIT_S = 2.0
# Feishu updates one message at most 5 times a second ("单条消息更新频控为 5 QPS",
# im-v1/message/patch); the client keeps each card's updates under it (the gates of the
# most recently updated cards are kept).
CARD_UPDATE_LIMIT = RateLimit(5, 1.0)
CARD_GATES_KEPT = 1024


def app_message_gate(
    limits: tuple[RateLimit, ...] = RATE_LIMITS, max_wait_s: float = MESSAGE_GATE_MAX_WAIT_S
) -> RateGate:
    """The gate one Feishu app's messages share (sends and card updates of all its channels).
    Conservative: Feishu lists sending and updating as two APIs of 50/s and 1000/min each;
    the gate keeps both together under one."""
    return RateGate(limits, max_wait=max_wait_s)


class FeishuAppClient:
    """Authenticated calls to the Feishu open API for one app."""

    def __init__(
        self,
        base_url: str,
        app_id: str,
        app_secret: str,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_margin_s: float = 300.0,
        timeout_s: float = 10.0,
        message_gate: RateGate | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.app_id = app_id
        self._app_secret = app_secret
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._owns_client = client is None
        self._clock = clock
        self._refresh_margin_s = refresh_margin_s
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = asyncio.Lock()
        self.tokens_fetched = 0
        # the app's message limits, shared with the other clients of the app (None: the
        # caller, e.g. the outbox's gate of one channel, keeps to them)
        self.message_gate = message_gate
        self._card_gates: dict[str, RateGate] = {}  # message_id -> its updates' gate

    @classmethod
    def from_settings(
        cls,
        settings: FeishuAppSettings,
        env: Mapping[str, str] | None = None,
        *,
        message_gate: RateGate | None = None,
    ) -> FeishuAppClient:
        return cls(
            settings.base_url,
            settings.app_id,
            read_secret(settings.app_secret_env, env),
            timeout_s=settings.timeout_s,
            message_gate=message_gate,
        )

    def __repr__(self) -> str:
        return f"FeishuAppClient(base_url={self.base_url!r}, app_id={self.app_id!r})"

    async def tenant_token(self) -> str:
        """The cached token, fetched anew when it is within the refresh margin of expiring."""
        async with self._lock:
            if self._token is not None and self._clock() < self._refresh_at:
                return self._token
            try:
                response = await self._client.post(
                    self.base_url + TOKEN_PATH,
                    json={"app_id": self.app_id, "app_secret": self._app_secret},
                )
            except httpx.HTTPError as exc:
                raise RetryableError(f"Feishu token request failed: {type(exc).__name__}") from exc
            answer = _json(response)
            refused = token_failure(response.status_code, response.headers, answer)
            if refused is not None:
                level = logging.WARNING if refused.retryable else logging.ERROR
                log.log(
                    level,
                    "event=feishu_token_%s app_id=%s http=%s code=%s",
                    "unavailable" if refused.retryable else "refused",
                    self.app_id, response.status_code, refused.code,
                )  # fmt: skip
                raise refused
            expire = _expire_s(answer)
            # Refresh with a margin, but never later than half-way through a short lifetime.
            margin = min(self._refresh_margin_s, expire / 2)
            self._token = str(answer["tenant_access_token"])
            self._refresh_at = self._clock() + expire - margin
            self.tokens_fetched += 1
            log.info("event=feishu_token_refreshed app_id=%s expire_s=%s", self.app_id, expire)
            return self._token

    def invalidate_token(self) -> None:
        self._token = None

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> dict[str, Any]:
        """One API call; returns `data`. Retries once with a fresh token if Feishu says so."""
        for attempt in (1, 2):
            token = await self.tenant_token()
            try:
                response = await self._client.request(
                    method,
                    self.base_url + path,
                    params=params,
                    json=body,
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json; charset=utf-8",
                    },
                )
            except httpx.HTTPError as exc:
                raise RetryableError(f"Feishu {path}: {type(exc).__name__}") from exc
            answer = _json(response)
            code = answer.get("code", 0 if response.status_code < 400 else response.status_code)
            if code in TOKEN_INVALID_CODES:
                self.invalidate_token()
                if attempt == 1:
                    continue
                raise RetryableError(f"Feishu {path}: token still invalid", code=code)
            _raise_for(response.status_code, code, response.headers, answer, path)
            data = answer.get("data")
            return data if isinstance(data, dict) else {}
        raise AssertionError("unreachable")

    async def send_message(
        self,
        receive_id: str,
        msg_type: str,
        content: Mapping[str, Any],
        *,
        receive_id_type: str = "chat_id",
        uuid: str | None = None,
    ) -> str:
        """Sends a message; returns its message_id. `uuid` makes a retry a no-op (1 hour)."""
        body: dict[str, Any] = {
            "receive_id": receive_id,
            "msg_type": msg_type,
            "content": compact_json(content),
        }
        if uuid:
            body["uuid"] = dedup_uuid(uuid)
        slot = await self._message_slot()
        try:
            data = await self.call(
                "POST", "/open-apis/im/v1/messages", params={"receive_id_type": receive_id_type},
                body=body,
            )  # fmt: skip
        finally:
            self._message_done(slot)
        message_id = data.get("message_id")
        if not message_id:
            raise RetryableError("Feishu answered without a message_id")
        return str(message_id)

    async def open_ids_by_email(self, emails: Sequence[str]) -> dict[str, str]:
        """The open_id of each address Feishu knows (contact v3 `users/batch_get_id`, at most
        50 a call; needs the app scope contact:user.id:readonly). An address Feishu does not
        return (unknown, resigned, outside the app's availability) is left out."""
        found: dict[str, str] = {}
        for start in range(0, len(emails), 50):
            data = await self.call(
                "POST",
                "/open-apis/contact/v3/users/batch_get_id",
                params={"user_id_type": "open_id"},
                body={"emails": list(emails[start : start + 50]), "include_resigned": False},
            )
            for user in data.get("user_list") or []:
                if isinstance(user, dict) and user.get("email") and user.get("user_id"):
                    found[str(user["email"])] = str(user["user_id"])
        return found

    async def update_card(self, message_id: str, card: Mapping[str, Any]) -> None:
        """Updates a card this app sent (im/v1/messages PATCH), within Feishu's 5 updates a
        second of one message (a wait past the gate's limit is a RateLimitedError)."""
        gate = self._card_gates.pop(message_id, None) or RateGate(
            (CARD_UPDATE_LIMIT,), max_wait=MESSAGE_GATE_MAX_WAIT_S
        )
        self._card_gates[message_id] = gate  # the most recent last
        while len(self._card_gates) > CARD_GATES_KEPT:
            del self._card_gates[next(iter(self._card_gates))]
        turn = await gate.acquire()
        if isinstance(turn, float):
            raise RateLimitedError(f"card {message_id} updated too often", retry_after=turn)
        try:
            await self._update_card(message_id, card)
        finally:
            gate.done(turn)

    async def _update_card(self, message_id: str, card: Mapping[str, Any]) -> None:
        slot = await self._message_slot()
        try:
            await self.call(
                "PATCH",
                f"/open-apis/im/v1/messages/{message_id}",
                body={"content": compact_json(card)},
            )
        finally:
            self._message_done(slot)

    async def _message_slot(self) -> Slot | None:
        """A turn under the app's message limits (None without a shared gate)."""
        if self.message_gate is None:
            return None
        slot = await self.message_gate.acquire()
        if isinstance(slot, float):
            raise RateLimitedError(
                f"the Feishu app {self.app_id}'s message limit is reached", retry_after=slot
            )
        return slot

    def _message_done(self, slot: Slot | None) -> None:
        if slot is not None and self.message_gate is not None:
            self.message_gate.done(slot)

    async def urgent_phone(
        self, message_id: str, user_ids: Sequence[str], *, user_id_type: str = "open_id"
    ) -> list[str]:
        """Rings the users' phones about `message_id`; returns the ids Feishu could not ring."""
        data = await self.call(
            "PATCH",
            f"/open-apis/im/v1/messages/{message_id}/urgent_phone",
            params={"user_id_type": user_id_type},
            body={"user_id_list": list(user_ids)},
        )
        return [str(u) for u in data.get("invalid_user_id_list") or []]

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


async def find_card(finder: CardFinder | None, notification: OutboundNotification) -> str | None:
    """The message_id `finder` gives for an ack (None without one); its failure (the store
    unreachable) is retried, never answered with a second card."""
    if finder is None:
        return None
    try:
        return await finder(notification)
    except Exception as exc:
        raise RetryableError(f"the card to redraw could not be read: {type(exc).__name__}") from exc


def dedup_uuid(key: str) -> str:
    """Feishu's message `uuid` is at most 50 characters; longer keys are hashed."""
    return key if len(key) <= UUID_MAX else hashlib.sha256(key.encode()).hexdigest()[:40]


def token_failure(
    status: int, headers: Mapping[str, str], answer: Mapping[str, Any]
) -> NotifierError | None:
    """Pure: the error a tenant_access_token answer means, or None when it carries a token.

    Only a refusal of the credentials is permanent (a CREDENTIAL_CODES code, or HTTP 401 /
    403): nothing but a person fixing the app_id or secret helps. A frequency limit (HTTP 429
    or code 99991400, whatever the status) waits what Feishu asks (backoff.py); a 5xx, an
    answer that is not JSON or lacks the token, or a code we do not know is retried with
    back-off, so a Feishu hiccup on the token endpoint never kills a page.
    """
    code = answer.get("code")
    limited = rate_limit_error(
        status, code, headers, limit_codes=APP_LIMIT_CODES, fallback_s=APP_FALLBACK_S,
        what="Feishu token endpoint",
    )  # fmt: skip
    if limited is not None:
        return limited
    if status >= 500:
        return RetryableError(f"Feishu token HTTP {status}", code=status)
    token = answer.get("tenant_access_token")
    if status < 300 and code == 0 and isinstance(token, str) and token:
        return None
    if code in CREDENTIAL_CODES or status in (401, 403):
        return PermanentError(f"Feishu refused the app credentials (code {code})", code=code)
    return RetryableError(f"Feishu token answer HTTP {status} code {code} has no token", code=code)


def _expire_s(answer: Mapping[str, Any]) -> float:
    """Pure: the token's lifetime, within Feishu's documented 0..2 h (0: fetch anew next time)."""
    try:
        value = float(answer.get("expire", DEFAULT_TOKEN_LIFETIME_S))
    except (TypeError, ValueError):
        return DEFAULT_TOKEN_LIFETIME_S
    if value != value:  # NaN
        return 0.0
    return min(max(value, 0.0), DEFAULT_TOKEN_LIFETIME_S)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _raise_for(
    status: int, code: Any, headers: Mapping[str, str], answer: Mapping[str, Any], path: str
) -> None:
    limited = rate_limit_error(
        status, code, headers, limit_codes=APP_LIMIT_CODES, fallback_s=APP_FALLBACK_S,
        what=f"Feishu {path}",
    )  # fmt: skip
    if limited is not None:
        raise limited
    if status >= 500:
        raise RetryableError(f"Feishu {path} HTTP {status}", code=code)
    if code not in (0, None) or status >= 400:
        message = answer.get("msg", "")
        log.error(
            "event=feishu_api_refused path=%s http=%s code=%s msg=%r", path, status, code, message
        )
        raise PermanentError(f"Feishu {path} refused: code {code} {message}", code=code)


class FeishuAppNotifier:
    """The `feishu_app` channel: cards to chats through the app, with ack/silence buttons.

    Custom bots cannot receive card callbacks, so the interactive card goes through the app
    when one is configured. An `ack`, and an incident's card drawn again (`redraw` in its
    payload: an alert joined, resolved), update the incident's card in place (its
    `message_id`, im/v1/messages PATCH) instead of posting a new one; when Feishu refuses the
    update for good (the card was recalled, is past Feishu's 14 days, or is not one this app
    sent), the card is posted anew. One drafted while the card was still queued has no
    `message_id`; `find_card`, when the gateway sets it, looks the card up at send time (the
    outbox sends it after the incident's earlier cards of its channel: one group).
    """

    rate_limits: tuple[RateLimit, ...] = RATE_LIMITS
    updates_cards = True  # the policy redraws an incident's card here (notifiers/base.py)

    def __init__(
        self,
        client: FeishuAppClient,
        chats: Mapping[Priority, str],
        *,
        name: str = CHANNEL,
        card_options: CardOptions | None = None,
        receive_id_type: str = "chat_id",
    ) -> None:
        self.name = name
        self.client = client
        self.chats = dict(chats)
        self.card_options = card_options or CardOptions(actions=True)
        self.receive_id_type = receive_id_type
        self.find_card: CardFinder | None = None

    @classmethod
    def from_settings(
        cls, settings: FeishuAppSettings, client: FeishuAppClient
    ) -> FeishuAppNotifier:
        chats = {p: chat for chat, priorities in settings.chats.items() for p in priorities}
        options = CardOptions(actions=settings.callback is not None)
        return cls(client, chats, card_options=options)

    async def send(self, notification: OutboundNotification, *, chat: str | None = None) -> Receipt:
        """Sends the card to the chat of its priority, or to `chat` when given (a
        TrainingJob's own chat: stages/services/job_alerting.py)."""
        try:
            payload = parse_payload(notification.payload)
            card = build_card(notification.kind, payload, self.card_options)
        except (PayloadError, CardTooLarge, ValueError) as exc:
            raise PermanentError(str(exc)) from exc
        existing = notification.payload.get("message_id")
        redraw = notification.kind == "ack" or bool(notification.payload.get("redraw"))
        if redraw and not existing:
            existing = await find_card(self.find_card, notification)
        if redraw and isinstance(existing, str) and existing:
            try:
                await self.client.update_card(existing, card)
            except PermanentError as exc:
                log.warning(
                    "event=feishu_card_update_refused notification=%s message_id=%s code=%s",
                    notification.id, existing, exc.code,
                )  # fmt: skip
            else:
                return Receipt(channel=self.name, provider_id=existing, detail={"updated": True})
        chat = chat or self.chats.get(notification.priority)
        if chat is None:
            raise PermanentError(f"no Feishu chat configured for {notification.priority}")
        message_id = await self.client.send_message(
            chat,
            "interactive",
            card,
            receive_id_type=self.receive_id_type,
            uuid=notification.idempotency_key,
        )
        log.info(
            "event=feishu_app_sent notification=%s message_id=%s priority=%s",
            notification.id, message_id, notification.priority,
        )  # fmt: skip
        return Receipt(channel=self.name, provider_id=message_id, detail={"chat": chat})

    async def aclose(self) -> None:
        await self.client.aclose()
