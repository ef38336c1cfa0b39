"""Building the gateway's channels from settings: names, secrets from env, clear errors."""

from __future__ import annotations

import pytest

from trainsentry.config import ConfigError, Settings
from trainsentry.gateway.channels import build
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.webhook import WebhookNotifier


def settings(raw: dict[str, object]) -> Settings:
    return Settings.model_validate(raw)


def test_console_always_and_webhooks_by_name() -> None:
    channels = build(
        settings(
            {
                "webhooks": {
                    "pager": {"url": "http://pager.local/hook", "rate_limits": [[5, 1.0]]},
                    "bridge": {"url_env": "BRIDGE_URL", "bearer_token_env": "BRIDGE_TOKEN"},
                }
            }
        ),
        env={"BRIDGE_URL": "http://u:p@bridge.local/x", "BRIDGE_TOKEN": "t"},
    )
    assert isinstance(channels.notifiers["console"], ConsoleNotifier)
    assert isinstance(channels.notifiers["pager"], WebhookNotifier)
    assert isinstance(channels.notifiers["bridge"], WebhookNotifier)
    assert channels.rate_limits == {"pager": [(5, 1.0)]}


def test_missing_secret_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="BRIDGE_URL"):
        build(settings({"webhooks": {"bridge": {"url_env": "BRIDGE_URL"}}}), env={})


def test_credentials_in_a_plain_url_are_refused() -> None:
    with pytest.raises(ValueError, match="url_env"):
        settings({"webhooks": {"x": {"url": "https://user:secret@hooks.local/x"}}})


def test_unknown_sections_are_refused() -> None:
    with pytest.raises(ValueError):
        settings({"gatewy": {}})
