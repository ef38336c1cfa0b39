"""Which channels this gateway sends to, built from settings once at start: the single
channel factory (`build`, `build_channels`). Every secret is read through one function,
`notifiers.settings.read_secret` (here, in the channels' `from_settings`, and for the
probes' token in assemble.py), with the environment this module is given.

- `console` always (to a file when `gateway.console_file` is set);
- each entry of `webhooks:` as a generic JSON webhook channel under its own name;
- the `channels:` section (Feishu bot/app/sheet, phone, email, Alertmanager silences)
  through `build_channels`.
Secrets are read from the environment here, once; a missing one fails the start (naming the
variable, never showing a value), not the first alert.

A new channel: its package under notifiers/ (notifier + settings model, importing only
alerts.py and notifiers/base.py), a field in `ChannelsSettings`, one branch in `build_channels`.

Feishu counts message limits per app: every Feishu app client built here for the one app of
`channels.feishu_app` (its cards, the `feishu_job` channel, the phone provider's messages)
shares one message gate (`BuiltChannels.feishu_gate`), so together they stay under the app's
50/s and 1000/min, whatever each channel's own outbox bucket allows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainsentry.config import ConfigError, Settings, describe_invalid
from trainsentry.config.channels import ChannelsSettings
from trainsentry.gateway.policy.route import CHANNEL_KINDS, JOB_CHANNEL
from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.console import ConsoleNotifier
from trainsentry.notifiers.email import EmailNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier, app_message_gate
from trainsentry.notifiers.feishu.bot import FeishuBotNotifier
from trainsentry.notifiers.feishu.card import CardOptions
from trainsentry.notifiers.feishu.job import FeishuJobNotifier, JobDestinations
from trainsentry.notifiers.feishu.sheet import FeishuSheetArchive
from trainsentry.notifiers.phone.notifier import PhoneNotifier
from trainsentry.notifiers.ratelimit import RateGate, as_pairs
from trainsentry.notifiers.settings import SecretMissing, read_secret
from trainsentry.notifiers.webhook import WebhookNotifier


@dataclass
class BuiltChannels:
    notifiers: dict[str, Notifier] = field(default_factory=dict)
    feishu_app: FeishuAppClient | None = None
    # the message limits of the Feishu app, shared by all its clients (see the module doc)
    feishu_gate: RateGate | None = None
    silences: SilenceClient | None = None
    # For the card callback handler (see feishu/callback.py), when configured.
    callback_path: str | None = None
    verification_token: str | None = field(default=None, repr=False)
    encrypt_key: str | None = field(default=None, repr=False)
    callback_max_skew_s: float = 300.0

    @property
    def outbox_rate_limits(self) -> dict[str, list[tuple[int, float]]]:
        """`(count, seconds)` limits per channel, the form the outbox takes."""
        return {
            name: as_pairs(limits)
            for name, notifier in self.notifiers.items()
            if (limits := getattr(notifier, "rate_limits", ()))
        }

    async def aclose(self) -> None:
        for notifier in self.notifiers.values():
            await notifier.aclose()
        if self.feishu_app is not None:
            await self.feishu_app.aclose()  # closing twice is harmless
        if self.silences is not None:
            await self.silences.aclose()


def build_channels(
    settings: ChannelsSettings, env: Mapping[str, str] | None = None
) -> BuiltChannels:
    built = BuiltChannels()
    if settings.feishu_bot is not None:
        bot = FeishuBotNotifier.from_settings(settings.feishu_bot, env)
        built.notifiers[bot.name] = bot
    if settings.feishu_app is not None:
        app_settings = settings.feishu_app
        # Each channel owns its client (and closes it); they share the app credentials and
        # the app's message limits (one gate).
        built.feishu_gate = app_message_gate()
        built.feishu_app = FeishuAppClient.from_settings(
            app_settings, env, message_gate=built.feishu_gate
        )
        if app_settings.chats:
            app_notifier = FeishuAppNotifier.from_settings(app_settings, built.feishu_app)
            built.notifiers[app_notifier.name] = app_notifier
        if app_settings.callback is not None:
            callback = app_settings.callback
            built.callback_path = callback.path
            built.verification_token = read_secret(callback.verification_token_env, env)
            built.callback_max_skew_s = callback.max_skew_s
            if callback.encrypt_key_env:
                built.encrypt_key = read_secret(callback.encrypt_key_env, env)
    if settings.feishu_sheet is not None:
        assert settings.feishu_app is not None  # the settings require it
        sheet = FeishuSheetArchive.from_settings(
            settings.feishu_sheet,
            FeishuAppClient.from_settings(settings.feishu_app, env, message_gate=built.feishu_gate),
        )
        built.notifiers[sheet.name] = sheet
    if settings.phone is not None:
        feishu = (
            FeishuAppClient.from_settings(settings.feishu_app, env, message_gate=built.feishu_gate)
            if settings.feishu_app is not None
            else None
        )
        phone = PhoneNotifier.from_settings(settings.phone, feishu=feishu, env=env)
        built.notifiers[phone.name] = phone
    if settings.email is not None:
        email = EmailNotifier.from_settings(settings.email, env)
        built.notifiers[email.name] = email
    if settings.alertmanager is not None:
        built.silences = SilenceClient.from_settings(settings.alertmanager, env)
    return built


@dataclass
class Channels:
    notifiers: dict[str, Notifier]
    rate_limits: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    built: BuiltChannels | None = None  # when `channels:` is configured


def _env_value(name: str, env: Mapping[str, str]) -> str:
    try:
        return read_secret(name, env)
    except SecretMissing as exc:
        raise ConfigError(str(exc)) from None


def build(settings: Settings, env: Mapping[str, str] | None = None) -> Channels:
    env = os.environ if env is None else env
    notifiers: dict[str, Notifier] = {"console": ConsoleNotifier(settings.gateway.console_file)}
    rate_limits: dict[str, list[tuple[int, float]]] = {}
    for name, hook in settings.webhooks.items():
        url = hook.url or _env_value(hook.url_env or "", env)  # one of them (the settings)
        token = _env_value(hook.bearer_token_env, env) if hook.bearer_token_env else None
        notifiers[name] = WebhookNotifier(
            url, name=name, bearer_token=token, timeout=hook.timeout_s
        )
        if hook.rate_limits:
            rate_limits[name] = list(hook.rate_limits)
    built = None
    if settings.channels is not None:
        try:
            built = build_channels(settings.channels, env)
        except (SecretMissing, ValueError) as exc:
            raise ConfigError(f"channels: {describe_invalid(exc)}") from None
        clash = set(built.notifiers) & set(notifiers)
        if clash:
            raise ConfigError(f"channel names used twice: {sorted(clash)}")
        notifiers.update(built.notifiers)
        rate_limits.update(built.outbox_rate_limits)
    return Channels(notifiers=notifiers, rate_limits=rate_limits, built=built)


def add_job_channel(channels: Channels, destinations: JobDestinations) -> FeishuJobNotifier:
    """Adds the `feishu_job` channel (TrainingJobs' own chats and bots, gateway/stages/
    job_alerting.py): it sends through the Feishu app when one is configured (the client of
    `feishu_app`, so the two channels' messages share the app's limits) and falls back to
    the gateway's own Feishu channels."""
    built = channels.built
    fallbacks = {
        name: notifier
        for name, notifier in channels.notifiers.items()
        if name in CHANNEL_KINDS["feishu"]
    }
    notifier = FeishuJobNotifier(
        destinations,
        app=built.feishu_app if built is not None else None,
        fallbacks=fallbacks,
        card_options=CardOptions(actions=built is not None and built.callback_path is not None),
    )
    channels.notifiers[JOB_CHANNEL] = notifier
    channels.rate_limits[JOB_CHANNEL] = as_pairs(notifier.rate_limits)
    return notifier
