"""Who acknowledged, as the cards and the console say it.

A Feishu card button press names its presser by open_id (`ou_...`), the API and the console
by the name given. When that open_id, or that name, is a person the configuration defines,
the ack shows the person's configured name, and the card mentions the configured open_id;
anyone else stays what they gave, plain text (notifiers/feishu/markup.py: no mention forms
from it). The people, looked up at each ack (a job's settings change at run time):
- the `oncall:` section's people (name, `feishu_open_id`);
- the inline escalation roster's members (`channels.escalation.layers`);
- the alert's TrainingJob: its roster's members and its `owners` (open_ids; an owner has no
  configured name, so the card mentions the owner and names no one else).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainsentry.alerts import JobRef
from trainsentry.gateway.policy.escalation import Escalator, Roster
from trainsentry.gateway.stages.services.job_alerting import JobAlerting
from trainsentry.notifiers.feishu.markup import OPEN_ID
from trainsentry.oncall.types import OncallConfig


@dataclass(frozen=True, slots=True)
class Acker:
    """Who acknowledged: the name shown (plain text), and the configured open_id to
    mention ("" when none is configured for them)."""

    name: str
    open_id: str = ""


def known_acker(who: str, people: Iterable[tuple[str, str]], owners: Iterable[str] = ()) -> Acker:
    """Pure: `who` (an open_id or a name) as a configured person: (name, open_id) pairs of
    `people` are matched by open_id first, then by name; an open_id among a job's `owners`
    is mentioned as itself. Anyone else: `who`, nothing to mention."""
    known = [
        (name, open_id if OPEN_ID.fullmatch(open_id or "") else "") for name, open_id in people
    ]
    if not who:
        return Acker(who)
    for name, open_id in known:
        if open_id and open_id == who:
            return Acker(name, open_id)
    for name, open_id in known:
        if name == who:
            return Acker(name, open_id)
    if OPEN_ID.fullmatch(who) and who in set(owners):
        return Acker(who, who)
    return Acker(who)


def _members(roster: Roster | None) -> list[tuple[str, str]]:
    if roster is None:
        return []
    return [(p.name, p.feishu_open_id) for layer in roster.layers for p in layer.members]


class Ackers:
    """The people an ack's `who` is looked up among (the module's docstring)."""

    def __init__(
        self,
        escalator: Escalator | None = None,
        oncall: OncallConfig | None = None,
        job_alerting: JobAlerting | None = None,
    ) -> None:
        self._escalator = escalator
        self._oncall = oncall
        self._jobs = job_alerting

    def of(self, who: str, labels: Mapping[str, str]) -> Acker:
        """`who` as the ack of an alert with `labels` shows it."""
        people: list[tuple[str, str]] = []
        if self._oncall is not None:
            people += [(p.name, p.feishu_open_id or "") for p in self._oncall.people.values()]
        if self._escalator is not None:
            people += _members(self._escalator.roster)
        owners: tuple[str, ...] = ()
        job = JobRef.from_labels(labels)
        if self._jobs is not None and job is not None:
            people += _members(self._jobs.roster(f"{job.namespace}/{job.name}"))
            route = self._jobs.routes().get(job)
            owners = route.owners if route is not None else ()
        return known_acker(who, people, owners)
