"""Every JSON endpoint of the real gateway process against hostile bodies (issue 32 finding 7):
10,000 levels of nesting, JSON over the depth bound, not UTF-8, not JSON, not an object, too
large. Each is a 4xx whose reason says what is wrong, never a 5xx, and the gateway logs no
ERROR and no traceback (its log is read after the requests)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from tests.support.gateway_process import start_gateway
from tests.support.raw_http import RawResponse, parse_response, raw_request
from tests.support.realservers import RunningServer
from trainsentry.gateway.api.request_body import MAX_DEPTH, MAX_JSON_BYTES, parse_json

TOKEN = "s3cret-token"
CARD_PATH = "/api/v1/feishu/card"
AUTH = [("Authorization", f"Bearer {TOKEN}"), ("Content-Type", "application/json")]
ONCALL = {
    "people": {"alice": {"phone": "+4915100000001"}},
    "schedules": {
        "gpu-infra": {
            "timezone": "UTC",
            "layers": [
                {
                    "name": "primary",
                    "start": "2026-11-16T09:00",
                    "shift": "1w",
                    "members": ["alice"],
                }
            ],
        }
    },
}
# (method, path) of every endpoint that reads a JSON body, with the refusal it gives before
# reading one where that comes first (uncordon: the gateway has no cluster to cordon through)
ENDPOINTS = [
    ("POST", "/api/v1/alerts/1/ack"),
    ("POST", "/api/v1/alerts/1/escalate"),
    ("POST", "/api/v1/oncall/overrides"),
    ("DELETE", "/api/v1/oncall/overrides/1"),
    ("POST", "/api/v1/notifications/retry"),
    ("POST", "/api/v1/maintenance"),
    ("DELETE", "/api/v1/maintenance/mw-12ab"),
]


def nested(levels: int) -> bytes:
    return b'{"by": "x", "a": ' + b"[" * levels + b"]" * levels + b"}"


HOSTILE = {
    "nested 10,000 levels": (nested(10_000), 400, "JSON"),
    "nested past the bound": (nested(MAX_DEPTH + 1), 400, f"{MAX_DEPTH} levels"),
    "not UTF-8": (b'{"by": "\xff\xfe"}', 400, "UTF-8"),
    "not JSON": (b'{"by": ', 400, "JSON"),
    "NaN": (b'{"by": NaN}', 400, "JSON"),
    "not an object": (b"[1, 2]", 400, "object"),
    "too large": (b'{"by": "' + b"x" * MAX_JSON_BYTES + b'"}', 413, "larger than"),
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp_path = tmp_path_factory.mktemp("json-bodies")
    config = tmp_path / "config.yaml"
    callback = {"path": CARD_PATH, "encrypt_key_env": "FEISHU_ENCRYPT_KEY"}
    feishu_app = {"app_id": "cli_x", "callback": callback}
    config.write_text(yaml.safe_dump({"oncall": ONCALL, "channels": {"feishu_app": feishu_app}}))
    db = f"sqlite:///{tmp_path / 'store.db'}"
    env = {
        "FEISHU_APP_SECRET": "app-secret",
        "FEISHU_VERIFICATION_TOKEN": "vt-Verification",
        "FEISHU_ENCRYPT_KEY": "ek-Encrypt",
    }
    with start_gateway(tmp_path, db, token=TOKEN, config=config, env=env) as server:
        yield server


@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_hostile_json_bodies_are_4xx_with_a_reason(
    gateway: RunningServer, method: str, path: str, case: str
) -> None:
    body, status, says = HOSTILE[case]
    logged = len(gateway.logs())
    answer = raw_request(gateway.port, method, path, AUTH, body)
    assert answer.status == status, (case, answer)
    reason = json.loads(answer.body)["error"]
    # a DELETE takes `by` from the query too: for it a list is a body without `by`
    assert says in reason or (case == "not an object" and "'by'" in reason), (case, reason)
    logs = gateway.logs()[logged:]  # what this request logged
    assert "Traceback" not in logs and "level=error" not in logs, logs[-3000:]


def test_the_webhook_refuses_deep_nesting_too(gateway: RunningServer) -> None:
    logged = len(gateway.logs())
    answer = raw_request(gateway.port, "POST", "/api/v1/alertmanager", AUTH, nested(10_000))
    assert answer.status == 400 and "nested" in json.loads(answer.body)["error"]
    assert "Traceback" not in gateway.logs()[logged:]


def test_the_card_callback_refuses_deep_nesting_before_authenticating(
    gateway: RunningServer,
) -> None:
    """Anyone can post to the card callback: the body is parsed before its signature is
    checked (Feishu signs the decrypted event), so 10,000 levels reached json.loads."""
    logged = len(gateway.logs())
    answer = raw_request(gateway.port, "POST", CARD_PATH, [], nested(10_000))
    assert answer.status == 400, answer
    logs = gateway.logs()[logged:]
    assert "Traceback" not in logs and "level=error" not in logs, logs[-3000:]


def send_in_two_pieces(port: int, method: str, path: str, body: bytes) -> RawResponse:
    """The head and the first half of the body, then the rest 0.3 s later."""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in AUTH) + "Connection: close\r\n\r\n"
    half = len(body) // 2
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + body[:half])
        time.sleep(0.3)
        sock.sendall(body[half:])
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return parse_response(b"".join(chunks))


def test_a_body_sent_in_pieces_is_read_whole(gateway: RunningServer) -> None:
    """The maintenance endpoint read only what the first read returned: a window sent in two
    TCP segments was refused as "body must be JSON"."""
    now = datetime.now(UTC)
    window = {
        "matchers": {"node": "gpu-node-17"},
        "starts_at": now.isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat(),
        "reason": "NVLink replacement",
        "created_by": "alice",
    }
    body = json.dumps(window).encode()
    answer = send_in_two_pieces(gateway.port, "POST", "/api/v1/maintenance", body)
    assert answer.status == 201, answer
    ended = send_in_two_pieces(
        gateway.port, "DELETE", f"/api/v1/maintenance/{json.loads(answer.body)['id']}",
        json.dumps({"by": "alice"}).encode(),
    )  # fmt: skip
    assert ended.status == 200, ended


def test_an_empty_body_reads_as_an_empty_object() -> None:
    assert parse_json(b"") == {} and parse_json(b" \n") == {}
    assert parse_json(b'{"a": [[1]]}') == {"a": [[1]]}
