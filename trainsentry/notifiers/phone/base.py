"""The phone-call provider interface: one call to one person, a receipt or a NotifierError."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trainsentry.alerts import Person


@dataclass(frozen=True, slots=True)
class PhoneCall:
    """What to say to whom. `message_id` (Feishu) lets urgent_phone ring about that card."""

    person: Person
    text: str
    alert_id: int
    idempotency_key: str
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class CallReceipt:
    provider: str
    call_id: str | None
    detail: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class PhoneProvider(Protocol):
    name: str

    async def call(self, call: PhoneCall) -> CallReceipt: ...

    async def aclose(self) -> None: ...
