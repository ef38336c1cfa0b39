"""The one interface every channel implements (one module per channel, like Alertmanager's notify/).

A channel gets an `OutboundNotification` and either returns a `Receipt` or raises one of
the `NotifierError` subclasses, which tell the outbox what to do next: retry later,
back off for a rate limit, or give up (dead letter).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from trainsentry.alerts import Priority


@dataclass(frozen=True, slots=True)
class OutboundNotification:
    """A notification row from the outbox, as handed to a channel."""

    id: int
    channel: str
    kind: str
    priority: Priority
    payload: dict[str, Any]
    idempotency_key: str
    group_key: str
    created_at: datetime
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof of delivery: the provider's id for what was sent, if it gives one."""

    channel: str
    provider_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class NotifierError(Exception):
    """A failed send. Subclasses say whether and when to try again."""

    retryable: bool = True

    def __init__(self, message: str, *, code: str | int | None = None) -> None:
        super().__init__(message)
        self.code = code


class RetryableError(NotifierError):
    """Transient failure (network, 5xx): retry with exponential backoff."""


class RateLimitedError(NotifierError):
    """The provider said slow down: retry after `retry_after` seconds (or backoff)."""

    def __init__(
        self, message: str, *, code: str | int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class PermanentError(NotifierError):
    """Retrying cannot help (bad signature, bad config, rejected content): dead-letter it."""

    retryable = False


class Withdrawn(PermanentError):
    """The notification no longer applies (a call whose escalation was stopped by an ack or
    a resolve): it ends `cancelled`, which is no delivery failure."""


@runtime_checkable
class Notifier(Protocol):
    """A channel. `name` is the channel name used in routes and outbox rows."""

    name: str

    async def send(self, notification: OutboundNotification) -> Receipt: ...

    async def aclose(self) -> None: ...
