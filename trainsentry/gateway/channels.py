"""Which channels this gateway sends to, built from settings once at start.

- `console` always (to a file when `gateway.console_file` is set);
- each entry of `webhooks:` as a generic JSON webhook channel under its own name;
- the `channels:` section (Feishu bot/app/sheet, phone, email) through notifiers/factory.py.
Secrets are read from the environment here; a missing one fails the start, not the first alert.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainsentry.config import ConfigError, Settings, describe_invalid
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.webhook import WebhookNotifier


@dataclass
class Channels:
    notifiers: dict[str, Notifier]
    rate_limits: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    built: Any = None  # notifiers.factory.BuiltChannels when `channels:` is configured


def _env_value(name: str, env: Mapping[str, str]) -> str:
    value = env.get(name, "")
    if not value:
        raise ConfigError(f"environment variable {name} (a secret) is not set")
    return value


def build(settings: Settings, env: Mapping[str, str] | None = None) -> Channels:
    env = os.environ if env is None else env
    notifiers: dict[str, Notifier] = {"console": ConsoleNotifier(settings.gateway.console_file)}
    rate_limits: dict[str, list[tuple[int, float]]] = {}
    for name, hook in settings.webhooks.items():
        url = hook.url or (_env_value(hook.url_env, env) if hook.url_env else None)
        if not url:
            raise ConfigError(f"webhooks.{name}: set url or url_env")
        token = _env_value(hook.bearer_token_env, env) if hook.bearer_token_env else None
        notifiers[name] = WebhookNotifier(
            url, name=name, bearer_token=token, timeout=hook.timeout_s
        )
        if hook.rate_limits:
            rate_limits[name] = list(hook.rate_limits)
    built = None
    if settings.channels:
        from trainsentry.notifiers.factory import build_channels
        from trainsentry.notifiers.settings import ChannelsSettings, SecretMissing

        try:
            built = build_channels(ChannelsSettings.model_validate(settings.channels), env)
        except (SecretMissing, ValueError) as exc:
            raise ConfigError(f"channels: {describe_invalid(exc)}") from None
        clash = set(built.notifiers) & set(notifiers)
        if clash:
            raise ConfigError(f"channel names used twice: {sorted(clash)}")
        notifiers.update(built.notifiers)
        if "phone" in built.notifiers and built.escalator is None:
            raise ConfigError(
                "channels.phone needs channels.escalation (who is called, in which order)"
            )
        rate_limits.update(built.outbox_rate_limits)
    return Channels(notifiers=notifiers, rate_limits=rate_limits, built=built)
