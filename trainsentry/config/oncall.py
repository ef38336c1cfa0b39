"""The `oncall:` section, the one home of escalation: the default escalation layers
(`escalation`, config/escalation.py) and the on-call rota, `people`, `schedules` and the named
`escalation_policies` (docs/oncall.md), which the on-call part parses into its own frozen
types (oncall/config.py `parse_oncall`; it imports no settings).

`rota` is None when the section names no people, schedules or policies (only `escalation`,
an empty section or none): then nothing on-call is active and the on-call endpoints answer
404.
`channels.escalation`, the deprecated alias of `escalation`, is moved here when the settings
load (config/__init__.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, InstanceOf, ValidationError, model_validator

from trainsentry.config.escalation import EscalationSettings
from trainsentry.config.problems import SectionProblems, problems_of
from trainsentry.oncall.config import OncallConfigError, parse_oncall
from trainsentry.oncall.types import OncallConfig

_FIELD = "oncall"


class OncallSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    escalation: EscalationSettings | None = None
    rota: InstanceOf[OncallConfig] | None = None

    @model_validator(mode="before")
    @classmethod
    def _rota(cls, value: Any) -> Any:
        """The raw section: `escalation` for the model, the rest parsed into `rota`."""
        if value is None or not isinstance(value, Mapping):
            return {} if value is None else value  # (pydantic refuses a non-mapping)
        if set(value) <= {"escalation"} or isinstance(value.get("rota"), OncallConfig):
            return value  # no rota, or one parsed already (OncallSettings(rota=...))
        try:
            rota = parse_oncall(value, _FIELD)
        except OncallConfigError as exc:
            problems = [_below(field, why) for field, why in exc.problems]
            raise SectionProblems(problems + _escalation_problems(value)) from None
        return {"escalation": value.get("escalation"), "rota": rota}


def _below(field: str, why: str) -> tuple[str, str]:
    """(path below the section, why) of a problem the parser names from `oncall`."""
    return field.removeprefix(_FIELD).removeprefix("."), why


def _escalation_problems(section: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The problems of `escalation`, reported with the rota's (which stop the model)."""
    if section.get("escalation") is None:
        return []
    try:
        EscalationSettings.model_validate(section["escalation"])
    except ValidationError as exc:
        return [(f"escalation.{p.path}".rstrip("."), p.message) for p in problems_of(exc)]
    return []
