"""The default escalation: who a phone page calls, layer by layer, when its route names no
escalation policy (docs/oncall.md, "Escalation policies"; gateway/policy/roster.py turns it
into an escalation timeline).

Its home is `oncall.escalation`, beside the named `oncall.escalation_policies`;
`channels.escalation` is a deprecated alias (config/__init__.py moves it there when the
settings load, and refuses a file that sets both).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from trainsentry.alerts import Priority


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PersonSettings(_Model):
    name: str
    phone: str = ""
    feishu_open_id: str = ""
    email: str = ""


class LayerSettings(_Model):
    name: str
    members: list[PersonSettings]
    rotation_start: datetime | None = None
    shift_hours: float | None = Field(default=None, gt=0)


class EscalationSettings(_Model):
    min_priority: Priority = Priority.P0
    ack_timeout_min: float = Field(default=5.0, gt=0)
    calls_per_layer: int = Field(default=1, ge=1)
    layers: list[LayerSettings] = Field(default_factory=list)
