"""The `job_alerting:` section: TrainingJobs route their own alerts (gateway/stages/
job_alerting.py reads each job's `spec.alerting`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Feishu's custom bot hook URLs: by default a job's bot may post nowhere else.
FEISHU_HOOKS = (
    "https://open.feishu.cn/open-apis/bot/v2/hook/",
    "https://open.larksuite.com/open-apis/bot/v2/hook/",
)


class JobAlertingSettings(BaseModel):
    """The `job_alerting:` section of the config file."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    refresh_seconds: float = Field(default=15.0, gt=0, le=3600)
    namespaces: list[str] = Field(default_factory=list)  # empty: every namespace
    webhook_prefixes: list[str] = Field(default_factory=lambda: list(FEISHU_HOOKS), min_length=1)
    concurrency: int = Field(default=8, ge=1, le=64)
    # the numbers a job's own roster may name (e.g. ["+86"]); empty: any E.164 number
    phone_prefixes: list[Annotated[str, Field(pattern=r"^\+[0-9]{1,15}$")]] = Field(
        default_factory=list
    )
