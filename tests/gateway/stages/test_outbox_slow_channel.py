"""A slow channel holds neither another channel's sends nor its own slots for long (issue
19, finding 1): a real loopback endpoint that answers 200 and trickles its body one byte
every 2 s (never tripping a per-read timeout) next to a healthy voice endpoint, on SQLite
and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.receiver import Receiver
from trainsentry.alerts import NotificationDraft, Priority, utcnow
from trainsentry.gateway.stages.outbox import Outbox
from trainsentry.notifiers.webhook import WebhookNotifier
from trainsentry.store.schema import notifications
from trainsentry.store.writes import insert_notifications


class TricklingEndpoint:
    """Answers every request `200 OK` with a 1000-byte body sent one byte every 2 s."""

    def __init__(self) -> None:
        self.requests = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            await reader.readexactly(length)
            self.requests += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            writer.write(b"Content-Length: 1000\r\n\r\n")
            await writer.drain()
            for _ in range(1000):
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(2.0)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def __aenter__(self) -> TricklingEndpoint:
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()


@pytest.fixture
async def trickling() -> AsyncIterator[TricklingEndpoint]:
    async with TricklingEndpoint() as endpoint:
        yield endpoint


def draft(channel: str, key: str, priority: Priority) -> NotificationDraft:
    return NotificationDraft(
        channel=channel,
        kind="call" if channel == "voice" else "alert",
        priority=priority,
        idempotency_key=key,
        payload={"priority": priority.value, "status": "firing", "key": key},
        group_key=f"alert:{key}",
    )


async def enqueue(engine: AsyncEngine, drafts: list[NotificationDraft]) -> None:
    async with engine.begin() as conn:
        await insert_notifications(conn, drafts, utcnow())


async def row_of(engine: AsyncEngine, key: str) -> tuple[str, int, str | None]:
    async with engine.connect() as conn:
        found = (
            await conn.execute(select(notifications).where(notifications.c.idempotency_key == key))
        ).one()
    return found.status, found.attempts, found.last_error


async def test_a_trickling_pager_never_holds_a_p0_call_to_a_healthy_voice_endpoint(
    engine: AsyncEngine, receiver: Receiver, trickling: TricklingEndpoint
) -> None:
    """Before: the call waited for the pager's whole claimed batch (298 s in the report)."""
    outbox = Outbox(
        engine,
        {
            "pager": WebhookNotifier(trickling.url, timeout=5.0),  # 2 s per byte: never trips
            "voice": WebhookNotifier(receiver.url),
        },
    )
    await enqueue(engine, [draft("pager", f"page-{i}", Priority.P1) for i in range(40)])
    outbox.start()
    try:
        for _ in range(200):  # every pager slot is taken by a trickling answer
            if trickling.requests >= 16:
                break
            await asyncio.sleep(0.05)
        assert trickling.requests == 16
        written = asyncio.get_running_loop().time()
        await enqueue(engine, [draft("voice", "call-p0", Priority.P0)])
        outbox.wake()
        while not receiver.requests:
            await asyncio.sleep(0.01)
            assert asyncio.get_running_loop().time() - written < 3.0, "the call is held"
        rang_after = asyncio.get_running_loop().time() - written
    finally:
        await outbox.aclose()
    assert receiver.bodies[0]["payload"]["key"] == "call-p0"
    assert rang_after < 1.0


async def test_a_trickling_answer_is_cut_at_the_send_deadline_and_retried(
    engine: AsyncEngine, trickling: TricklingEndpoint
) -> None:
    outbox = Outbox(
        engine, {"pager": WebhookNotifier(trickling.url, timeout=5.0)}, send_deadline=3.0
    )
    await enqueue(engine, [draft("pager", "page", Priority.P0)])
    started: datetime = utcnow()
    assert await outbox.run_once()
    took = (utcnow() - started).total_seconds()
    await outbox.aclose()
    assert 3.0 <= took < 4.5  # not the 2000 s the trickle would take
    status, attempts, error = await row_of(engine, "page")
    assert (status, attempts) == ("pending", 1)
    assert error == "RetryableError: no answer within the 3 s deadline"
