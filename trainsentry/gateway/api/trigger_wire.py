"""What the gateway and its trigger port's process (api/trigger_listener.py, the parent;
api/trigger_process.py, the child) say to each other over their socket pair: length-prefixed
JSON messages, each a JSON object with an "op".

Parent to child:
- `config` (first, once): the master probe token (`master`; None: the gateway has no hang
  diagnosis, every trigger is answered 404), the body bounds, the log level. The token
  travels only here: never in the child's argv or environment, never logged.
- `answer` {id, status, body, headers, job, known_s, hosts?, hosts_s?}: a handed trigger's
  HTTP answer, and what the child should now remember of its job: for how many seconds its
  hang is known (`known_s`; None: not known), and, when the child asked, the job's rank
  hosts and for how many seconds they are fresh.
- `forget` {job}: the job's hang left the gateway's memory (ended, gone from the store,
  evicted): the child stops answering "known" for it.

Child to parent:
- `ready` (once, when it accepts on the trigger port).
- `hand` {id, trigger, remote, hosts}: a trigger the child does not answer from memory;
  `hosts`: the child wants the job's rank hosts with the answer.
- `noted` {triggers: [[fields, remote]], dropped, refused: {label: n}}: the triggers it
  answered "known" since the last one (at most `MAX_BATCH`; `dropped` beyond), and the
  refusals it counted, for the gateway's evidence and metrics.

Invariants:
- A message is at most `MAX_MESSAGE_BYTES`: a longer one is never sent (`WireError`), and a
  peer that announces one is dropped (the reader raises `WireError`).
- Pure but for the stream calls: `read_message` / `write_message` do no other I/O.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Mapping
from typing import Any

#: The largest message either side sends or takes (a 16,384-rank job's hosts fit).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: The most "known" triggers one `noted` message carries.
MAX_BATCH = 512
_HEADER = struct.Struct(">I")


class WireError(ValueError):
    """A message over `MAX_MESSAGE_BYTES`, or not a JSON object."""


def encode(message: Mapping[str, Any]) -> bytes:
    """Pure: the message as it goes on the wire (header and JSON)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data)} bytes, over {MAX_MESSAGE_BYTES}")
    return _HEADER.pack(len(data)) + data


def write_message(writer: asyncio.StreamWriter, message: Mapping[str, Any]) -> None:
    """Queues `message` on `writer` (the caller drains it when it may wait)."""
    writer.write(encode(message))


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message; None when the peer closed the socket (at a message's boundary or
    not)."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_MESSAGE_BYTES:
            raise WireError(f"message of {size} bytes announced, over {MAX_MESSAGE_BYTES}")
        data = await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise WireError("not a JSON object")
    return message


def job_of(message: Mapping[str, Any]) -> tuple[str, str]:
    """Pure: the (namespace, name) of a message's "job"."""
    namespace, name = message["job"]
    return str(namespace), str(name)
