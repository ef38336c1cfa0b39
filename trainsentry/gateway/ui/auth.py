"""Who is looking at the console, and whether a form was posted by the console itself.

- No token configured on the gateway (`read_token`: the API token, else the webhook token):
  the console is read only and open, like the read API; every action is refused (403), like
  `POST /api/v1/alerts/{id}/ack` without a token.
- A token configured: the login page takes the token and a name; the answer is a session
  cookie `ts_session` (signed with HMAC-SHA256 under a key derived from the token, HttpOnly,
  SameSite=Lax, Path=/ui/, Secure on HTTPS) that carries the name and its expiry. Changing
  the token ends every session. A request from a trusted proxy address (`console.
  trusted_proxies`) carrying the user header is signed in as that user, without the token.
- Every action needs the CSRF token: a random nonce in the `ts_csrf` cookie (SameSite=Strict,
  HttpOnly) and, in the form or the `X-CSRF-Token` header, HMAC(key, nonce): a page of
  another site can neither read the cookie nor compute the token. A POST whose Origin is
  another site is refused too.

Pure functions (signing, checking) take the key and the time; `viewer` reads the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import SecretStr

from trainsentry.config import ConsoleSettings
from trainsentry.notifiers.feishu.sign import secrets_equal

SESSION_COOKIE = "ts_session"
CSRF_COOKIE = "ts_csrf"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
COOKIE_PATH = "/ui/"
MAX_NAME = 100


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who the request is from. `name` is None for an anonymous reader."""

    name: str | None
    can_act: bool  # a token is configured and the viewer is signed in
    via: str  # "open" (no token), "session", "proxy", "none" (must sign in)


def signing_key(token: SecretStr) -> bytes:
    """Pure: the key that signs sessions and CSRF tokens, derived from the gateway's token
    (never the token itself, so a leaked cookie says nothing about the token)."""
    return hmac.new(
        token.get_secret_value().encode(), b"trainsentry-console-v1", hashlib.sha256
    ).digest()


def _mac(key: bytes, text: str) -> str:
    digest = hmac.new(key, text.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def sign_session(key: bytes, name: str, expires: datetime) -> str:
    """Pure: the session cookie's value for `name` until `expires`."""
    body = json.dumps({"u": name, "exp": int(expires.timestamp())}, separators=(",", ":"))
    payload = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
    return f"{payload}.{_mac(key, payload)}"


def read_session(key: bytes, value: str, now: datetime) -> str | None:
    """Pure: the signed-in name, or None when the cookie is forged, damaged or expired."""
    if len(value) > 2048:
        return None
    payload, _, mac = value.partition(".")
    if not payload or not secrets_equal(mac, _mac(key, payload)):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        name, expires = data["u"], data["exp"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str) or not isinstance(expires, int) or expires <= now.timestamp():
        return None
    return name


def csrf_token(key: bytes, nonce: str) -> str:
    """Pure: the token a form must carry for the `ts_csrf` cookie holding `nonce`."""
    return _mac(key, "csrf|" + nonce)


def csrf_ok(key: bytes, nonce: str | None, given: str | None) -> bool:
    """Pure: the posted token matches the cookie's nonce (both present, compared in
    constant time)."""
    if not nonce or not given or len(given) > 200 or len(nonce) > 200:
        return False
    return secrets_equal(given, csrf_token(key, nonce))


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def proxy_trusted(settings: ConsoleSettings, remote: str | None) -> bool:
    """Pure: `remote` is one of the configured proxy addresses."""
    if not remote or not settings.trusted_proxies:
        return False
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    return any(
        address in ipaddress.ip_network(entry, strict=False) for entry in settings.trusted_proxies
    )


def clean_name(raw: str | None) -> str | None:
    """Pure: a display name (printable, at most MAX_NAME characters), or None."""
    if raw is None:
        return None
    name = raw.strip()
    if not name or len(name) > MAX_NAME or not name.isprintable():
        return None
    return name


def viewer(
    request: web.Request, token: SecretStr | None, settings: ConsoleSettings, now: datetime
) -> Viewer:
    """Who the request is from (see the module's docstring)."""
    if token is None:
        return Viewer(None, False, "open")
    if proxy_trusted(settings, request.remote):
        name = clean_name(request.headers.get(settings.user_header))
        if name is not None:
            return Viewer(name, True, "proxy")
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        name = read_session(signing_key(token), cookie, now)
        if name is not None:
            return Viewer(name, True, "session")
    return Viewer(None, False, "none")


def same_origin(request: web.Request) -> bool:
    """A POST's Origin (when the browser sends one) names this host."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.host


def set_cookie(
    response: web.StreamResponse, request: web.Request, name: str, value: str, max_age: int | None
) -> None:
    """HttpOnly, Path=/ui/, Secure on HTTPS. The session is SameSite=Lax (a link to an
    incident from a chat card opens signed in; a cross-site POST never carries it), the
    CSRF nonces SameSite=Strict."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Lax" if name == SESSION_COOKIE else "Strict",
        secure=request.secure,
    )
