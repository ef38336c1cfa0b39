"""Feishu signatures: custom-bot webhook signing and event/callback request verification
(the constant-time comparison is trainsentry/credentials.py's)."""

from __future__ import annotations

import base64
import hashlib
import hmac

from trainsentry.credentials import secrets_equal, wire_bytes


def bot_sign(timestamp: int, secret: str) -> str:
    """Signature for a custom-bot webhook request.

    Feishu's scheme: the HMAC-SHA256 *key* is `timestamp + "\\n" + secret` and the message is
    empty; the digest is base64-encoded. `timestamp` is Unix seconds and must be within an
    hour of Feishu's clock.
    """
    key = f"{timestamp}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode("ascii")


def event_signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """`X-Lark-Signature` of an event or card callback request (hex SHA-256)."""
    digest = hashlib.sha256()
    digest.update(wire_bytes(timestamp + nonce + encrypt_key))
    digest.update(body)
    return digest.hexdigest()


def event_signature_ok(
    timestamp: str, nonce: str, encrypt_key: str, body: bytes, signature: str
) -> bool:
    expected = event_signature(timestamp, nonce, encrypt_key, body)
    return secrets_equal(expected, signature.strip().lower())
