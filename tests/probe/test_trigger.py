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
    """Records (path, authorization, body) of every POST; answers `answers` in turn, then 202,
    with the bodies of `said` in turn, then `{}`."""

    def __init__(self, answers: list[int] | None = None) -> None:
        self.answers = list(answers or [])
        self.said: list[bytes] = []
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
                said = gateway.said.pop(0) if gateway.said else b"{}"
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(said)))
                self.end_headers()
                self.wfile.write(said)

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


def test_a_probe_told_its_jobs_hang_is_known_stops_posting_stalls(gateway: Gateway) -> None:
    """The gateway answers a trigger of a known hang with its pre-encoded `KNOWN_BODY`:
    the probe sends none of its later stall triggers (until one of its stalls ends); told
    "pending" (the hang is being stored), it keeps posting."""
    from trainsentry.gateway.stages.hang.trigger import KNOWN_BODY, PENDING

    gateway.answers = [200, 200]
    gateway.said = [json.dumps(PENDING).encode(), KNOWN_BODY]
    trigger = client(gateway.url)
    assert trigger.send(BODY) and not trigger.known
    assert trigger.send({**BODY, "seq": 21}) and trigger.known
    for seq in (22, 23, 24):
        trigger.submit({**BODY, "seq": seq})
    trigger.submit({**BODY, "seq": 21, "resolved": True})  # a stall ended: sent, re-armed
    deadline = time.monotonic() + 5
    while len(gateway.seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    trigger.stop()
    assert [(body["seq"], body.get("resolved")) for _, _, body in gateway.seen] == [
        (20, None),
        (21, None),
        (21, True),
    ]
    assert trigger.stats.suppressed == 3 and not trigger.known


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


def test_a_large_jobs_ranks_spread_their_first_posts(gateway: Gateway) -> None:
    """A 16,384-rank job's ranks all stall within one poll; each probe waits a random delay
    of up to 1 s per 1,000 ranks before its first try (`spread_s`), so the job posts about
    1,000 triggers a second, not 16,384 in one (a gateway's loop takes ~3,000 connections a
    second: bench_hang_scale.py); a small job keeps its 1 s."""
    from trainsentry.probe.identity import ProbeConfig
    from trainsentry.probe.recorders import Recorders
    from trainsentry.probe.runtime import Probe
    from trainsentry.probe.trigger import spread_s

    def probe(world: int) -> Probe:
        config = ProbeConfig(
            world_size=world, gateway_url=gateway.url, token=TOKEN, bind="127.0.0.1", port=0
        )
        made = Probe(config, Recorders([]))
        made.server.stop()  # only its trigger client is looked at
        return made

    for world, longest in ((8, 1.0), (1024, 1.024), (16384, 16.384)):
        trigger = probe(world).trigger
        assert trigger is not None and trigger.jitter_s == pytest.approx(longest)

    waited: list[float] = []
    trigger = probe(16384).trigger
    assert trigger is not None
    trigger.sleep = lambda seconds: waited.append(seconds) or True  # then stops
    trigger.submit(BODY)
    deadline = time.monotonic() + 5
    while not waited and time.monotonic() < deadline:
        time.sleep(0.01)
    trigger.stop()
    assert len(waited) == 1 and 0 <= waited[0] <= 16.384 and not gateway.seen

    # the job's ranks together: at most about 1,000 first tries in any second
    import random

    rng = random.Random(3)
    starts = sorted(rng.uniform(0, 2) + rng.uniform(0, spread_s(16384)) for _ in range(16384))
    busiest = max(sum(1 for t in starts[i : i + 2000] if t < s + 1) for i, s in enumerate(starts))
    assert busiest < 1200
