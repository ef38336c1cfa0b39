"""The `reports:` section: the weekly report (trainsentry/reports/). Non-secret.

```yaml
reports:
  timezone: Asia/Shanghai
  week_start: monday
  recipients: [sre@example.com]          # the cluster-wide report ("cluster")
  teams:                                 # one more report per team, scoped to its jobs
    vision:
      recipients: [vision-leads@example.com]
      namespaces: [vision]
      jobs: [shared/llm-pretrain]
  link_url: https://grafana.example/d/trainsentry?from={start_ms}&to={end_ms}
  feishu_digest: {url_env: FEISHU_REPORT_WEBHOOK, secret_env: FEISHU_REPORT_SECRET}
```
SMTP comes from `channels.email` (the email channel's settings).
"""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

CLUSTER = "cluster"
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TeamSettings(_Model):
    recipients: list[str] = Field(min_length=1)
    namespaces: list[str] = Field(default_factory=list)
    jobs: list[str] = Field(default_factory=list)  # "namespace/name"

    @field_validator("jobs")
    @classmethod
    def _job_refs(cls, value: list[str]) -> list[str]:
        for ref in value:
            if "/" not in ref:
                raise ValueError(f"job {ref!r} must be namespace/name")
        return value


class FeishuDigestSettings(_Model):
    """A Feishu custom bot that gets a digest card; the URL and secret come from env."""

    url_env: str
    secret_env: str | None = None
    timeout_s: float = 10.0


class ReportSettings(_Model):
    timezone: str = "UTC"
    week_start: str = "monday"
    recipients: list[str] = Field(default_factory=list)
    teams: dict[str, TeamSettings] = Field(default_factory=dict)
    subject_prefix: str = "[trainsentry]"
    cluster_name: str = ""
    link_url: str = ""  # {start}, {end} (ISO) and {start_ms}, {end_ms} are filled in
    catch_up_weeks: int = Field(default=4, ge=1, le=52)
    short_lived_s: float = Field(default=300.0, gt=0)
    feishu_digest: FeishuDigestSettings | None = None

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown timezone {value!r} (use an IANA name like Asia/Shanghai)"
            ) from None
        return value

    @field_validator("week_start")
    @classmethod
    def _weekday(cls, value: str) -> str:
        if value.lower() not in WEEKDAYS:
            raise ValueError(f"week_start must be one of {', '.join(WEEKDAYS)}")
        return value.lower()

    @field_validator("teams")
    @classmethod
    def _team_names(cls, value: dict[str, TeamSettings]) -> dict[str, TeamSettings]:
        for name in value:
            if name == CLUSTER or not name or len(name) > 40 or "/" in name:
                raise ValueError(f"team name {name!r}: 1-40 characters, no '/', not {CLUSTER!r}")
        return value

    def recipients_of(self, audience: str) -> list[str]:
        return list(self.recipients if audience == CLUSTER else self.teams[audience].recipients)

    def audiences(self) -> list[str]:
        """Every report to send: the cluster one (when it has recipients), then each team."""
        return ([CLUSTER] if self.recipients else []) + sorted(self.teams)

    def link(self, start_iso: str, end_iso: str, start_ms: int, end_ms: int) -> str:
        if not self.link_url:
            return ""
        return self.link_url.format(start=start_iso, end=end_iso, start_ms=start_ms, end_ms=end_ms)
