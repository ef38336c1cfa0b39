"""Who may call the gateway's HTTP endpoints: bearer tokens compared as bytes in constant
time (odd bytes are a 401, never a 5xx), the read token, and which endpoint groups are open
when a token is unset (docs/gateway.md, "Who may call what")."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import SecretStr

from trainsentry.config import GatewaySettings
from trainsentry.notifiers.feishu.sign import secrets_equal

WEBHOOK_PATH = "/api/v1/alertmanager"


def error_response(status: int, reason: str, **extra: Any) -> web.Response:
    return web.json_response({"error": reason, **extra}, status=status)


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
