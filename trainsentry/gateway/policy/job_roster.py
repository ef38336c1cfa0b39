"""Escalations that follow a TrainingJob's own on-call roster (`spec.alerting.onCallRosterRef`).

Pure: the escalation state (escalation.py) stays one document; an incident opened by a page
of a job with its own roster carries that job's key (`"roster": "namespace/name"`), and each
group of incidents (the gateway's own roster: no key; one group per job) is advanced with
its roster: the job's roster as the gateway last read it, or the gateway's own when the
job's is gone or unusable now (so a page is never left without someone to call). Policy
(threshold, ack timeout, calls per layer) stays the gateway's: the job chooses who is
called, not how often.

The roster reference (a ConfigMap key) holds either inline `layers:` or the name of one of
the gateway's `oncall.escalation_policies` (`escalation_policy: NAME`, or per priority
`escalation_policy: {P0: NAME, P1: OTHER}`): then the job's pages open an incident that
names that policy (no job group), and follow it as a page routed to it by the alert policy
would; a page of a priority the mapping leaves out follows what its route chooses.
`parse_roster` reads the key; whether the names are configured is the stage's check (it
knows the gateway's configuration).

Inline layers name whom the gateway's paid voice provider calls, so a team's roster is held
to limits the gateway's own configuration is not: every `phone` in E.164 form (ITU-T
Recommendation E.164, "The international public telecommunication numbering plan": `+`, a
country code, which never starts with 0, and at most 15 digits in all; here 8 to 15 digits,
nothing else, no spaces), every `feishu_open_id` an open_id (`ou_...`), at most MAX_LAYERS
layers and MAX_PEOPLE people in all, names of at most MAX_NAME characters; and, when the
admin gives `job_alerting.phone_prefixes`, only numbers under one of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainsentry.alerts import Priority
from trainsentry.config.escalation import EscalationSettings, LayerSettings, PersonSettings
from trainsentry.gateway.policy.escalation import (
    CallDue,
    Escalation,
    EscalationState,
    Escalator,
    IncidentPage,
    Roster,
)
from trainsentry.gateway.policy.roster import roster_of
from trainsentry.notifiers.feishu.markup import OPEN_ID

MAX_ROSTER_BYTES = 64 * 1024
# (reason, message) of a problem with a job's settings, as notifiers/feishu/job.py's Problem
RosterProblem = tuple[str, str]
POLICY_NAME = r"^[A-Za-z0-9._-]{1,63}$"  # oncall/config.py's names
PolicyName = Annotated[str, Field(pattern=POLICY_NAME)]
# ITU-T E.164: "+", then at most 15 digits, the country code first (never 0); 8 at least
E164 = re.compile(r"\+[1-9][0-9]{7,14}")
MAX_LAYERS = 10
MAX_PEOPLE = 20  # in all the layers together
MAX_NAME = 100


class JobPerson(PersonSettings):
    """A person of a job's roster: `PersonSettings`, with the numbers and ids checked."""

    name: str = Field(min_length=1, max_length=MAX_NAME)

    @field_validator("phone")
    @classmethod
    def _e164(cls, value: str) -> str:
        if value and not E164.fullmatch(value):
            raise ValueError("must be E.164: + and 8 to 15 digits, e.g. +8613800000000")
        return value

    @field_validator("feishu_open_id")
    @classmethod
    def _open_id(cls, value: str) -> str:
        if value and not OPEN_ID.fullmatch(value):
            raise ValueError("must be a Feishu open_id (ou_...)")
        return value


class JobLayer(LayerSettings):
    members: list[JobPerson]  # type: ignore[assignment]  # checked people only


class JobRoster(BaseModel):
    """A job's roster reference (its ConfigMap key): the layers of `oncall.escalation`,
    or the name of an `oncall.escalation_policies` entry; exactly one of the two."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: list[JobLayer] | None = Field(default=None, min_length=1)
    # a name for every priority, or names per priority
    escalation_policy: PolicyName | dict[Priority, PolicyName] | None = None

    @field_validator("layers", mode="before")
    @classmethod
    def _few_layers(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_LAYERS:
            raise ValueError(f"at most {MAX_LAYERS} layers")  # before each is checked
        return value

    @model_validator(mode="after")
    def _one(self) -> JobRoster:
        if (self.layers is None) == (self.escalation_policy is None):
            raise ValueError("give exactly one of layers and escalation_policy")
        if self.escalation_policy == {}:
            raise ValueError("escalation_policy: name a policy for at least one priority")
        if self.layers is not None and sum(len(x.members) for x in self.layers) > MAX_PEOPLE:
            raise ValueError(f"at most {MAX_PEOPLE} people in all the layers")
        return self


@dataclass(frozen=True)
class JobOnCall:
    """What a job's roster reference names: inline layers (`roster`) or escalation policies
    of the gateway by priority (`policies`, names not checked here); exactly one is set."""

    roster: Roster | None = None
    policies: Mapping[Priority, str] = field(default_factory=dict)


def parse_roster(
    text: str, where: str, phone_prefixes: Sequence[str] = ()
) -> JobOnCall | RosterProblem:
    """Pure: what a ConfigMap value names, or the problem with it (no values shown).
    `phone_prefixes`: when given, every phone must start with one of them."""
    if len(text.encode()) > MAX_ROSTER_BYTES:
        return "InvalidRoster", f"{where} is over {MAX_ROSTER_BYTES} bytes"
    try:
        raw = yaml.safe_load(text)
        parsed = JobRoster.model_validate(raw)
    except yaml.YAMLError as exc:
        return "InvalidRoster", f"{where} is not YAML: {str(exc).splitlines()[0]}"
    except ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'top'}: {e['msg']}" for e in exc.errors()[:3]
        )
        return "InvalidRoster", (
            f"{where}: {errors} (layers: the format of oncall.escalation.layers, "
            "or escalation_policy: a name of oncall.escalation_policies)"
        )
    chosen = parsed.escalation_policy
    if isinstance(chosen, str):
        return JobOnCall(policies=dict.fromkeys(Priority, chosen))
    if chosen is not None:
        return JobOnCall(policies=dict(chosen))
    assert parsed.layers is not None
    if phone_prefixes:
        for i, layer in enumerate(parsed.layers):
            for j, member in enumerate(layer.members):
                if member.phone and not member.phone.startswith(tuple(phone_prefixes)):
                    return "InvalidRoster", (
                        f"{where}: layers.{i}.members.{j}.phone is not under the numbers the "
                        f"gateway calls (job_alerting.phone_prefixes: {', '.join(phone_prefixes)})"
                    )
    return JobOnCall(roster=roster_of(EscalationSettings(layers=list(parsed.layers))))


RosterOf = Callable[[str], Roster | None]


def _groups(state: EscalationState) -> dict[str | None, dict[int, Escalation]]:
    groups: dict[str | None, dict[int, Escalation]] = {}
    for alert_id, escalation in state.incidents.items():
        groups.setdefault(escalation.roster, {})[alert_id] = escalation
    return groups


def _escalator(escalator: Escalator, group: str | None, roster_of: RosterOf) -> Escalator:
    roster = roster_of(group) if group is not None else None
    return escalator if roster is None else Escalator(roster, escalator.policy)


def batch(
    escalator: Escalator,
    state: EscalationState,
    now: datetime,
    *,
    pages: Sequence[IncidentPage],
    page_rosters: Mapping[int, str],
    resolved: Collection[int],
    forget_before: datetime | None,
    roster_of: RosterOf,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[EscalationState, list[CallDue]]:
    """Pure: `escalation.batch`, each incident with its roster. `page_rosters`: alert id →
    job key, for the pages that follow a job's own roster; an alert already escalating
    stays in its group. `named`: the on-call escalation policies (an incident naming one
    follows it; docs/oncall.md)."""
    groups = _groups(state)
    known = {alert_id: found.roster for alert_id, found in state.incidents.items()}
    wanted: dict[str | None, list[IncidentPage]] = {}
    for page in pages:
        group = known[page.alert_id] if page.alert_id in known else page_rosters.get(page.alert_id)
        wanted.setdefault(group, []).append(page)
        groups.setdefault(group, {})
    incidents: dict[int, Escalation] = {}
    calls: list[CallDue] = []
    for group, members in groups.items():
        new, due = _escalator(escalator, group, roster_of).batch(
            EscalationState(members),
            now,
            pages=wanted.get(group, ()),
            resolved=resolved,
            forget_before=forget_before,
            named=named,
        )
        for alert_id, found in new.incidents.items():
            incidents[alert_id] = found if group is None else replace(found, roster=group)
        calls.extend(due)
    calls.sort(key=lambda call: (call.alert_id, call.step))
    return EscalationState(incidents), calls


def plan(
    escalator: Escalator,
    state: EscalationState,
    now: datetime,
    *,
    roster_of: RosterOf,
    named: Mapping[str, Escalator] | None = None,
) -> tuple[EscalationState, list[CallDue]]:
    """Pure: `escalation.plan`, each incident with its roster."""
    return batch(
        escalator,
        state,
        now,
        pages=(),
        page_rosters={},
        resolved=(),
        forget_before=None,
        roster_of=roster_of,
        named=named,
    )
