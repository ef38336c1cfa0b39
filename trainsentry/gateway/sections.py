"""The gateway's optional config sections, typed and checked when the settings load
(config/), turned into the parts `assemble.py` wires: on-call (`oncall:`), escalation (the
default layers and the policies, for paging), topology, TrainingJobs' own routes
(`job_alerting:`) and the hang diagnosis (`diagnosis:`). What is left to refuse here is
what the file cannot say: a secret missing from the environment, a policy file naming an
escalation policy `oncall:` lacks (ConfigError naming it). None starts anything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

from trainsentry.config import ConfigError, Settings
from trainsentry.config.diagnosis import DiagnosisSettings
from trainsentry.config.job_alerting import JobAlertingSettings
from trainsentry.config.remediation import CordonSettings
from trainsentry.config.topology import TopologySettings
from trainsentry.gateway.channels import Channels, add_job_channel
from trainsentry.gateway.policy.cordon import approver_ids
from trainsentry.gateway.policy.escalation import EscalationPolicy, Escalator, Roster
from trainsentry.gateway.policy.job_roster import RosterOf
from trainsentry.gateway.policy.roster import escalation_policy_of, roster_of
from trainsentry.gateway.policy.route import escalation_for, escalation_names
from trainsentry.gateway.policy.rules import Policy
from trainsentry.gateway.stages.hang.diagnosis import (
    EndpointResolver,
    KubernetesEndpoints,
    StaticEndpoints,
)
from trainsentry.gateway.stages.services.job_alerting import JobAlerting
from trainsentry.gateway.stages.services.oncall import current_escalators
from trainsentry.gateway.stages.services.paging import Paging
from trainsentry.gateway.stages.services.topology import TopologySource
from trainsentry.kube.client import default_api_client
from trainsentry.notifiers.settings import SecretMissing, read_secret
from trainsentry.oncall.types import OncallConfig


def paging_of(
    escalator: Escalator | None,
    oncall: OncallConfig | None,
    policy: Policy | None,
    phone: bool,
    job_alerting: JobAlerting | None = None,
) -> Paging | None:
    """The escalation stage: the inline layers (`escalator`) by default, the
    `oncall.escalation_policies` where the policy's routes name them, a TrainingJob's own
    roster reference (inline layers, or one of those policies) for its pages. Tells
    `job_alerting` which policy names a roster reference may give."""
    named = oncall.escalation_policies if oncall is not None else {}
    rosters: RosterOf | None = None
    job_policies = None
    if job_alerting is not None:
        job_alerting.escalation_policies = frozenset(named)
        rosters, job_policies = job_alerting.roster, job_alerting.escalation_policy
    if policy is not None:
        for field_name, name in escalation_names(policy).items():
            if name not in named:
                known = ", ".join(sorted(named)) or "none configured"
                raise ConfigError(
                    f"policy {field_name}: unknown escalation policy {name!r} "
                    f"(oncall.escalation_policies: {known})"
                )
    if escalator is None and named and phone:
        escalator = Escalator(Roster(()), EscalationPolicy())  # only routed pages escalate
    if escalator is None:
        return None
    if oncall is None or not named or policy is None:
        return Paging(escalator, rosters=rosters)  # no named policies: none to follow
    config, rules = oncall, policy

    async def current(conn: Any, now: datetime) -> Any:
        return await current_escalators(conn, config, now)

    return Paging(
        escalator,
        rosters=rosters,
        named=current,
        choose=lambda route, priority: escalation_for(route, priority, rules),
        job_policies=job_policies,
    )


def build_topology(
    settings: TopologySettings, kube_api: Callable[[], Awaitable[Any]] | None = None
) -> TopologySource | None:
    """From the `topology:` config section: None when no levels are named."""
    if not settings.enabled:
        return None
    return TopologySource(
        settings, (kube_api or default_api_client) if settings.kubernetes else None
    )


def oncall_of(settings: Settings) -> OncallConfig | None:
    """The on-call rota of the `oncall:` section (people, schedules, escalation policies),
    or None."""
    return settings.oncall.rota


def default_escalator(settings: Settings) -> Escalator | None:
    """The default escalation (`oncall.escalation`, or its deprecated alias
    `channels.escalation`) as an escalation timeline, or None."""
    layers = settings.oncall.escalation
    return None if layers is None else Escalator(roster_of(layers), escalation_policy_of(layers))


def build_job_alerting(
    settings: JobAlertingSettings,
    channels: Channels,
    api_factory: Callable[[], Awaitable[Any]] = default_api_client,
) -> JobAlerting | None:
    """From the `job_alerting:` config section: None unless enabled (it needs the cluster);
    adds the `feishu_job` channel to `channels`."""
    if not settings.enabled:
        return None
    built = channels.built
    has_app = built is not None and built.feishu_app is not None
    stage = JobAlerting(settings, api_factory, has_app=has_app)
    add_job_channel(channels, stage)
    return stage


def build_diagnosis_parts(
    settings: DiagnosisSettings, env: Mapping[str, str]
) -> tuple[DiagnosisSettings, EndpointResolver, str] | None:
    """From the `diagnosis:` config section: None when there is no way to find ranks."""
    if not settings.enabled or not (settings.static_endpoints or settings.kubernetes):
        return None
    try:
        # stripped like the gateway's own tokens: a Secret made from an echoed file ends in a
        # newline, which no HTTP header can carry (the probe strips its copy the same way)
        token = read_secret(settings.probe_token_env, env).strip()
        if not token:
            raise SecretMissing(settings.probe_token_env)
    except SecretMissing:
        raise ConfigError(
            f"diagnosis needs the probes' token in {settings.probe_token_env}"
        ) from None
    resolver: EndpointResolver = (
        KubernetesEndpoints() if settings.kubernetes else StaticEndpoints(settings.static_endpoints)
    )
    return settings, resolver, token


def feishu_people_of(oncall: OncallConfig | None) -> dict[str, str]:
    """Feishu open_id -> name of each person of `oncall.people` with one: who a card's
    button press names (gateway/access.py `feishu_actor`)."""
    if oncall is None:
        return {}
    return {p.feishu_open_id: p.name for p in oncall.people.values() if p.feishu_open_id}


def cordon_approvers_of(
    settings: CordonSettings | None, oncall: OncallConfig | None
) -> dict[str, str]:
    """Feishu open_id -> name of the people `remediation.approvers` names (people of
    `oncall.people`, or open_ids; the settings' check refuses any other entry)."""
    return approver_ids(
        settings.approvers if settings is not None else (),
        oncall.people if oncall is not None else {},
    )
