"""Card action callbacks: Feishu's authentication schemes, decoding, and the aiohttp handler."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from tests.notifiers.helpers import alert_payload
from trainsentry.notifiers.feishu.callback import (
    CallbackRejected,
    CardAction,
    Challenge,
    action_response,
    card_action_handler,
    parse_callback,
)
from trainsentry.notifiers.feishu.card import alert_card
from trainsentry.notifiers.payload_contract import parse_payload

TOKEN = "v-token-123"
ENCRYPT_KEY = "enc-key-456"
NOW = 1_790_000_000


def v2_body(value: dict[str, Any], token: str = TOKEN) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "header": {
            "event_id": "ev-1",
            "token": token,
            "create_time": str(NOW * 1000),
            "event_type": "card.action.trigger",
            "tenant_key": "tk",
            "app_id": "cli_test",
        },
        "event": {
            "operator": {"tenant_key": "tk", "open_id": "ou_alice", "user_id": "u1"},
            "token": "c-update-token",
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": "om_1", "open_chat_id": "oc_1"},
        },
    }


def encrypt(plain: dict[str, Any], key: str) -> dict[str, str]:
    """Feishu's encryption, written from its description (independent of the code)."""
    pytest.importorskip("cryptography")  # an optional dependency of encrypted callbacks
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    aes_key = hashlib.sha256(key.encode()).digest()
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(json.dumps(plain).encode()) + padder.finalize()
    encryptor = Cipher(algorithms.AES(aes_key), modes.CBC(iv)).encryptor()
    return {
        "encrypt": base64.b64encode(iv + encryptor.update(data) + encryptor.finalize()).decode()
    }


def signed_headers(body: bytes, key: str, ts: int = NOW, algo: str = "sha256") -> dict[str, str]:
    nonce = "n0nce"
    digest = hashlib.new(algo, f"{ts}{nonce}{key}".encode() + body).hexdigest()
    return {
        "X-Lark-Request-Timestamp": str(ts),
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": digest,
    }


def test_plain_v2_callback_with_token() -> None:
    body = json.dumps(v2_body({"action": "ack", "alert_id": 42})).encode()
    action = parse_callback({}, body, verification_token=TOKEN, now=NOW)
    assert action == CardAction(
        alert_id=42, action="ack", who="ou_alice", duration_s=None, message_id="om_1",
        event_id="ev-1", update_token="c-update-token",
    )  # fmt: skip


def test_wrong_verification_token_is_rejected() -> None:
    body = json.dumps(v2_body({"action": "ack", "alert_id": 42}, token="forged")).encode()
    with pytest.raises(CallbackRejected) as err:
        parse_callback({}, body, verification_token=TOKEN, now=NOW)
    assert err.value.status == 401


def test_encrypted_and_signed_callback() -> None:
    plain = v2_body({"action": "silence", "alert_id": 7, "duration_s": 3600})
    body = json.dumps(encrypt(plain, ENCRYPT_KEY)).encode()
    headers = signed_headers(body, ENCRYPT_KEY)
    action = parse_callback(
        headers, body, verification_token=TOKEN, encrypt_key=ENCRYPT_KEY, now=NOW + 10
    )
    assert isinstance(action, CardAction)
    assert (action.action, action.alert_id, action.duration_s) == ("silence", 7, 3600)


@pytest.mark.parametrize("problem", ["bad_signature", "stale", "unsigned", "wrong_key"])
def test_encrypted_callback_rejections(problem: str) -> None:
    plain = v2_body({"action": "ack", "alert_id": 7})
    key = "other-key" if problem == "wrong_key" else ENCRYPT_KEY
    body = json.dumps(encrypt(plain, key)).encode()
    headers = signed_headers(body, key, ts=NOW - 3600 if problem == "stale" else NOW)
    if problem == "bad_signature":
        headers["X-Lark-Signature"] = "0" * 64
    if problem == "unsigned":
        headers = {}
    with pytest.raises(CallbackRejected):
        parse_callback(headers, body, verification_token=TOKEN, encrypt_key=ENCRYPT_KEY, now=NOW)


def test_legacy_callback_signed_with_verification_token() -> None:
    legacy = {
        "open_id": "ou_bob",
        "open_message_id": "om_9",
        "token": "c-x",
        "action": {"value": {"action": "ack", "alert_id": "9"}, "tag": "button"},
    }
    body = json.dumps(legacy).encode()
    ok = parse_callback(
        signed_headers(body, TOKEN, algo="sha1"), body, verification_token=TOKEN, now=NOW
    )
    assert isinstance(ok, CardAction) and ok.who == "ou_bob" and ok.alert_id == 9
    # no event id in the legacy scheme: the signature names the request, so a replay of the
    # same signed request has the same id (the gateway drops it) and another request does not
    headers = signed_headers(body, TOKEN, algo="sha1")
    again = parse_callback(headers, body, verification_token=TOKEN, now=NOW)
    assert isinstance(again, CardAction) and again.event_id == "sig:" + headers["X-Lark-Signature"]
    later = signed_headers(body, TOKEN, ts=NOW + 1, algo="sha1")
    other = parse_callback(later, body, verification_token=TOKEN, now=NOW)
    assert isinstance(other, CardAction) and other.event_id != again.event_id
    with pytest.raises(CallbackRejected):
        parse_callback(
            signed_headers(body, "forged", algo="sha1"), body, verification_token=TOKEN, now=NOW
        )
    with pytest.raises(CallbackRejected):
        parse_callback({}, body, verification_token=TOKEN, now=NOW)


def test_url_verification_challenge() -> None:
    body = json.dumps({"type": "url_verification", "challenge": "abc", "token": TOKEN}).encode()
    assert parse_callback({}, body, verification_token=TOKEN, now=NOW) == Challenge("abc")
    bad = json.dumps({"type": "url_verification", "challenge": "abc", "token": "x"}).encode()
    with pytest.raises(CallbackRejected):
        parse_callback({}, bad, verification_token=TOKEN, now=NOW)


@pytest.mark.parametrize(
    "value",
    [
        {"action": "delete", "alert_id": 1},
        {"action": "ack"},
        {"action": "silence", "alert_id": 1},
        {"action": "silence", "alert_id": 1, "duration_s": 10**9},
    ],
)
def test_malformed_values_are_rejected(value: dict[str, Any]) -> None:
    body = json.dumps(v2_body(value)).encode()
    with pytest.raises(CallbackRejected) as err:
        parse_callback({}, body, verification_token=TOKEN, now=NOW)
    assert err.value.status == 400


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
PARTS = st.sampled_from(["header", "event", "action", "value", "operator", "context"])


@given(part=PARTS, replacement=JSON)
def test_any_shape_of_a_v2_callback_is_accepted_or_rejected_never_an_error(
    part: str, replacement: Any
) -> None:
    """Whoever can reach the callback URL chooses the body: a part of another type than
    Feishu sends is a 4xx (CallbackRejected), not an exception (a 500) before authentication."""
    body = v2_body({"action": "ack", "alert_id": 42})
    event = body["event"]
    holders = {"header": body, "event": body, "action": event, "operator": event,
               "context": event, "value": event["action"]}  # fmt: skip
    holders[part][part] = replacement
    try:
        parse_callback({}, json.dumps(body).encode(), verification_token=TOKEN, now=NOW)
    except CallbackRejected as exc:
        assert 400 <= exc.status < 500


@pytest.mark.parametrize("alert_id", [0, -1, 2**63, 10**30, 1e308])
def test_alert_ids_outside_the_stores_range_are_rejected(alert_id: float) -> None:
    body = json.dumps(v2_body({"action": "ack", "alert_id": alert_id})).encode()
    with pytest.raises(CallbackRejected) as err:
        parse_callback({}, body, verification_token=TOKEN, now=NOW)
    assert err.value.status == 400


async def test_aiohttp_handler_over_http() -> None:
    received: list[CardAction] = []

    async def on_action(action: CardAction) -> None:
        received.append(action)

    app = web.Application()
    app.router.add_post(
        "/api/v1/feishu/card",
        card_action_handler(on_action, verification_token=TOKEN, encrypt_key=ENCRYPT_KEY),
    )
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}/api/v1/feishu/card"
    try:
        async with httpx.AsyncClient() as client:
            plain = v2_body({"action": "silence", "alert_id": 5, "duration_s": 14400})
            body = json.dumps(encrypt(plain, ENCRYPT_KEY)).encode()
            ok = await client.post(
                url, content=body, headers=signed_headers(body, ENCRYPT_KEY, int(time.time()))
            )
            forged = await client.post(
                url, content=json.dumps(v2_body({"action": "ack", "alert_id": 5})).encode()
            )
            challenge = json.dumps(
                encrypt(
                    {"type": "url_verification", "challenge": "c1", "token": TOKEN}, ENCRYPT_KEY
                )
            ).encode()
            handshake = await client.post(url, content=challenge)
    finally:
        await runner.cleanup()
    assert ok.status_code == 200 and ok.json()["toast"]["type"] == "success"
    assert forged.status_code == 401
    assert handshake.json() == {"challenge": "c1"}
    assert [(a.action, a.alert_id, a.duration_s, a.who) for a in received] == [
        ("silence", 5, 14400, "ou_alice")
    ]


def test_action_response_redraws_the_card_with_who_acted() -> None:
    action = CardAction(alert_id=42, action="ack", who="ou_alice")
    card = alert_card(parse_payload(alert_payload(acked_by=action.who)))
    answer = action_response(action, card)
    assert answer["toast"] == {"type": "success", "content": "Acknowledged alert 42"}
    assert answer["card"]["type"] == "raw"
    assert "Acknowledged by ou_alice" in json.dumps(answer["card"]["data"])
    assert action_response(action, ok=False)["toast"]["type"] == "error"
