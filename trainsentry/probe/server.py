"""The probe's HTTP endpoint inside a training process.

A stdlib `ThreadingHTTPServer` on a daemon thread: the training process has no event loop
of ours, and a thread cannot stall the training loop. Endpoints:

    GET /metrics   Prometheus text from the probe's private registry
    GET /healthz   "ok"
    GET /status    identity and progress summary as JSON (no secrets)
    GET /dump      the current Flight Recorder dump (JSON); needs `Authorization: Bearer <token>`
    GET /dumps     the watchdog's dump files in this pod (name, bytes, mtime); bearer token
    GET /dumps/N   one of them, as torch wrote it (pickle); bearer token
    GET /ras       the last NCCL RAS snapshot (JSON, rank 0); needs the bearer token
    GET /stack     every Python thread's stack, main thread first (`stacks.py`); bearer token

Without a configured token /dump, /dumps, /ras and /stack answer 403: a dump shows tensor shapes and
call sites, so it is never served unauthenticated. `/dumps/N` serves only a name the listing
holds (no path is ever built from the request).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import shutil
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("trainsentry.probe")


@dataclass
class Endpoints:
    """What the server serves; callables so the server holds no probe state."""

    registry: CollectorRegistry
    status: Callable[[], dict[str, Any]]
    #: The dump and extra headers (which recorders, when it was taken).
    dump: Callable[[], tuple[bytes, dict[str, str]]]
    ras: Callable[[], dict[str, Any] | None]
    #: `/stack`: this rank's thread stacks and marked phase, taken when asked.
    stack: Callable[[], dict[str, Any]]
    #: The bearer tokens accepted (`token.accepted_tokens`: the configured one and the one
    #: derived from it for this job); empty: the protected endpoints answer 403.
    tokens: tuple[str, ...]
    identity_headers: dict[str, str]
    #: torch's watchdog writes `<prefix><rank>` files (TORCH_FR_DUMP_TEMP_FILE); "" = none.
    watchdog_prefix: str = ""


MAX_WATCHDOG_FILES = 1024


def watchdog_dumps(prefix: str) -> list[dict[str, Any]]:
    """The watchdog's dump files (`<prefix><rank>`), oldest first: name, bytes, mtime."""
    folder, start = os.path.split(prefix)
    if not prefix or not start:
        return []
    found = []
    try:
        with os.scandir(folder or ".") as names:
            for item in names:
                if item.name.startswith(start) and item.is_file(follow_symlinks=False):
                    info = item.stat(follow_symlinks=False)
                    found.append({"name": item.name, "bytes": info.st_size, "mtime": info.st_mtime})
                    if len(found) >= MAX_WATCHDOG_FILES:
                        break
    except OSError:
        return []
    return sorted(found, key=lambda f: (f["mtime"], f["name"]))


def bearer_ok(header: str | None, token: str | Sequence[str] | None) -> bool:
    """True when `header` is `Bearer <t>` for the configured token, or one of the configured
    tokens (each compared in constant time, all of them every time)."""
    tokens = (token,) if isinstance(token, str) else tuple(token or ())
    if not any(tokens) or not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = value.strip().encode()
    matches = [hmac.compare_digest(given, t.encode()) for t in tokens if t]
    return any(matches)


class _ProbeHandler(BaseHTTPRequestHandler):
    """The probe's HTTP endpoints over `endpoints`, which `_handler` binds per server."""

    endpoints: Endpoints
    server_version = "trainsentry-probe"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("event=http_request %s", format % args)

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str,
        extra: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if extra:
            for key, value in {**self.endpoints.identity_headers, **(headers or {})}.items():
                self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_file(self, name: str) -> None:
        listed = {f["name"]: f for f in watchdog_dumps(self.endpoints.watchdog_prefix)}
        if name not in listed:
            self._json(404, {"error": "no such watchdog dump"}, True)
            return
        folder = os.path.dirname(self.endpoints.watchdog_prefix)
        with open(os.path.join(folder, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "no-store")
            for key, value in self.endpoints.identity_headers.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def _json(self, code: int, payload: Any, extra: bool = False) -> None:
        self._send(code, json.dumps(payload).encode(), "application/json", extra)

    def _authorized(self) -> bool:
        if not self.endpoints.tokens:
            self._json(403, {"error": "disabled: no probe token configured"})
            return False
        if not bearer_ok(self.headers.get("Authorization"), self.endpoints.tokens):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Bearer realm="trainsentry-probe"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        return True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(200, generate_latest(self.endpoints.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/status":
                self._json(200, self.endpoints.status(), extra=True)
            elif path == "/dump":
                if self._authorized():
                    body, headers = self.endpoints.dump()
                    self._send(200, body, "application/json", True, headers)
            elif path == "/dumps":
                if self._authorized():
                    listing = watchdog_dumps(self.endpoints.watchdog_prefix)
                    self._json(200, {"dumps": listing}, extra=True)
            elif path.startswith("/dumps/"):
                if self._authorized():
                    self._send_file(path.removeprefix("/dumps/"))
            elif path == "/stack":
                if self._authorized():
                    self._json(200, self.endpoints.stack(), extra=True)
            elif path == "/ras":
                if self._authorized():
                    snapshot = self.endpoints.ras()
                    if snapshot is None:
                        self._json(404, {"error": "no RAS snapshot on this rank"}, True)
                    else:
                        self._json(200, snapshot, extra=True)
            else:
                self._json(404, {"error": "not found"})
        except Exception as exc:  # the probe must never take the process down
            log.warning("event=probe_http_error path=%s error=%r", path, exc)
            with contextlib.suppress(OSError):
                self._json(500, {"error": type(exc).__name__})

    do_HEAD = do_GET


def _handler(endpoints: Endpoints) -> type[BaseHTTPRequestHandler]:
    """A request handler class serving `endpoints` (http.server makes one instance per
    request)."""
    return type("Handler", (_ProbeHandler,), {"endpoints": endpoints})


class _ThreadingHTTPServerV6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class ProbeServer:
    """Owns the listening socket and its thread."""

    def __init__(self, endpoints: Endpoints, bind: str, port: int) -> None:
        server_class = _ThreadingHTTPServerV6 if ":" in bind else ThreadingHTTPServer
        self._httpd = server_class((bind.strip("[]"), port), _handler(endpoints))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="trainsentry-probe-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever for a loop never started
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()
