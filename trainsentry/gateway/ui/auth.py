"""Who is looking at the console, and whether a form was posted by the console itself.

- No token configured on the gateway (`read_token`: the API token, else the webhook token):
  the console is read only and open, like the read API; every action is refused (403), like
  `POST /api/v1/alerts/{id}/ack` without a token.
- A token configured: the login page takes the token and a name; the answer is a session
  cookie `ts_session` (signed with HMAC-SHA256 under a key derived from the token, HttpOnly,
  SameSite=Lax, Path=/ui/, Secure on HTTPS) that carries the name, a random session id and
  its expiry. Changing the token ends every session; signing out ends that one, for every
  copy of the cookie (its id is kept as revoked in the store until it would have expired:
  store/console_sessions.py, checked by signin.py on every request). A request from a
  trusted proxy address (`console.trusted_proxies`) carrying the user header is signed in
  as that user, a member of the groups of its groups header, without the token: the
  production sign-in. A session (the token typed in) is break-glass: it acts on every
  team's incidents and the audit trail says so (gateway/access.py).
- Every action needs the CSRF token: a random nonce in the `ts_csrf` cookie (SameSite=Strict,
  HttpOnly) and, in the form or the `X-CSRF-Token` header, HMAC(key, nonce): a page of
  another site can neither read the cookie nor compute the token. A POST whose Origin is
  another site is refused too, and one whose Origin is not a URL is a bad request
  (`BadOrigin`).
- Our cookies hold printable ASCII only: one holding anything else (a cookie planted from a
  sibling domain, bytes no browser of ours was given) is read as absent (`cookie`), never an
  error, so such a cookie cannot lock anyone out of the console.

Pure functions (signing, checking) take the key and the time; `viewer` reads the request.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import SecretStr

from trainsentry.config import ConsoleSettings
from trainsentry.credentials import secrets_equal
from trainsentry.gateway.access import Actor
from trainsentry.gateway.api.auth import MAX_NAME as MAX_NAME
from trainsentry.gateway.api.auth import clean_name as clean_name
from trainsentry.gateway.api.auth import proxy_actor
from trainsentry.gateway.api.auth import proxy_trusted as proxy_trusted

SESSION_COOKIE = "ts_session"
CSRF_COOKIE = "ts_csrf"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
COOKIE_PATH = "/ui/"
MAX_COOKIE = 4096
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


class BadOrigin(ValueError):
    """The request's Origin header is not a URL (a 400)."""


@dataclass(frozen=True, slots=True)
class Session:
    """A signed, unexpired session cookie's content."""

    name: str
    session_id: str
    expires: datetime


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who the request is from. `name` is None for an anonymous reader; `session` is the
    session cookie that signed the viewer in (via "session")."""

    name: str | None
    can_act: bool  # a token is configured and the viewer is signed in
    via: str  # "open" (no token), "session", "proxy", "none" (must sign in)
    session: Session | None = None
    groups: frozenset[str] = frozenset()  # the proxy's groups header (via "proxy")

    @property
    def actor(self) -> Actor | None:
        """Who acts (gateway/access.py): the proxy's person, or for a session (signed in
        with the shared token) the name typed, as break-glass; None: nobody who may act."""
        if not self.can_act or self.name is None:
            return None
        if self.via == "proxy":
            return Actor(self.name, "proxy", self.groups)
        return Actor(self.name, "break-glass")


ANONYMOUS = Viewer(None, False, "none")


def signing_key(token: SecretStr) -> bytes:
    """Pure: the key that signs sessions and CSRF tokens, derived from the gateway's token
    (never the token itself, so a leaked cookie says nothing about the token)."""
    return hmac.new(
        token.get_secret_value().encode(), b"trainsentry-console-v1", hashlib.sha256
    ).digest()


def _mac(key: bytes, text: str) -> str:
    digest = hmac.new(key, text.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def new_session_id() -> str:
    return secrets.token_urlsafe(16)


def sign_session(key: bytes, name: str, expires: datetime, session_id: str) -> str:
    """Pure: the session cookie's value for `name` until `expires`, as session `session_id`."""
    body = json.dumps(
        {"u": name, "exp": int(expires.timestamp()), "sid": session_id}, separators=(",", ":")
    )
    payload = base64.urlsafe_b64encode(body.encode()).decode().rstrip("=")
    return f"{payload}.{_mac(key, payload)}"


def read_session(key: bytes, value: str, now: datetime) -> Session | None:
    """Pure: the session, or None when the cookie is forged, damaged, expired, or from
    before sessions had an id (which could not be ended by signing out)."""
    if len(value) > 2048 or not value.isascii():
        return None
    payload, _, mac = value.partition(".")
    if not payload or not secrets_equal(mac, _mac(key, payload)):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        name, expires, session_id = data["u"], data["exp"], data["sid"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(name, str) or not isinstance(expires, int) or expires <= now.timestamp():
        return None
    if not isinstance(session_id, str) or not SESSION_ID.match(session_id):
        return None
    return Session(name, session_id, datetime.fromtimestamp(expires, UTC))


def csrf_token(key: bytes, nonce: str) -> str:
    """Pure: the token a form must carry for the `ts_csrf` cookie holding `nonce`."""
    return _mac(key, "csrf|" + nonce)


def csrf_ok(key: bytes, nonce: str | None, given: str | None) -> bool:
    """Pure: the posted token matches the cookie's nonce (both present, compared in
    constant time)."""
    if not nonce or not given or len(given) > 200 or len(nonce) > 200:
        return False
    if not (nonce.isascii() and given.isascii()):
        return False
    return secrets_equal(given, csrf_token(key, nonce))


def new_nonce() -> str:
    return secrets.token_urlsafe(24)


def cookie(request: web.Request, name: str) -> str | None:
    """The cookie `name` when it is one of ours could be: printable ASCII, at most
    MAX_COOKIE characters; anything else reads as absent."""
    value = request.cookies.get(name)
    if not value or len(value) > MAX_COOKIE or not (value.isascii() and value.isprintable()):
        return None
    return value


def viewer(
    request: web.Request, token: SecretStr | None, settings: ConsoleSettings, now: datetime
) -> Viewer:
    """Who the request is from (see the module's docstring). A session's revocation is
    the caller's to check (it is in the store)."""
    if token is None:
        return Viewer(None, False, "open")
    person = proxy_actor(request, settings)
    if person is not None:
        return Viewer(person.name, True, "proxy", groups=person.groups)
    value = cookie(request, SESSION_COOKIE)
    if value:
        session = read_session(signing_key(token), value, now)
        if session is not None:
            return Viewer(session.name, True, "session", session)
    return ANONYMOUS


def same_origin(request: web.Request) -> bool:
    """A POST's Origin (when the browser sends one) names this host; BadOrigin when the
    header is not a URL."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        raise BadOrigin("the Origin header is not a URL") from None
    return netloc == request.host


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
