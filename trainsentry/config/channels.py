"""The `channels:` section: Feishu bot/app/sheet, phone, e-mail and Alertmanager silences
(each channel's code is in notifiers/; gateway/channels.py builds them).

Everything here is non-secret. Secrets (webhook URLs, which carry a credential, bot signing
secrets, the app secret, SMTP passwords, API tokens) are named by the environment variable
that holds them (`*_env` fields) and read with `notifiers.settings.read_secret` at start-up;
a literal secret in the YAML is refused because the models forbid unknown keys.

`escalation` is a deprecated alias of `oncall.escalation` (config/escalation.py), kept for
the files and chart values (`channels.config`) that set it here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainsentry.alerts import Priority
from trainsentry.config.escalation import EscalationSettings
from trainsentry.config.problems import SectionProblems


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WebhookTarget(_Model):
    """One Feishu custom bot: its webhook URL and (optional) signing secret, both from env."""

    url_env: str
    secret_env: str | None = None


class BotGroup(WebhookTarget):
    priorities: list[Priority]


class FeishuBotSettings(_Model):
    """Custom bots: one webhook per priority group, overridable per job (`ns/name`)."""

    groups: dict[str, BotGroup] = Field(default_factory=dict)
    jobs: dict[str, WebhookTarget] = Field(default_factory=dict)
    max_wait_s: float = 2.0
    timeout_s: float = 10.0

    @model_validator(mode="after")
    def _one_group_per_priority(self) -> FeishuBotSettings:
        seen: dict[Priority, str] = {}
        for name, group in self.groups.items():
            for priority in group.priorities:
                if priority in seen:
                    raise ValueError(f"{priority} is in bot groups {seen[priority]} and {name}")
                seen[priority] = name
        return self


class FeishuCallbackSettings(_Model):
    """Card action callbacks (request URL configured in the Feishu developer console)."""

    path: str = "/api/v1/feishu/card"
    verification_token_env: str = "FEISHU_VERIFICATION_TOKEN"
    encrypt_key_env: str | None = None
    max_skew_s: int = 300


class FeishuAppSettings(_Model):
    base_url: str = "https://open.feishu.cn"
    app_id: str
    app_secret_env: str = "FEISHU_APP_SECRET"
    # Chats that receive cards via the app, per priority group (like the bot groups).
    chats: dict[str, list[Priority]] = Field(default_factory=dict)
    callback: FeishuCallbackSettings | None = None
    timeout_s: float = 10.0


class FeishuSheetSettings(_Model):
    spreadsheet_token: str
    sheet_title_format: str = "alerts-%Y-%m"
    batch_window_s: float = 0.5
    max_rows_per_call: int = Field(default=500, ge=1, le=5000)


class TwilioSettings(_Model):
    base_url: str = "https://api.twilio.com"
    account_sid: str
    auth_token_env: str = "TWILIO_AUTH_TOKEN"
    from_number: str
    voice_language: str = "en-US"


class WebhookPhoneSettings(_Model):
    """A generic HTTP voice gateway (Aliyun/Tencent style) driven by a JSON body template."""

    url_env: str
    method: Literal["POST", "PUT"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    header_secrets_env: dict[str, str] = Field(default_factory=dict)  # header -> env var
    body_template: str
    success_field: str | None = None  # dotted path in the JSON answer, e.g. "Code"
    success_value: str | None = None


class PhoneSettings(_Model):
    provider: Literal["feishu", "twilio", "webhook"] = "feishu"
    twilio: TwilioSettings | None = None
    webhook: WebhookPhoneSettings | None = None

    @model_validator(mode="after")
    def _provider_configured(self) -> PhoneSettings:
        if self.provider == "twilio" and self.twilio is None:
            raise ValueError("phone.provider is twilio but phone.twilio is missing")
        if self.provider == "webhook" and self.webhook is None:
            raise ValueError("phone.provider is webhook but phone.webhook is missing")
        return self


class EmailSettings(_Model):
    host: str
    port: int = 587
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password_env: str | None = None
    sender: str
    recipients: dict[str, list[Priority]] = Field(default_factory=dict)  # address -> priorities
    timeout_s: float = 30.0


class AlertmanagerSilenceSettings(_Model):
    url: str
    created_by: str = "trainsentry"
    bearer_token_env: str | None = None
    match_labels: list[str] | None = None  # None: every label of the alert
    default_duration_s: int = Field(default=3600, gt=0)


class ChannelsSettings(_Model):
    feishu_bot: FeishuBotSettings | None = None
    feishu_app: FeishuAppSettings | None = None
    feishu_sheet: FeishuSheetSettings | None = None
    phone: PhoneSettings | None = None
    escalation: EscalationSettings | None = None
    email: EmailSettings | None = None
    alertmanager: AlertmanagerSilenceSettings | None = None

    @model_validator(mode="after")
    def _sheet_has_its_app(self) -> ChannelsSettings:
        if self.feishu_sheet is not None and self.feishu_app is None:
            raise SectionProblems([("feishu_sheet", "needs channels.feishu_app (credentials)")])
        return self
