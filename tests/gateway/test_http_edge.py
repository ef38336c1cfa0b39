"""The real gateway process against hostile HTTP on loopback (issue 19): header bytes no client
would send, over raw sockets. Every unauthenticated request is answered 401, never a 5xx."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway_process import start_gateway
from tests.support.raw_http import raw_request
from tests.support.realservers import RunningServer
from trainsentry.notifiers.feishu.sign import event_signature

TOKEN = "s3cret-token"
VERIFICATION = "vt-Verification"
ENCRYPT_KEY = "ek-Encrypt"
CARD_PATH = "/api/v1/feishu/card"
CALLBACK_ENV = {
    "FEISHU_APP_SECRET": "app-secret",
    "FEISHU_VERIFICATION_TOKEN": VERIFICATION,
    "FEISHU_ENCRYPT_KEY": ENCRYPT_KEY,
}
# Bytes a header value may carry on the wire: non-UTF-8, non-ASCII UTF-8, Latin-1 letters.
ODD_BYTES = [b"\xff", b"\xc3\xa9", b"\xe9", b"\xed\xa0\x80", b"tok\x80en", "令牌".encode()]


def callback_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    callback = {"path": CARD_PATH, "encrypt_key_env": "FEISHU_ENCRYPT_KEY"}
    path.write_text(
        yaml.safe_dump({"channels": {"feishu_app": {"app_id": "cli_x", "callback": callback}}})
    )
    return path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp_path = tmp_path_factory.mktemp("edge")
    with start_gateway(
        tmp_path,
        f"sqlite:///{tmp_path / 'store.db'}",
        token=TOKEN,
        config=callback_config(tmp_path),
        env=CALLBACK_ENV,
    ) as server:
        yield server
        assert "Traceback" not in server.logs(), server.logs()[-3000:]


AUTHENTICATED = [
    ("POST", "/api/v1/alertmanager"),
    ("GET", "/api/v1/alerts"),
    ("GET", "/api/v1/alerts/1"),
    ("GET", "/api/v1/notifications"),
    ("POST", "/api/v1/alerts/1/ack"),
]


@pytest.mark.parametrize("odd", ODD_BYTES)
@pytest.mark.parametrize(("method", "path"), AUTHENTICATED)
def test_odd_bytes_in_the_bearer_token_are_401(
    gateway: RunningServer, method: str, path: str, odd: bytes
) -> None:
    for value in (b"Bearer " + odd, b"Bearer " + TOKEN.encode() + odd, odd + b" " + odd):
        answer = raw_request(gateway.port, method, path, [(b"Authorization", value)], b"{}")
        assert answer.status == 401, (value, answer)
        assert answer.headers["www-authenticate"].startswith("Bearer")


def card_body(token: str, *, ascii_only: bool = False) -> bytes:
    return json.dumps(
        {
            "schema": "2.0",
            "header": {"event_id": "ev-1", "token": token},
            "event": {
                "operator": {"open_id": "ou_1"},
                "action": {"value": {"action": "ack", "alert_id": 1}},
            },
        },
        ensure_ascii=ascii_only,
    ).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("token", ["é", "令牌", VERIFICATION + "é", "\ud800", "x\udcff"])
def test_odd_callback_tokens_are_401(gateway: RunningServer, token: str) -> None:
    handshake = {"type": "url_verification", "token": token, "challenge": "c"}
    for ascii_only in (True, False):
        for body in (
            card_body(token, ascii_only=ascii_only),
            json.dumps(handshake, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"),
        ):
            answer = raw_request(gateway.port, "POST", CARD_PATH, [], body)
            # Python's JSON reader takes raw surrogate bytes too: always a token to compare
            assert answer.status == 401, (body, answer)


@pytest.mark.parametrize("odd", ODD_BYTES)
def test_odd_signature_and_nonce_bytes_are_401(gateway: RunningServer, odd: bytes) -> None:
    body = card_body(VERIFICATION)
    ts = str(int(time.time()))
    good = event_signature(ts, "n1", ENCRYPT_KEY, body)
    for headers in (
        [("X-Lark-Request-Timestamp", ts), ("X-Lark-Request-Nonce", "n1"),
         (b"X-Lark-Signature", odd)],
        [("X-Lark-Request-Timestamp", ts), ("X-Lark-Request-Nonce", "n1"),
         (b"X-Lark-Signature", good.encode() + odd)],
        [("X-Lark-Request-Timestamp", ts), (b"X-Lark-Request-Nonce", odd),
         ("X-Lark-Signature", good)],
        [(b"X-Lark-Request-Timestamp", odd), ("X-Lark-Request-Nonce", "n1"),
         ("X-Lark-Signature", good)],
    ):  # fmt: skip
        answer = raw_request(gateway.port, "POST", CARD_PATH, headers, body)
        assert answer.status == 401, (headers, answer)


# Control characters are malformed HTTP, refused by aiohttp's parser before any handler.
header_bytes = st.binary(min_size=1, max_size=40).filter(
    lambda raw: not any(byte < 0x20 or byte == 0x7F for byte in raw)
)


def test_fuzzed_auth_headers_never_get_a_5xx(gateway: RunningServer) -> None:
    """Authorization, callback token and signature headers from arbitrary bytes: 4xx only."""
    statuses: list[int] = []

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from([*AUTHENTICATED, ("POST", CARD_PATH)]),
        header_bytes,
        st.sampled_from([b"Authorization", b"X-Lark-Signature", b"X-Lark-Request-Nonce"]),
    )
    def one(route: tuple[str, str], value: bytes, name: bytes) -> None:
        headers = [(name, value), (b"X-Lark-Request-Timestamp", str(int(time.time())))]
        if name != b"X-Lark-Signature":
            headers.append((b"X-Lark-Signature", b"00" * 32))
        answer = raw_request(gateway.port, route[0], route[1], headers, card_body(VERIFICATION))
        statuses.append(answer.status)
        assert answer.status < 500, (route, name, value, answer)

    one()
    assert set(statuses) <= {400, 401, 404, 413}, sorted(set(statuses))
