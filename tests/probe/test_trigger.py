"""The probe's hang trigger client against a real loopback HTTP server."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trainsentry.probe.trigger import TRIGGER_PATH, TriggerClient

TOKEN = "probe-secret-token-9f3"


class Gateway:
    """Records (path, authorization, body) of every POST; answers `answers` in turn, then 202."""

    def __init__(self, answers: list[int] | None = None) -> None:
        self.answers = list(answers or [])
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self.senders: list[str] = []
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                gateway.seen.append((self.path, self.headers.get("Authorization", ""), body))
                gateway.senders.append(self.client_address[0])
                code = gateway.answers.pop(0) if gateway.answers else 202
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server = Gateway()
    yield server
    server.close()


BODY = {"namespace": "ml", "trainingjob": "llama", "pg": "0", "seq": 20, "rank": 1}


def client(url: str, **kwargs: Any) -> TriggerClient:
    return TriggerClient(url, TOKEN, timeout_s=2, jitter_s=0, backoff_s=0.01, **kwargs)


def test_a_trigger_is_posted_with_the_bearer_token(gateway: Gateway) -> None:
    assert client(gateway.url).send(BODY) is True
    assert gateway.seen == [(TRIGGER_PATH, f"Bearer {TOKEN}", BODY)]


def test_a_probe_bound_to_one_address_sends_from_it(gateway: Gateway) -> None:
    """The gateway takes a trigger only from an address of the job's ranks (the pods' IPs):
    a probe bound to its pod's address (TRAINSENTRY_PROBE_BIND) sends from that address,
    not from whatever address the system picks (127.0.0.1 here)."""
    from trainsentry.probe.trigger import source_address

    assert source_address("0.0.0.0") is None and source_address("::") is None
    assert source_address("[::]") is None and source_address("localhost") is None
    assert source_address("10.1.2.3") == "10.1.2.3" and source_address("[::1]") == "::1"
    assert client(gateway.url).send(BODY) is True
    assert client(gateway.url, source="127.0.0.23").send(BODY) is True
    assert gateway.senders == ["127.0.0.1", "127.0.0.23"]


def test_server_errors_are_retried_with_the_same_body(gateway: Gateway) -> None:
    gateway.answers = [503, 500]
    trigger = client(gateway.url)
    assert trigger.send(BODY) is True
    assert [body for _, _, body in gateway.seen] == [BODY, BODY, BODY]
    assert (trigger.stats.sent, trigger.stats.failed) == (1, 0)


def test_a_refusal_is_not_retried(gateway: Gateway) -> None:
    gateway.answers = [401]
    trigger = client(gateway.url)
    assert trigger.send(BODY) is False
    assert len(gateway.seen) == 1 and trigger.stats.failed == 1


def test_rate_limited_answers_are_retried(gateway: Gateway) -> None:
    gateway.answers = [429]
    assert client(gateway.url).send(BODY) is True
    assert len(gateway.seen) == 2


def test_an_unreachable_gateway_never_raises_nor_logs_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    trigger = client("http://127.0.0.1:9", max_attempts=2)
    assert trigger.send(BODY) is False
    assert trigger.stats.failed == 1
    assert TOKEN not in caplog.text and "hang_trigger_failed" in caplog.text


def test_submit_returns_at_once_and_sends_from_its_own_thread(gateway: Gateway) -> None:
    gateway.answers = [503]
    trigger = TriggerClient(gateway.url, TOKEN, jitter_s=0.2, backoff_s=0.3)
    began = time.monotonic()
    trigger.submit(BODY)
    assert time.monotonic() - began < 0.05
    deadline = time.monotonic() + 5
    while trigger.stats.sent == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    trigger.stop()
    assert trigger.stats.sent == 1 and len(gateway.seen) == 2
