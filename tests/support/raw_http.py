"""HTTP/1.1 over a raw socket: header bytes exactly as given (clients normalise or refuse
non-ASCII and non-UTF-8 header values, so they cannot send what a hostile client can)."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def raw_request(
    port: int,
    method: str,
    path: bytes | str,
    headers: Sequence[tuple[bytes | str, bytes | str]] = (),
    body: bytes = b"",
    *,
    timeout: float = 10.0,
) -> RawResponse:
    """One request on a fresh connection (Connection: close); the response read to its end."""

    def raw(value: bytes | str) -> bytes:
        return value if isinstance(value, bytes) else value.encode()

    lines = [raw(method) + b" " + raw(path) + b" HTTP/1.1", b"Host: " + LOOPBACK.encode()]
    lines += [raw(name) + b": " + raw(value) for name, value in headers]
    lines += [b"Content-Length: %d" % len(body), b"Connection: close"]
    request = b"\r\n".join(lines) + b"\r\n\r\n" + body
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return parse_response(b"".join(chunks))


def parse_response(data: bytes) -> RawResponse:
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split(" ")[1])
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers, body)
