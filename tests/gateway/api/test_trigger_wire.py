"""The messages between the gateway and its trigger port's process (api/trigger_wire.py):
length-prefixed JSON objects, none over `MAX_MESSAGE_BYTES` either way."""

from __future__ import annotations

import asyncio
import struct

import pytest

from trainsentry.gateway.api.trigger_wire import (
    MAX_MESSAGE_BYTES,
    WireError,
    encode,
    read_message,
)


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=MAX_MESSAGE_BYTES)
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_messages_round_trip_and_a_close_reads_as_none() -> None:
    sent = [{"op": "ready"}, {"op": "forget", "job": ["team-a", "llama"]}]
    reader = reader_of(b"".join(encode(m) for m in sent) + encode({"op": "x"})[:3])
    assert [await read_message(reader) for _ in sent] == sent
    assert await read_message(reader) is None  # closed mid-message: the peer is gone


async def test_no_message_over_the_bound_is_sent_or_taken() -> None:
    with pytest.raises(WireError):
        encode({"op": "noted", "triggers": ["x" * MAX_MESSAGE_BYTES]})
    with pytest.raises(WireError, match="announced"):
        await read_message(reader_of(struct.pack(">I", MAX_MESSAGE_BYTES + 1) + b"{}"))
    for body in (b"[1]", b"\xff"):
        with pytest.raises(WireError):
            await read_message(reader_of(struct.pack(">I", len(body)) + body))
