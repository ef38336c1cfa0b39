"""Typed settings, one place. Non-secret settings come from a YAML file (TRAINSENTRY_CONFIG or
--config) and TRAINSENTRY_* environment variables; secrets only from the environment
(in Kubernetes: env from a Secret), never from the file.

Precedence: command-line flag > environment variable > config file > default.

Validated once, at load: `load_settings` raises one ConfigError (config/problems.py) holding
every problem found, each with its path from the top of the file.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainsentry.config.access import AccessSettings, TeamSettings
from trainsentry.config.channels import ChannelsSettings
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.config.job_alerting import JobAlertingSettings
from trainsentry.config.oncall import OncallSettings
from trainsentry.config.problems import (
    ConfigError,
    Problem,
    SectionProblems,
    describe_invalid,
    describe_yaml_error,
    problems_of,
)
from trainsentry.config.remediation import CordonSettings, approver_problems, presser_problems
from trainsentry.config.reports import ReportSettings
from trainsentry.config.topology import TopologySettings

__all__ = [
    "AccessSettings",
    "ConfigError",
    "ConsoleSettings",
    "GatewaySettings",
    "MaintenanceSettings",
    "Problem",
    "RetentionSettings",
    "Settings",
    "TeamSettings",
    "WebhookChannelSettings",
    "describe_invalid",
    "load_settings",
    "validate_settings",
]


# The weekly report of the running week reads the week before it (its change column) and
# looks back a little further (recurrence, flapping): alerts and notifications are kept at
# least this long, so purging never changes a report that can still be sent.
REPORT_FLOOR_DAYS = 28.0


class RetentionSettings(BaseModel):
    """What the store keeps, per kind of row, in days (docs/gateway.md, "Retention"). Only
    finished rows go: resolved alerts (with their events and notifications) last touched
    before the cut, notifications sent, dead or cancelled, receipts last received before it.
    Deleted in batches of `batch_size` rows with `pause_seconds` between them."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    receipts_days: float = Field(default=7.0, ge=1.0)
    alerts_days: float = Field(default=90.0, ge=REPORT_FLOOR_DAYS)
    notifications_days: float = Field(default=90.0, ge=REPORT_FLOOR_DAYS)
    interval_seconds: float = Field(default=300.0, ge=1.0)
    batch_size: int = Field(default=500, ge=1, le=10_000)
    pause_seconds: float = Field(default=0.1, ge=0.0, le=60.0)


class ConsoleSettings(BaseModel):
    """The incident console at `/ui/` (gateway/ui/, docs/console.md)."""

    model_config = ConfigDict(extra="forbid")

    # A login lasts this long; then the token is asked again.
    session_hours: float = Field(default=12.0, gt=0, le=24 * 30)
    # oauth2-proxy style: a request from one of these addresses (IPs or CIDRs) that carries
    # `user_header` is signed in as that user without the token, a member of the groups of
    # `groups_header` (comma-separated, as oauth2-proxy joins them; `gateway.access` says
    # what each group may act on). Empty: no proxy trusted.
    trusted_proxies: list[str] = Field(default_factory=list)
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"not an IP address or CIDR: {entry!r}") from None
        return value


def _host_port(address: str) -> tuple[str, int]:
    """Pure: a checked HOST:PORT (`GatewaySettings._check_listen`) as (host, port): an IPv6
    host without its brackets, an empty host as 0.0.0.0."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    listen: str = "0.0.0.0:9095"
    # The probes' hang triggers on a port of their own, HOST:PORT (docs/gateway.md, "Hang
    # triggers"): answered by a child process of the gateway, so a job's trigger flood
    # does not share the loop that stores and sends every other team's alerts. Unset: the
    # triggers are taken on `listen` only (they are taken there in any case).
    trigger_listen: str | None = None
    db: str = "sqlite:///trainsentry.db"
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # A request's whole body must arrive within this (else 408 and the connection closes),
    # and at most this many requests may be sending bodies at once (else 503, Retry-After).
    body_timeout_s: float = Field(default=30.0, gt=0)
    max_body_readers: int = Field(default=256, ge=1)
    # The probes' hang triggers (8 KiB each, read by their handler) have readers of their
    # own, apart from the 256 above: neither a job's trigger flood nor a webhook storm
    # takes the other's (gateway/api/limits.py `ReaderPool`).
    max_trigger_readers: int = Field(default=1024, ge=1)
    # The listen queue of the gateway's socket (capped by the kernel's somaxconn): a burst
    # of new connections beyond it is dropped and retried by the client 1 s, 3 s later.
    listen_backlog: int = Field(default=1024, ge=1, le=65535)
    # A connection that has not sent a whole request head (or sits idle between requests)
    # this long is closed: slow headers are bounded as bodies are (aiohttp's keep-alive).
    idle_timeout_s: float = Field(default=75.0, gt=0)
    # Bytes of request bodies held in memory at once (each counted at its Content-Length);
    # a body beyond it gets 503 with Retry-After. One body is always let in.
    max_body_bytes_in_flight: int = Field(default=64 * 1024 * 1024, ge=1024)
    # Journal-first intake (docs/gateway.md): alerts of answered webhooks that may wait to be
    # recorded; beyond it a webhook without P0/P1 alerts waits for room (up to 10 s, then
    # 503). 0: every webhook is recorded before its answer.
    journal_max_alerts: int = Field(default=20_000, ge=0)
    console_file: Path | None = None
    alertmanager_url: str | None = None
    policy_file: Path | None = None
    # Write status.lastAlert of TrainingJobs (needs RBAC patch on trainingjobs/status).
    trainingjob_status: bool = False
    # A firing alert whose endsAt passed and that no webhook mentioned for this long is
    # resolved as expired. Keep it above the longest Alertmanager repeat_interval of the routes
    # that reach the gateway (the shipped routes repeat P3 every 24 h).
    stale_after_seconds: float = Field(default=24.5 * 3600, gt=0)
    # The outbox (docs/gateway.md, "Delivery guarantees"): concurrent sends per channel, the
    # total time one send may take (connect, request, the whole answer), the claim lease
    # (longer than the deadline), and how long a failing notification is retried, per priority.
    send_slots_per_channel: int = Field(default=16, ge=1, le=256)
    send_deadline_seconds: float = Field(default=30.0, gt=0)
    outbox_lease_seconds: float = Field(default=60.0, gt=0)
    give_up_after_seconds: dict[str, float] = Field(
        default_factory=lambda: {"P0": 3600.0, "P1": 3600.0, "P2": 1800.0, "P3": 1800.0}
    )
    # Deleting finished rows from the store (a purge every retention.interval_seconds).
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    # Who acts on which teams' incidents (config/access.py, docs/gateway.md).
    access: AccessSettings = Field(default_factory=AccessSettings)
    # Secrets: from the environment only.
    webhook_token: SecretStr | None = Field(default=None, exclude=True)
    api_token: SecretStr | None = Field(default=None, exclude=True)

    @field_validator("webhook_token", "api_token")
    @classmethod
    def _strip_token(cls, value: SecretStr | None) -> SecretStr | None:
        """A Secret made from an echoed file ends in a newline; the presented token is
        stripped, so the configured one is too. Blank is unset."""
        if value is None:
            return None
        stripped = value.get_secret_value().strip()
        return SecretStr(stripped) if stripped else None

    @field_validator("listen", "trigger_listen")
    @classmethod
    def _check_listen(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or (info.field_name == "trigger_listen" and not value.strip()):
            return None  # blank: no trigger port
        _host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{info.field_name} must be HOST:PORT, got {value!r}")
        return value

    @field_validator("give_up_after_seconds")
    @classmethod
    def _check_give_up(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) != {"P0", "P1", "P2", "P3"} or not all(v > 0 for v in value.values()):
            raise ValueError("give_up_after_seconds needs P0, P1, P2 and P3, each above 0")
        return value

    @model_validator(mode="after")
    def _check_lease(self) -> GatewaySettings:
        if self.send_deadline_seconds >= self.outbox_lease_seconds:
            raise ValueError("send_deadline_seconds must be shorter than outbox_lease_seconds")
        return self

    @property
    def host(self) -> str:
        return _host_port(self.listen)[0]

    @property
    def port(self) -> int:
        return _host_port(self.listen)[1]

    @property
    def trigger_address(self) -> tuple[str, int] | None:
        """The trigger port's (host, port), or None when there is none."""
        return None if self.trigger_listen is None else _host_port(self.trigger_listen)

    @property
    def loopback_only(self) -> bool:
        """Only this host can connect (127.0.0.0/8, ::1 or localhost)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: it may resolve to any interface
            return False


class WebhookChannelSettings(BaseModel):
    """A generic JSON webhook channel (notifiers/webhook.py). The URL can carry a credential,
    so it may be given by environment variable name instead (`url_env`)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    url_env: str | None = None
    bearer_token_env: str | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    rate_limits: list[tuple[int, float]] = Field(default_factory=list)

    @field_validator("url")
    @classmethod
    def _no_credentials_in_url(cls, value: str | None) -> str | None:
        if value and "@" in value.split("//", 1)[-1].split("/", 1)[0]:
            raise ValueError("the URL carries credentials: give it through url_env instead")
        return value

    @model_validator(mode="after")
    def _has_a_url(self) -> WebhookChannelSettings:
        if not self.url and not self.url_env:
            raise ValueError("set url or url_env")
        return self


class MaintenanceSettings(BaseModel):
    """Maintenance windows (docs/oncall.md, "Maintenance windows"): the longest window (one
    occurrence) a request may ask for; the longest a window may last in all, from its first
    start to its last end across a recurring window's occurrences (None: max_window_hours;
    at most 10 years, as far as a rule is searched); how long before a window's end its
    still-firing alerts are announced (0: never), and how long after its last muted alert
    resolved a still-open window is listed in the weekly report."""

    model_config = ConfigDict(extra="forbid")

    max_window_hours: float = Field(default=168.0, gt=0, le=8784)
    max_total_hours: float | None = Field(default=None, gt=0, le=87840)
    announce_before_minutes: float = Field(default=15.0, ge=0, le=1440)
    report_quiet_hours: float = Field(default=24.0, gt=0, le=8784)

    @model_validator(mode="after")
    def _total_covers_one(self) -> MaintenanceSettings:
        if self.max_total_hours is not None and self.max_total_hours < self.max_window_hours:
            raise ValueError("max_total_hours must be at least max_window_hours")
        return self

    @property
    def total_hours(self) -> float:
        """The longest a window may last in all (first start to last end), in hours."""
        return self.max_window_hours if self.max_total_hours is None else self.max_total_hours


log = logging.getLogger("trainsentry.config")

_BOTH_HOMES = "a deprecated alias of oncall.escalation, which is set too: keep oncall.escalation"
_NOBODY_TO_CALL = (
    "needs oncall.escalation or oncall.escalation_policies (who is called, in which order)"
)


class Settings(BaseModel):
    """All of trainsentry's settings, every section typed (its model in config/<section>.py)
    and checked here, once, with the references between sections."""

    model_config = ConfigDict(extra="forbid")

    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    webhooks: dict[str, WebhookChannelSettings] = Field(default_factory=dict)
    channels: ChannelsSettings | None = None  # an empty section is none
    reports: ReportSettings = Field(default_factory=ReportSettings)
    diagnosis: DiagnosisSettings = Field(default_factory=DiagnosisSettings)
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)
    job_alerting: JobAlertingSettings = Field(default_factory=JobAlertingSettings)
    topology: TopologySettings = Field(default_factory=TopologySettings)
    remediation: CordonSettings | None = None  # an empty section is none
    oncall: OncallSettings = Field(default_factory=OncallSettings)

    @field_validator("channels", "remediation", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        """An empty section is an absent one (`remediation: {}`: nothing to cordon through)."""
        return None if value == {} else value

    @model_validator(mode="after")
    def _one_home_and_references(self) -> Settings:
        """`channels.escalation`, the deprecated alias, moves to its home `oncall.escalation`;
        then what one section says of another is checked."""
        problems: list[tuple[str, str]] = []
        alias = self.channels.escalation if self.channels is not None else None
        if self.channels is not None and alias is not None:
            if self.oncall.escalation is not None:
                problems.append(("channels.escalation", _BOTH_HOMES))
            else:
                log.warning("channels.escalation is deprecated: move it to oncall.escalation")
                self.oncall = self.oncall.model_copy(update={"escalation": alias})
            rest = self.channels.model_copy(update={"escalation": None})
            self.channels = rest if rest.model_dump(exclude_none=True) else None
        rota = self.oncall.rota
        calls = self.channels is not None and self.channels.phone is not None
        if calls and self.oncall.escalation is None and not (rota and rota.escalation_policies):
            problems.append(("channels.phone", _NOBODY_TO_CALL))
        if self.remediation is not None:
            people = rota.people if rota is not None else {}
            problems.extend(approver_problems(self.remediation.approvers, people))
        known = set(rota.schedules) if rota is not None else set()
        people = rota.people if rota is not None else {}
        access = self.gateway.access
        problems.extend(
            presser_problems("gateway.access.admin_feishu", access.admin_feishu, people)
        )
        for team, settings in access.teams.items():
            problems.extend(
                (f"gateway.access.teams.{team}.schedules", f"no on-call schedule {name!r}")
                for name in settings.schedules
                if name not in known
            )
            problems.extend(
                presser_problems(f"gateway.access.teams.{team}.feishu", settings.feishu, people)
            )
        if problems:
            raise SectionProblems(problems)
        return self


# Environment variables that map onto settings (non-secret and secret).
_ENV_MAP: dict[str, tuple[str, str]] = {
    "TRAINSENTRY_LISTEN": ("gateway", "listen"),
    "TRAINSENTRY_TRIGGER_LISTEN": ("gateway", "trigger_listen"),
    "TRAINSENTRY_DB": ("gateway", "db"),
    "TRAINSENTRY_CONSOLE_FILE": ("gateway", "console_file"),
    "TRAINSENTRY_ALERTMANAGER_URL": ("gateway", "alertmanager_url"),
    "TRAINSENTRY_POLICY_FILE": ("gateway", "policy_file"),
    "TRAINSENTRY_TRAININGJOB_STATUS": ("gateway", "trainingjob_status"),
    "TRAINSENTRY_WEBHOOK_TOKEN": ("gateway", "webhook_token"),
    "TRAINSENTRY_API_TOKEN": ("gateway", "api_token"),
}
_SECRET_KEYS = {("gateway", "webhook_token"), ("gateway", "api_token")}


def load_settings(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Settings:
    """Builds Settings from a YAML file, the environment and explicit overrides."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = path or (Path(env["TRAINSENTRY_CONFIG"]) if env.get("TRAINSENTRY_CONFIG") else None)
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config file {path} is not valid YAML: {describe_yaml_error(exc)}"
            ) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top")
        for section, key in _SECRET_KEYS:
            if key in (loaded.get(section) or {}):
                raise ConfigError(
                    f"{path}: {section}.{key} is a secret; set it through the environment"
                )
        raw = loaded

    def settable(name: str) -> dict[str, Any]:
        # `gateway:` with nothing under it is None in YAML: an empty section.
        section = raw[name] = raw.get(name) or {}
        if not isinstance(section, dict):
            raise ConfigError(f"{path or 'settings'}: `{name}` must be a mapping")
        return section

    for var, (section, key) in _ENV_MAP.items():
        if env.get(var):
            settable(section)[key] = env[var]
    for section, values in (overrides or {}).items():
        for key, value in values.items():
            if value is not None:
                settable(section)[key] = value
    return validate_settings(raw)


def validate_settings(raw: Mapping[str, Any]) -> Settings:
    """Every section of `raw` (the file's mapping, with the environment and flags applied)
    checked at once: ConfigError holds each problem found, with its path."""
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError.of(problems_of(exc)) from None
