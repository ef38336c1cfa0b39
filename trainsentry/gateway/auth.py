"""Who may call the gateway's HTTP endpoints: bearer tokens compared as bytes in constant
time, the read token's fallback, and which endpoint groups are open (docs/gateway.md, "Who
may call what")."""

from __future__ import annotations

from aiohttp import web
from pydantic import SecretStr

from trainsentry.config import GatewaySettings
from trainsentry.notifiers.feishu.sign import secrets_equal


def authorized(request: web.Request, token: SecretStr | None) -> bool:
    if token is None:
        return True
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and secrets_equal(given.strip(), token.get_secret_value())


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
        groups.append("webhook intake (POST /api/v1/alertmanager): set TRAINSENTRY_WEBHOOK_TOKEN")
    if read_token(settings) is None:
        groups.append(
            "read API (GET /api/v1/alerts, /api/v1/notifications): set TRAINSENTRY_API_TOKEN"
        )
    return groups


def unauthorized() -> web.Response:
    response = web.json_response({"error": "missing or wrong bearer token"}, status=401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="trainsentry"'
    return response
