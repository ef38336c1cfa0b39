"""The `gateway.access:` section: which people act on which teams' incidents (docs/gateway.md,
"People and teams"; the decision is gateway/access.py's `may_act_on`).

A person signed in through the trusted proxy (docs/console.md, "Behind an authenticating
proxy") carries groups (oauth2-proxy's `X-Forwarded-Groups`). A team names the proxy groups
whose members belong to it (its own name when none are listed), the namespaces its
incidents are in, and the on-call schedules whose overrides it changes. Members of an
`admin_groups` group act on every team's incidents. With no team and no admin group
configured, access is not divided: everyone signed in acts on everything (a gateway of one
team, as before teams existed).

A Feishu card's buttons (Acknowledge, Silence) are pressed as the presser's open_id: a team
lists who presses for it (`feishu`: people of `oncall.people`, pressing as their
`feishu_open_id`, or open_ids), and `admin_feishu` who presses for every team (checked
against `oncall.people` when the settings load, config/__init__.py).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainsentry.kube.names import label_problems

MAX_GROUP = 256


def _group_problem(value: str) -> str | None:
    """Pure: why `value` cannot be a proxy group's name (None when it can)."""
    if not value or len(value) > MAX_GROUP:
        return f"a group must be 1 to {MAX_GROUP} characters"
    if not value.isprintable() or "," in value or value != value.strip():
        return "a group holds printable characters, no comma, no surrounding spaces"
    return None


class TeamSettings(BaseModel):
    """One team: its namespaces, the proxy groups of its members, its on-call schedules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespaces: tuple[str, ...] = Field(min_length=1, max_length=1000)
    groups: tuple[str, ...] = Field(default=(), max_length=100)  # empty: the team's own name
    schedules: tuple[str, ...] = Field(default=(), max_length=100)
    # who presses its Feishu cards' buttons: names of oncall.people, or open_ids (ou_...)
    feishu: tuple[str, ...] = Field(default=(), max_length=1000)

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for namespace in value:
            if problems := label_problems(namespace):
                raise ValueError(f"namespace {namespace[:64]!r} {problems[0]} (DNS-1123 label)")
        return value

    @field_validator("groups")
    @classmethod
    def _groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for group in value:
            if (problem := _group_problem(group)) is not None:
                raise ValueError(f"{group[:64]!r}: {problem}")
        return value


class AccessSettings(BaseModel):
    """`gateway.access`: the teams and the admin groups."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    teams: dict[str, TeamSettings] = Field(default_factory=dict, max_length=1000)
    admin_groups: tuple[str, ...] = Field(default=(), max_length=100)
    # who presses every team's Feishu card buttons: names of oncall.people, or open_ids
    admin_feishu: tuple[str, ...] = Field(default=(), max_length=1000)

    @field_validator("admin_groups")
    @classmethod
    def _admin_groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for group in value:
            if (problem := _group_problem(group)) is not None:
                raise ValueError(f"{group[:64]!r}: {problem}")
        return value

    @model_validator(mode="after")
    def _team_names(self) -> AccessSettings:
        for name, team in self.teams.items():
            if not team.groups and (problem := _group_problem(name)) is not None:
                raise ValueError(f"team {name[:64]!r} (its own group, as it lists none): {problem}")
        return self

    @property
    def divided(self) -> bool:
        """Whether access is divided among teams (else everyone signed in acts on all)."""
        return bool(self.teams or self.admin_groups or self.admin_feishu)

    def team_groups(self, name: str) -> tuple[str, ...]:
        """The proxy groups whose members belong to team `name`."""
        team = self.teams[name]
        return team.groups or (name,)
