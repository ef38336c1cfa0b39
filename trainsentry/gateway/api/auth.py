"""Who may call the gateway's HTTP endpoints: bearer tokens compared as bytes in constant
time (odd bytes are a 401, never a 5xx), the read token, and which endpoint groups are open
when a token is unset (docs/gateway.md, "Who may call what")."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from trainsentry.config import ConsoleSettings, GatewaySettings
from trainsentry.credentials import secrets_equal
from trainsentry.gateway.access import Actor, groups_of

WEBHOOK_PATH = "/api/v1/alertmanager"
MAX_NAME = 100


def error_response(status: int, reason: str, **extra: Any) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return error_response(exc.status, exc.reason)
        raise


def bearer(request: web.Request) -> str | None:
    """The token of the request's `Authorization: Bearer <token>` header, or None."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else None


def authorized(request: web.Request, token: SecretStr | None) -> bool:
    if token is None:
        return True
    given = bearer(request)
    return given is not None and secrets_equal(given, token.get_secret_value())


def read_token(settings: GatewaySettings) -> SecretStr | None:
    """The token of the read API and of acks: the API token, else the webhook token (so a
    gateway with only the webhook token set does not answer everyone's reads)."""
    return settings.api_token or settings.webhook_token


def open_endpoints(settings: GatewaySettings) -> list[str]:
    """Pure: the endpoint groups anyone who reaches the listen address can use unauthenticated.

    Acks are refused (403) without a token, the card callback always needs Feishu's
    verification token and hang triggers the probes' token, so only these can be open."""
    groups = []
    if settings.webhook_token is None:
        groups.append(f"webhook intake (POST {WEBHOOK_PATH}): set TRAINSENTRY_WEBHOOK_TOKEN")
    if read_token(settings) is None:
        groups.append(
            "read API and incident console (GET /api/v1/alerts, /api/v1/notifications,"
            " /api/v1/nodes, /api/v1/oncall, /ui/): set TRAINSENTRY_API_TOKEN"
        )
    return groups


def unauthorized() -> web.Response:
    response = error_response(401, "missing or wrong bearer token")
    response.headers["WWW-Authenticate"] = 'Bearer realm="trainsentry"'
    return response


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


def proxy_actor(request: web.Request, console: ConsoleSettings) -> Actor | None:
    """The person a trusted proxy names (its user header, and its groups header: each value
    comma-separated, as oauth2-proxy sends them), or None when the request is not from a
    trusted proxy address or names nobody."""
    if not proxy_trusted(console, request.remote):
        return None
    name = clean_name(request.headers.get(console.user_header))
    if name is None:
        return None
    return Actor(name, "proxy", groups_of(request.headers.getall(console.groups_header, [])))
