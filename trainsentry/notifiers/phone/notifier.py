"""The `phone` channel: places the calls the escalation timeline plans.

The gateway turns each `CallDue` from `gateway/policy/escalation.plan` into an outbox row with
`escalation.call_payload(...)` (kind "call", idempotency key = the call's), and the outbox hands it
here; the configured provider (Feishu urgent_phone by default, Twilio, or an HTTP voice
gateway) places the call.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from trainsentry.alerts import Person
from trainsentry.config.channels import PhoneSettings
from trainsentry.notifiers.base import OutboundNotification, PermanentError, Receipt, Withdrawn
from trainsentry.notifiers.feishu.app import FeishuAppClient
from trainsentry.notifiers.phone.base import PhoneCall, PhoneProvider
from trainsentry.notifiers.phone.feishu import FeishuUrgentPhoneProvider
from trainsentry.notifiers.phone.twilio import TwilioProvider
from trainsentry.notifiers.phone.webhook import WebhookPhoneProvider
from trainsentry.notifiers.ratelimit import RateLimit

log = logging.getLogger(__name__)

CHANNEL = "phone"
CALL_KIND = "call"
# Set in a call's payload (the reason) when its escalation stopped while the call was being
# placed (gateway/stages/services/paging.py `_cancel_calls`): a retry of it must not ring.
CANCELLED_MARK = "cancelled"
# A cap of our own (Twilio queues calls at about 1 per second per number by default).
RATE_LIMITS: tuple[RateLimit, ...] = (RateLimit(1, 1.0),)


def phone_call_from(notification: OutboundNotification) -> PhoneCall:
    payload = notification.payload
    try:
        person = payload["person"]
        return PhoneCall(
            person=Person(
                name=str(person["name"]),
                phone=str(person.get("phone") or ""),
                feishu_open_id=str(person.get("feishu_open_id") or ""),
            ),
            text=str(payload["text"]),
            alert_id=int(payload["alert_id"]),
            idempotency_key=notification.idempotency_key,
            message_id=payload.get("message_id") or None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PermanentError(f"call payload invalid: {exc!r}") from exc


class PhoneNotifier:
    rate_limits: tuple[RateLimit, ...] = RATE_LIMITS

    def __init__(self, provider: PhoneProvider, *, name: str = CHANNEL) -> None:
        self.name = name
        self.provider = provider

    @classmethod
    def from_settings(
        cls,
        settings: PhoneSettings,
        *,
        feishu: FeishuAppClient | None = None,
        env: Mapping[str, str] | None = None,
    ) -> PhoneNotifier:
        provider: PhoneProvider
        if settings.provider == "twilio" and settings.twilio is not None:
            provider = TwilioProvider.from_settings(settings.twilio, env)
        elif settings.provider == "webhook" and settings.webhook is not None:
            provider = WebhookPhoneProvider.from_settings(settings.webhook, env)
        else:
            if feishu is None:
                raise ValueError("phone provider feishu needs the Feishu app (channels.feishu_app)")
            provider = FeishuUrgentPhoneProvider(feishu)
        return cls(provider)

    async def send(self, notification: OutboundNotification) -> Receipt:
        if notification.payload.get("status") == "resolved":
            raise Withdrawn("refusing to call about a resolved alert")
        if cancelled := notification.payload.get(CANCELLED_MARK):
            raise Withdrawn(f"call cancelled: escalation stopped ({cancelled})")
        call = phone_call_from(notification)
        receipt = await self.provider.call(call)
        log.info(
            "event=phone_call_placed provider=%s alert_id=%s person=%s step=%s",
            receipt.provider, call.alert_id, call.person.name, notification.payload.get("step"),
        )  # fmt: skip
        return Receipt(
            channel=self.name,
            provider_id=receipt.call_id,
            detail={"provider": receipt.provider, **receipt.detail},
        )

    async def aclose(self) -> None:
        await self.provider.aclose()
