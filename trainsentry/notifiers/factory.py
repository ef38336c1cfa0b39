"""Builds every configured channel from `ChannelsSettings` (what the gateway wires up at start).

    built = build_channels(ChannelsSettings.model_validate(raw["channels"]))
    outbox = Outbox(..., notifiers=built.notifiers, rate_limits=built.outbox_rate_limits)

Secrets are read from the environment here, once; a missing one raises `SecretMissing`
naming the variable, so a misconfigured gateway fails at start, not at the first alert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainsentry.gateway.policy.escalation import Escalator
from trainsentry.gateway.policy.roster import escalation_policy_of, roster_of
from trainsentry.notifiers.alertmanager import SilenceClient
from trainsentry.notifiers.base import Notifier
from trainsentry.notifiers.email import EmailNotifier
from trainsentry.notifiers.feishu.app import FeishuAppClient, FeishuAppNotifier
from trainsentry.notifiers.feishu.bot import FeishuBotNotifier
from trainsentry.notifiers.feishu.sheet import FeishuSheetArchive
from trainsentry.notifiers.phone.notifier import PhoneNotifier
from trainsentry.notifiers.ratelimit import as_pairs
from trainsentry.notifiers.settings import ChannelsSettings, read_secret


@dataclass
class BuiltChannels:
    notifiers: dict[str, Notifier] = field(default_factory=dict)
    feishu_app: FeishuAppClient | None = None
    silences: SilenceClient | None = None
    escalator: Escalator | None = None
    # For the card callback handler (see feishu/callback.py), when configured.
    callback_path: str | None = None
    verification_token: str | None = field(default=None, repr=False)
    encrypt_key: str | None = field(default=None, repr=False)

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
        # Each channel owns its client (and closes it); they share the app credentials.
        built.feishu_app = FeishuAppClient.from_settings(app_settings, env)
        if app_settings.chats:
            app_notifier = FeishuAppNotifier.from_settings(app_settings, built.feishu_app)
            built.notifiers[app_notifier.name] = app_notifier
        if app_settings.callback is not None:
            callback = app_settings.callback
            built.callback_path = callback.path
            built.verification_token = read_secret(callback.verification_token_env, env)
            if callback.encrypt_key_env:
                built.encrypt_key = read_secret(callback.encrypt_key_env, env)
    if settings.feishu_sheet is not None:
        if settings.feishu_app is None:
            raise ValueError("channels.feishu_sheet needs channels.feishu_app (credentials)")
        sheet = FeishuSheetArchive.from_settings(
            settings.feishu_sheet, FeishuAppClient.from_settings(settings.feishu_app, env)
        )
        built.notifiers[sheet.name] = sheet
    if settings.phone is not None:
        feishu = (
            FeishuAppClient.from_settings(settings.feishu_app, env)
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
    if settings.escalation is not None:
        built.escalator = Escalator(
            roster_of(settings.escalation), escalation_policy_of(settings.escalation)
        )
    return built
