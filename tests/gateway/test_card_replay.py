"""A signed Feishu card callback is acted on once, however often it is sent within its
signature window and whichever replica it reaches (issue 19 finding 13): two real gateway
processes on one database, SQLite and the real PostgreSQL; `callback.max_skew_s` is the
window."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.gateway.test_http_edge import CALLBACK_ENV, CARD_PATH, ENCRYPT_KEY, VERIFICATION
from tests.support.gateway_process import start_gateway
from tests.support.raw_http import RawResponse, raw_request
from tests.support.realservers import RunningServer
from tests.support.webhook_factory import encode, make_alert, make_body
from trainsentry.notifiers.feishu.sign import event_signature

TOKEN = "s3cret-token"
SKEW_S = 60


@pytest.fixture
def replicas(tmp_path: Path, db_url: str) -> Iterator[tuple[RunningServer, RunningServer]]:
    config = tmp_path / "config.yaml"
    callback = {"path": CARD_PATH, "encrypt_key_env": "FEISHU_ENCRYPT_KEY", "max_skew_s": SKEW_S}
    config.write_text(
        yaml.safe_dump({"channels": {"feishu_app": {"app_id": "cli_x", "callback": callback}}})
    )
    with (
        start_gateway(tmp_path / "a", db_url, token=TOKEN, config=config, env=CALLBACK_ENV) as a,
        start_gateway(tmp_path / "b", db_url, token=TOKEN, config=config, env=CALLBACK_ENV) as b,
    ):
        stored = raw_request(
            a.port,
            "POST",
            "/api/v1/alertmanager",
            [("Authorization", f"Bearer {TOKEN}")],
            encode(make_body([make_alert()])),
        )
        assert stored.status == 200
        yield a, b


def press(
    gateway: RunningServer, event_id: str, *, action: str = "silence", age_s: float = 0
) -> RawResponse:
    """The signed callback Feishu posts for a button press (schema 2.0)."""
    value = {"action": action, "alert_id": 1, "duration_s": 3600}
    body = json.dumps(
        {
            "schema": "2.0",
            "header": {
                "event_id": event_id,
                "token": VERIFICATION,
                "event_type": "card.action.trigger",
            },
            "event": {
                "operator": {"open_id": "ou_alice"},
                "action": {"value": value, "tag": "button"},
                "context": {"open_message_id": "om_1"},
            },
        }
    ).encode()
    ts = str(int(time.time() - age_s))
    headers = [
        ("X-Lark-Request-Timestamp", ts),
        ("X-Lark-Request-Nonce", "n-" + event_id),
        ("X-Lark-Signature", event_signature(ts, "n-" + event_id, ENCRYPT_KEY, body)),
    ]
    return raw_request(gateway.port, "POST", CARD_PATH, headers, body)


def toast(answer: RawResponse) -> str:
    assert answer.status == 200, answer
    return str(json.loads(answer.body)["toast"]["content"])


def acted(*gateways: RunningServer) -> int:
    return sum(g.logs().count("alert acknowledged alert_id=1 ") for g in gateways)


def test_a_replayed_callback_is_acted_on_once_across_replicas(
    replicas: tuple[RunningServer, RunningServer],
) -> None:
    a, b = replicas
    assert toast(press(a, "ev-replayed")) == "Silenced alert 1"
    for gateway in (b, a, b, a):  # the very same signed request, within the window
        assert toast(press(gateway, "ev-replayed")) == "already handled"
    assert acted(a, b) == 1
    assert toast(press(b, "ev-second-press", action="ack")) == "Acknowledged alert 1"
    assert acted(a, b) == 2


def test_the_configured_skew_is_the_window(
    replicas: tuple[RunningServer, RunningServer],
) -> None:
    a, _b = replicas
    answer = press(a, "ev-old", age_s=SKEW_S * 2)  # inside the 300 s default, outside 60 s
    assert answer.status == 401, answer
    assert b"too old" in answer.body
    assert toast(press(a, "ev-recent", age_s=SKEW_S / 2)) == "Silenced alert 1"
