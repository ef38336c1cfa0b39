"""Phone calls through Feishu's urgent_phone (the default provider: no extra vendor).

Feishu rings a user about a message the app sent. With a `message_id` (the alert card in
the on-call chat) that message is used; otherwise the app first sends the person a short
direct message (de-duplicated by the call's idempotency key) and rings about that. The
message is a Feishu text message, and its words come from the alert: they are escaped
(`markup.escape_text`), so they mention nobody and link nowhere.
"""

from __future__ import annotations

from trainsentry.notifiers.base import PermanentError
from trainsentry.notifiers.feishu.app import FeishuAppClient
from trainsentry.notifiers.feishu.markup import escape_text
from trainsentry.notifiers.phone.base import CallReceipt, PhoneCall


class FeishuUrgentPhoneProvider:
    name = "feishu"

    def __init__(self, client: FeishuAppClient) -> None:
        self.client = client

    async def call(self, call: PhoneCall) -> CallReceipt:
        open_id = call.person.feishu_open_id
        if not open_id:
            raise PermanentError(f"{call.person.name} has no feishu_open_id to ring")
        message_id = call.message_id
        if not message_id:
            message_id = await self.client.send_message(
                open_id,
                "text",
                {"text": escape_text(call.text)},
                receive_id_type="open_id",
                uuid=call.idempotency_key,
            )
        invalid = await self.client.urgent_phone(message_id, [open_id])
        if open_id in invalid:
            raise PermanentError(f"Feishu cannot ring {call.person.name} ({open_id})")
        return CallReceipt(self.name, message_id, {"open_id": open_id})

    async def aclose(self) -> None:
        await self.client.aclose()
