"""Who may act on what: one decision (`may_act_on`), pure, for the console and the HTTP API
alike (docs/gateway.md, "People and teams"). Where it is enforced: gateway/acting.py (one
check per request, its `authorize`), which the console's actions (gateway/ui/acting.py) and
the API's handlers call.

- An `Actor` is who acts and how they signed in (`via`): through the trusted proxy (a
  person, with the proxy's groups), a Feishu card's button (`feishu`: the presser's
  open_id, which Feishu signs, and their `oncall.people` name), the shared token in the
  console (`break-glass`), or the API token (`api-token`, the CLI and automation: the name
  is the one the caller gave).
- A `Target` is what is acted on, reduced to what decides: the namespaces its alerts are in
  ("" for an alert with no namespace: the cluster's own, a node's, the platform's) and the
  on-call schedules it changes.
- With access divided (`gateway.access` names teams or admins), a person acts on a
  target whose every namespace and schedule is one of their teams'; a member of an admin
  group, the break-glass token and the API token act on all. A card's presser belongs to
  the teams whose `feishu` list names them (their open_id or their `oncall.people` name),
  and is an admin when `admin_feishu` does. Not divided: everyone signed in acts on all (a
  gateway of one team).
- The audit names the person and how they signed in (`audit_name`, `VIA_TEXT`): never a
  typed name alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from trainsentry.config.access import AccessSettings
from trainsentry.maintenance.types import MaintenanceWindow

Via = Literal["proxy", "feishu", "break-glass", "api-token"]

# How each way of signing in is written in the audit trail.
VIA_TEXT: dict[str, str] = {
    "proxy": "signed in through the proxy",
    "feishu": "Feishu card button",
    "break-glass": "break-glass token",
    "api-token": "API token",
}
CLUSTER = ""  # the namespace of an alert without one: the cluster's (admins act on it)
MAX_GROUPS = 200


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: `name` as the proxy, the sign-in form or the API caller gave it; `via`,
    how they signed in; `groups`, the proxy's groups (empty for the tokens; for a Feishu
    press, the names the presser goes by: their open_id and `oncall.people` name)."""

    name: str
    via: Via
    groups: frozenset[str] = frozenset()

    @property
    def audit_name(self) -> str:
        """Pure: the name the audit trail keeps, with how they signed in:
        `alice (signed in through the proxy)`, `erin (break-glass token)`."""
        return f"{self.name} ({VIA_TEXT[self.via]})"

    @property
    def acting_name(self) -> str:
        """Pure: the name an ack or an escalation records as who acted (cards, `acked_by`):
        the proxy's name, the API caller's `by` (its events keep `via`); a name typed at the
        console's break-glass sign-in comes with the token (`audit_name`), so it is never
        shown alone nor taken for a configured person's (no mention of them on the card)."""
        return self.audit_name if self.via == "break-glass" else self.name


@dataclass(frozen=True, slots=True)
class Target:
    """What an action acts on: `what` (for the refusal's reason), the namespaces of its
    alerts and the on-call schedules it changes."""

    what: str
    namespaces: frozenset[str] = frozenset()
    schedules: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str = ""


def groups_of(values: Iterable[str]) -> frozenset[str]:
    """Pure: the groups a proxy sent, from each value of its groups header (oauth2-proxy
    joins a list with commas), blanks dropped; at most MAX_GROUPS are read."""
    found: list[str] = []
    for value in values:
        found.extend(part.strip() for part in value.split(","))
        if len(found) > MAX_GROUPS:
            break
    return frozenset(group for group in found[:MAX_GROUPS] if group)


@dataclass(frozen=True, slots=True)
class Scope:
    """What an actor may act on: everything (`everything`), or these namespaces and schedules."""

    everything: bool
    namespaces: frozenset[str] = frozenset()
    schedules: frozenset[str] = frozenset()
    teams: tuple[str, ...] = ()


def feishu_actor(open_id: str, people: Mapping[str, str]) -> Actor:
    """Pure: who pressed a Feishu card's button: the open_id Feishu signed, named as the
    person of `oncall.people` it is (`people`: open_id -> name), else as itself."""
    name = people.get(open_id, open_id)
    return Actor(name, "feishu", frozenset({open_id, name}))


def scope_of(actor: Actor, access: AccessSettings) -> Scope:
    """Pure: the actor's scope (the module's docstring)."""
    if not access.divided or actor.via not in ("proxy", "feishu"):
        return Scope(True)
    if actor.via == "feishu":
        if actor.groups & set(access.admin_feishu):
            return Scope(True)
        teams = sorted(
            name for name, team in access.teams.items() if actor.groups & set(team.feishu)
        )
    elif actor.groups & set(access.admin_groups):
        return Scope(True)
    else:
        teams = sorted(
            name for name in access.teams if actor.groups & set(access.team_groups(name))
        )
    namespaces = {ns for name in teams for ns in access.teams[name].namespaces}
    schedules = {s for name in teams for s in access.teams[name].schedules}
    return Scope(False, frozenset(namespaces), frozenset(schedules), tuple(teams))


def _listing(names: Iterable[str]) -> str:
    shown = sorted(names)
    text = ", ".join(name or "(no namespace: the cluster's)" for name in shown[:5])
    return text + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def may_act_on(actor: Actor, target: Target, access: AccessSettings) -> Decision:
    """Pure: whether `actor` may act on `target`, and if not, why (the 403's reason)."""
    scope = scope_of(actor, access)
    if scope.everything:
        return Decision(True)
    foreign_ns = target.namespaces - scope.namespaces
    foreign_schedules = target.schedules - scope.schedules
    if not target.namespaces and not target.schedules:
        foreign_ns = frozenset({CLUSTER})  # nothing to tell it by: every team's
    if not foreign_ns and not foreign_schedules:
        return Decision(True)
    nobody = (
        "no team's feishu list names you"
        if actor.via == "feishu"
        else ("no group of yours is a team's")
    )
    teams = ", ".join(scope.teams) if scope.teams else f"none ({nobody})"
    parts = []
    if foreign_ns:
        parts.append(f"namespaces {_listing(foreign_ns)}")
    if foreign_schedules:
        parts.append(f"on-call schedules {_listing(foreign_schedules)}")
    return Decision(
        False,
        f"{actor.name} may not act on {target.what}: it is in {' and '.join(parts)}, not of"
        f" your teams ({teams}); ask one of its team or an admin",
    )


def namespaces_of(places: Iterable[tuple[str, bool]]) -> frozenset[str]:
    """Pure: an incident's namespaces from its alerts' (namespace, names a training job)
    pairs: those of its alerts that name a job; when none does (a node's or the cluster's
    incident), those of all its alerts. So a node's alert from the monitoring namespace that
    joined a team's job incident leaves it the team's."""
    jobs = {namespace for namespace, has_job in places if has_job}
    return frozenset(jobs or {namespace for namespace, _ in places})


def window_namespaces(window: MaintenanceWindow) -> frozenset[str]:
    """Pure: the namespaces a maintenance window mutes: the value of its `namespace` matcher
    when it has one that names a namespace; else it may mute any namespace's alerts (the
    cluster's: admins only)."""
    for matcher in window.matchers:
        if matcher.label == "namespace" and matcher.value:
            return frozenset({matcher.value})
    return frozenset({CLUSTER})
