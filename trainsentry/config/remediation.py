"""The `remediation:` section: cordon with a human in the loop (gateway/policy/cordon.py
decides, gateway/stages/services/cordon.py acts). An empty or absent section is None: nothing to
cordon through, no recommendation either. `approvers` must name people of `oncall.people`
with a `feishu_open_id`, or open_ids (`approver_problems`, checked with the on-call section
when the settings load, config/__init__.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainsentry.oncall.types import Person

OPEN_ID = re.compile(r"ou_[A-Za-z0-9]{1,64}")
_URL = re.compile(r"https?://[^\s/?#@]+(/[^\s?#@]*)?")  # no user:password@ (it is logged)


class Mode(StrEnum):
    OFF = "off"
    APPROVE = "approve"
    AUTO = "auto"


class EvidenceSettings(BaseModel):
    """`remediation.evidence`: the Prometheus that evaluates the shipped rules, asked whether
    a hardware alert is one of its firings (gateway/policy/evidence.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prometheus_url: str = ""  # empty: nothing is confirmed, nothing recommended
    timeout_seconds: float = Field(default=10.0, gt=0, le=120)

    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        value = value.strip()
        if value and not _URL.fullmatch(value):
            raise ValueError(
                "must be an http:// or https:// URL without credentials, query or fragment"
            )
        return value


class CordonSettings(BaseModel):
    """The `remediation:` section of the gateway config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cordon: Mode = Mode.APPROVE
    threshold: float = Field(default=20.0, gt=0, le=1e6)  # health score that recommends
    max_job_share: float = Field(default=0.25, gt=0, le=1)
    max_per_hour: int = Field(default=2, ge=1, le=1000)
    check_seconds: float = Field(default=60.0, ge=0.05, le=86400)
    max_cards_per_hour: int = Field(default=6, ge=1, le=1000)  # cordon cards sent, any kind
    approvers: tuple[str, ...] = Field(default=(), max_length=100)  # people or open_ids
    evidence: EvidenceSettings = EvidenceSettings()


def approver_problems(
    approvers: Iterable[str], people: Mapping[str, Person]
) -> Iterator[tuple[str, str]]:
    """Pure: (path, why) of each `remediation.approvers` entry that can approve nothing: one
    that is neither a person of `oncall.people` nor a Feishu open_id (`ou_...`), or a person
    without a `feishu_open_id` (a card's button is pressed as an open_id)."""
    return presser_problems("remediation.approvers", approvers, people)


def presser_problems(
    path: str, names: Iterable[str], people: Mapping[str, Person]
) -> Iterator[tuple[str, str]]:
    """Pure: (path, why) of each entry of the list at `path` that names no one who can press
    a Feishu card's button: neither a person of `oncall.people` nor a Feishu open_id
    (`ou_...`), or a person without a `feishu_open_id` (a press names its presser by it)."""
    for index, name in enumerate(names):
        person = people.get(name)
        where = f"{path}[{index}]"
        if person is None and not OPEN_ID.fullmatch(name):
            yield (
                where,
                f"{name[:64]!r} is neither a person of oncall.people nor a Feishu open_id (ou_...)",
            )
        elif person is not None and not person.feishu_open_id:
            yield where, f"{name} has no feishu_open_id (oncall.people)"
