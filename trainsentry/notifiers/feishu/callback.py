"""Feishu card action callbacks: authenticate, decode, and turn a button press into a typed action.

Feishu's scheme, both supported:
- card callbacks (`card.action.trigger`, schema 2.0) carry the app's *verification token*
  in `header.token`; it must match. With an *encrypt key* configured, Feishu encrypts the
  body (AES-256-CBC, key = SHA-256 of the encrypt key) and signs the request:
  `X-Lark-Signature = sha256(timestamp + nonce + encrypt_key + raw body)` (hex); then the
  signature is required and the timestamp must be fresh (replays are refused).
- legacy card callbacks (no schema) are signed with the verification token instead:
  `X-Lark-Signature = sha1(timestamp + nonce + verification_token + raw body)`.
The URL-verification handshake (`type: url_verification`) is answered with the challenge
after its token is checked. A press of a button in the card's form container also carries
what was typed into its inputs (`action.form_value`, both schemes): the ack comment.

`parse_callback` is pure; `card_action_handler` wraps it as an aiohttp handler that the
gateway mounts (path in `FeishuCallbackSettings.path`) and that calls back into the gateway
with the `CardAction` (ack the alert, create a silence, stop escalation).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from trainsentry.alerts import MAX_ALERT_ID
from trainsentry.credentials import secrets_equal, wire_bytes
from trainsentry.notifiers.feishu.card import COMMENT_FIELD, MAX_COMMENT
from trainsentry.notifiers.feishu.sign import event_signature_ok

log = logging.getLogger(__name__)

ActionName = Literal["ack", "silence", "cordon_approve", "cordon_dismiss"]
CORDON_ACTIONS = ("cordon_approve", "cordon_dismiss")  # the cordon card's buttons (node, no alert)
MAX_SILENCE_S = 7 * 24 * 3600
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain
MAX_EVENT_ID = 128  # the store keeps event ids to drop replays (store/callbacks.py)


@dataclass(frozen=True, slots=True)
class CardAction:
    """A button press on one of our cards."""

    alert_id: int
    action: ActionName
    who: str  # open_id of the person who pressed
    duration_s: int | None = None  # for "silence"
    message_id: str | None = None  # the card's message, to update it
    event_id: str | None = None  # Feishu's id, for de-duplicating redeliveries
    update_token: str | None = None  # lets the card be updated later (30 min)
    comment: str | None = None  # typed into the card's comment input (attacker-controlled)
    node: str | None = None  # for the cordon actions (alert_id is 0 then)


@dataclass(frozen=True, slots=True)
class Challenge:
    challenge: str


class CallbackRejected(Exception):
    """The request is not an authentic, well-formed card callback."""

    def __init__(self, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.status = status


def decrypt_body(encrypted: str, encrypt_key: str) -> dict[str, Any]:
    """Feishu's encrypted body: base64(iv + AES-256-CBC(PKCS#7(json))), key = sha256(key)."""
    try:
        from cryptography.hazmat.primitives import padding
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise CallbackRejected(
            "encrypted callbacks need the 'cryptography' package", status=501
        ) from exc
    try:
        raw = base64.b64decode(encrypted, validate=True)
        key = hashlib.sha256(encrypt_key.encode()).digest()
        decryptor = Cipher(algorithms.AES(key), modes.CBC(raw[:16])).decryptor()
        padded = decryptor.update(raw[16:]) + decryptor.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        plain = unpadder.update(padded) + unpadder.finalize()
        value = json.loads(plain)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CallbackRejected("cannot decrypt the callback body", status=400) from exc
    if not isinstance(value, dict):
        raise CallbackRejected("decrypted body is not an object", status=400)
    return value


def _legacy_signature_ok(headers: Mapping[str, str], body: bytes, token: str) -> bool:
    ts = headers.get("X-Lark-Request-Timestamp", "")
    nonce = headers.get("X-Lark-Request-Nonce", "")
    signature = headers.get("X-Lark-Signature", "")
    digest = hashlib.sha1(wire_bytes(ts + nonce + token) + body).hexdigest()
    return bool(signature) and secrets_equal(digest, signature.lower())


def _check_fresh(headers: Mapping[str, str], now: float, max_skew_s: float) -> None:
    ts = headers.get("X-Lark-Request-Timestamp", "")
    if not (ts.isascii() and ts.isdigit()):
        raise CallbackRejected("missing request timestamp")
    if abs(now - int(ts)) > max_skew_s:
        raise CallbackRejected("request timestamp too old or in the future (replay?)")


def parse_callback(
    headers: Mapping[str, str],
    body: bytes,
    *,
    verification_token: str,
    encrypt_key: str | None = None,
    now: float,
    max_skew_s: float = 300.0,
) -> CardAction | Challenge:
    """Authenticates a callback request and decodes it (pure; `now` is Unix seconds)."""
    try:
        outer = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: nested beyond the parser's bound
        raise CallbackRejected("body is not JSON", status=400) from None
    if not isinstance(outer, dict):
        raise CallbackRejected("body is not an object", status=400)
    signed = False
    if encrypt_key:
        sig = headers.get("X-Lark-Signature", "")
        ts = headers.get("X-Lark-Request-Timestamp", "")
        nonce = headers.get("X-Lark-Request-Nonce", "")
        # Feishu signs every request once an encrypt key is set, except the URL check.
        if sig:
            if not event_signature_ok(ts, nonce, encrypt_key, body, sig):
                raise CallbackRejected("bad X-Lark-Signature")
            _check_fresh(headers, now, max_skew_s)
            signed = True
        if "encrypt" in outer:
            outer = decrypt_body(str(outer["encrypt"]), encrypt_key)
    elif "encrypt" in outer:
        raise CallbackRejected("encrypted body but no encrypt key configured", status=400)

    if outer.get("type") == "url_verification":
        if not secrets_equal(str(outer.get("token", "")), verification_token):
            raise CallbackRejected("verification token mismatch")
        return Challenge(str(outer.get("challenge", "")))

    if outer.get("schema") == "2.0":
        header = _object(outer.get("header"))
        if not secrets_equal(str(header.get("token", "")), verification_token):
            raise CallbackRejected("verification token mismatch")
        if encrypt_key and not signed:
            raise CallbackRejected("unsigned callback although an encrypt key is configured")
        event = _object(outer.get("event"))
        operator = _object(event.get("operator"))
        context = _object(event.get("context"))
        return _action(
            button_value(_object(event.get("action"))),
            who=str(operator.get("open_id") or operator.get("user_id") or ""),
            message_id=context.get("open_message_id"),
            event_id=header.get("event_id"),
            update_token=event.get("token"),
            comment=form_comment(_object(event.get("action"))),
        )

    # Legacy card callback: signed with the verification token.
    if not _legacy_signature_ok(headers, body, verification_token):
        raise CallbackRejected("bad legacy X-Lark-Signature")
    _check_fresh(headers, now, max_skew_s)
    return _action(
        button_value(_object(outer.get("action"))),
        who=str(outer.get("open_id") or outer.get("user_id") or ""),
        message_id=outer.get("open_message_id"),
        # no event id in the legacy scheme: its signature (over timestamp, nonce and body)
        # names the request, and a replay must carry the very same one
        event_id="sig:" + headers.get("X-Lark-Signature", "").strip().lower(),
        update_token=outer.get("token"),
        comment=form_comment(_object(outer.get("action"))),
    )


def _object(value: Any) -> dict[str, Any]:
    """A part of the body that should be an object; anything else counts as absent."""
    return value if isinstance(value, dict) else {}


def button_value(action: Mapping[str, Any]) -> Any:
    """Pure: the pressed button's callback value; for a form's submit button that comes back
    without one, the value its name spells (card.py: `ack_ID`, `silence_ID_SECONDS`)."""
    value = action.get("value")
    name = action.get("name")
    if value or not isinstance(name, str) or len(name) > 64:
        return value
    parts = name.split("_")
    if parts[0] == "ack" and len(parts) == 2:
        return {"action": "ack", "alert_id": parts[1]}
    if parts[0] == "silence" and len(parts) == 3:
        return {"action": "silence", "alert_id": parts[1], "duration_s": parts[2]}
    return value


def form_comment(action: Mapping[str, Any]) -> str | None:
    """Pure: the comment typed into the card's form (`action.form_value.comment`), or None
    when there is none or it is blank. Attacker-controlled: at most MAX_COMMENT printable
    characters (newlines and tabs allowed), else the callback is refused; escaped where it
    is shown (card.py `escape_md`, the console's autoescaped templates)."""
    form = action.get("form_value")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise CallbackRejected("action.form_value is not an object", status=400)
    raw = form.get(COMMENT_FIELD)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise CallbackRejected("form_value.comment is not text", status=400)
    text = raw.strip()
    if len(text) > MAX_COMMENT:
        raise CallbackRejected(f"comment is longer than {MAX_COMMENT} characters", status=400)
    if not all(ch.isprintable() or ch in "\n\r\t" for ch in text):
        raise CallbackRejected("comment holds characters that are not printable", status=400)
    return text or None


def _action(
    value: Any,
    *,
    who: str,
    message_id: Any,
    event_id: Any,
    update_token: Any,
    comment: str | None = None,
) -> CardAction:
    if not isinstance(value, dict):
        raise CallbackRejected("action.value missing", status=400)
    name = value.get("action")
    if name not in ("ack", "silence", *CORDON_ACTIONS):
        raise CallbackRejected(f"unknown action {name!r}", status=400)
    node: str | None = None
    if name in CORDON_ACTIONS:
        node = value.get("node")
        if not (isinstance(node, str) and _NODE_NAME.fullmatch(node)):
            raise CallbackRejected("action.value.node is not a node name", status=400)
        value = {**value, "alert_id": MAX_ALERT_ID}  # checked below, then set to 0
    try:
        alert_id = int(value["alert_id"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise CallbackRejected("action.value.alert_id missing", status=400) from exc
    if not 0 < alert_id <= MAX_ALERT_ID:
        raise CallbackRejected("action.value.alert_id out of range", status=400)
    duration: int | None = None
    if name == "silence":
        try:
            duration = int(value["duration_s"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise CallbackRejected("silence without duration_s", status=400) from exc
        if not 0 < duration <= MAX_SILENCE_S:
            raise CallbackRejected("silence duration out of range", status=400)
    if not who:
        raise CallbackRejected("callback names no operator", status=400)
    if event_id is not None and not (
        isinstance(event_id, str) and event_id.isascii() and event_id.isprintable()
        and len(event_id) <= MAX_EVENT_ID
    ):  # fmt: skip
        raise CallbackRejected("header.event_id is not a short printable id", status=400)
    if "\x00" in who or not who.isprintable() or len(who) > 200:
        # an open_id is short printable ASCII; this one could never be stored as `acked_by`
        raise CallbackRejected("operator id is not printable text", status=400)
    return CardAction(
        alert_id=0 if node is not None else alert_id,
        action=name,
        node=node,
        who=who,
        duration_s=duration,
        message_id=str(message_id) if message_id else None,
        event_id=str(event_id) if event_id else None,
        update_token=str(update_token) if update_token else None,
        comment=comment,
    )


def action_response(
    action: CardAction, card: Mapping[str, Any] | None = None, *, ok: bool = True
) -> dict[str, Any]:
    """What `on_action` can return: a toast and, optionally, the card redrawn in place
    (e.g. `alert_card(payload with acked_by / silenced_until)`) so everyone sees who acted."""
    if ok:
        words = "Acknowledged" if action.action == "ack" else "Silenced"
        toast = {"type": "success", "content": f"{words} alert {action.alert_id}"}
    else:
        toast = {"type": "error", "content": f"Could not update alert {action.alert_id}"}
    answer: dict[str, Any] = {"toast": toast}
    if card is not None:
        answer["card"] = {"type": "raw", "data": dict(card)}
    return answer


ActionHandler = Callable[[CardAction], Awaitable[Mapping[str, Any] | None]]


def card_action_handler(
    on_action: ActionHandler,
    *,
    verification_token: str,
    encrypt_key: str | None = None,
    max_skew_s: float = 300.0,
    clock: Callable[[], float] = time.time,
    max_body_bytes: int = 64 * 1024,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler for Feishu card callbacks.

    `on_action` does the work (ack / silence / stop escalation) and may return a response
    body for Feishu (e.g. `{"toast": ..., "card": ...}`); by default a success toast.
    Unauthentic requests get 401 and are logged without their body.
    """

    async def handle(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > max_body_bytes:
            return web.json_response({"error": "body too large"}, status=413)
        body = await request.read()
        if len(body) > max_body_bytes:
            return web.json_response({"error": "body too large"}, status=413)
        try:
            parsed = parse_callback(
                request.headers,
                body,
                verification_token=verification_token,
                encrypt_key=encrypt_key,
                now=clock(),
                max_skew_s=max_skew_s,
            )
        except CallbackRejected as exc:
            log.warning(
                "event=feishu_callback_rejected status=%s reason=%r remote=%s",
                exc.status, str(exc), request.remote,
            )  # fmt: skip
            return web.json_response({"error": str(exc)}, status=exc.status)
        if isinstance(parsed, Challenge):
            return web.json_response({"challenge": parsed.challenge})
        log.info(
            "event=feishu_card_action action=%s alert_id=%s who=%s duration_s=%s",
            parsed.action, parsed.alert_id, parsed.who, parsed.duration_s,
        )  # fmt: skip
        answer = await on_action(parsed)
        return web.json_response(dict(answer) if answer is not None else action_response(parsed))

    return handle
